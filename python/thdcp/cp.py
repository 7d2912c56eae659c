"""AllGather context parallelism over a torch.distributed group, and the CP layouts.

A CP layout says which rows of the global batch each rank holds:

- "dual_chunk" (the default, and cp_attention's): each sequence (padded to a multiple of
  2 * cp) is cut into 2 * cp chunks; rank r holds chunks r and 2cp - 1 - r (one early, one
  late: the causal work is balanced).
- "contiguous": the packed buffer (documents with no padding of their own, T a multiple of
  cp) cut into cp equal pieces; rank r holds rows [r T / cp, (r + 1) T / cp). cp_attention
  takes it with layout="contiguous".

Every rank passes the *global* layout and its own rows; cp_attention all-gathers K/V over
NCCL, attends, and in the backward reduce-scatters dK/dV. cp_layout makes a layout;
cp_split / cp_merge move a global tensor (tokens, labels, activations) to and from a rank's
rows under either.

    comm = thdcp.Communicator(group)                   # once: NCCL over the group's ranks
    cu, cu_padded = thdcp.cp_layout(lengths, comm.size)
    q_local = thdcp.cp_split(q, cu_padded, comm.size, comm.rank)
    out_local = thdcp.cp_attention(q_local, k_local, v_local, cu.cuda(), cu_padded.cuda(), comm=comm)
"""
from typing import List, Optional, Sequence, Tuple, Union

import torch

from . import arguments
from .ops import _attention_backward_tensors, _attention_tensors, _dsinks_fake, _kernel_ready, _results
from .planning import _capacity_layout

_ops = torch.ops.thdcp


_GROUP_COMMUNICATORS = {}


class Communicator:
    """A thdcp NCCL communicator over the ranks of a torch.distributed group, on this rank's
    current CUDA device (one GPU per rank). Made collectively (rank 0 of the group makes NCCL's
    unique id; the group broadcasts it) and warmed up, so it can be captured in CUDA graphs.
    Without an initialised torch.distributed, group=None gives a one-rank communicator.

    Pass it to cp_attention as comm=...; its integer handle is a constant under
    torch.compile. close() (or the interpreter's exit) releases it; close it only after every
    CUDA graph that captured its collectives is gone.

    copy_engine=True asks NCCL (2.28.3 or later) for its copy-engine collectives: cp_attention's
    workspaces come from NCCL's window memory and are registered as symmetric windows, and the
    all-gathers and all-to-alls run on the copy engines, taking no SMs from the attention beside
    them (the reduce-scatter stays on NCCL's kernels). An older NCCL refuses it, naming the
    version. split(size) makes the smaller CP groups of dynamic CP from this one.
    """

    def __init__(self, group=None, device: Optional[Union[int, torch.device]] = None, *, copy_engine: bool = False):
        import torch.distributed as dist

        if not isinstance(copy_engine, bool):
            raise ValueError("thdcp.Communicator: copy_engine=%r; pass True or False" % (copy_engine,))
        self.copy_engine = copy_engine

        if device is None:
            self.device = torch.cuda.current_device()
        elif isinstance(device, (str, torch.device)):
            device = torch.device(device)
            if device.type != "cuda":
                raise ValueError("thdcp.Communicator: device=%s; pass a CUDA device (an index or 'cuda:N')" % device)
            self.device = device.index if device.index is not None else torch.cuda.current_device()
        else:
            self.device = arguments.integer("Communicator", "device", device, 0, arguments.INT32_MAX)
        if group is None and not (dist.is_available() and dist.is_initialized()):
            self.rank, self.size = 0, 1
            unique_id = _ops.nccl_unique_id()
        else:
            group = group if group is not None else dist.group.WORLD
            self.rank = dist.get_rank(group)
            self.size = dist.get_world_size(group)
            payload = [bytes(_ops.nccl_unique_id().tolist()) if self.rank == 0 else None]
            dist.broadcast_object_list(payload, src=dist.get_global_rank(group, 0), group=group)
            unique_id = torch.tensor(list(payload[0]), dtype=torch.uint8)
        self.handle = int(_ops.communicator_create(unique_id, self.rank, self.size, self.device, copy_engine))

    def split(self, size: int) -> "Communicator":
        """The CP group of `size` consecutive ranks that holds this rank (ranks [r - r % size,
        r - r % size + size)), split from this communicator (NCCL's ncclCommSplit: no new
        unique id, no torch.distributed call), with its copy_engine. Collective: every rank of
        this communicator calls split with the same size, which divides this one's. Dynamic CP
        makes one per CP size from one parent and passes each to cp_attention as comm=."""
        size = arguments.integer("Communicator.split", "size", size, 1, arguments.INT32_MAX)
        if not self.handle:
            raise ValueError("thdcp.Communicator.split: this communicator is closed; split an open one")
        if self.size % size != 0:
            fits = [n for n in range(1, self.size + 1) if self.size % n == 0]
            raise ValueError("thdcp.Communicator.split: size=%d does not divide this communicator's %d ranks: pass one "
                             "of %s" % (size, self.size, ", ".join(str(n) for n in fits)))
        child = Communicator.__new__(Communicator)
        child.device, child.copy_engine = self.device, self.copy_engine
        child.rank, child.size = self.rank % size, size
        child.handle = int(_ops.communicator_split(self.handle, self.rank // size, self.rank % size))
        return child

    @classmethod
    def for_group(cls, group=None) -> "Communicator":
        """The communicator thdcp keeps for `group` (None: the default group), made on first use
        (collective over the group: every rank must make the first call for a group together)."""
        key = group if group is not None else "default"
        comm = _GROUP_COMMUNICATORS.get(key)
        if comm is None or not comm.handle:
            comm = cls(group)
            _GROUP_COMMUNICATORS[key] = comm
        return comm

    def close(self) -> None:
        if self.handle:
            _ops.communicator_destroy(self.handle)
            self.handle = 0

    def __repr__(self) -> str:
        return "thdcp.Communicator(rank=%d, size=%d, device=cuda:%d%s)" % (
            self.rank, self.size, self.device, ", copy_engine=True" if self.copy_engine else "")


def cp_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    cu_seqlens_padded: torch.Tensor,
    *,
    comm: Optional[Communicator] = None,
    group=None,
    window: Sequence[int] = (-1, 0),
    softmax_scale: Optional[float] = None,
    return_lse: bool = False,
    return_max_logit: bool = False,
    sinks: Optional[torch.Tensor] = None,
    layout: str = "dual_chunk",
    cp_comm: str = "all_gather",
    a2a_size: Optional[int] = None,
    reduce_dtype: Optional[torch.dtype] = None,
    head_slices: Optional[int] = None,
):
    """Attention of this rank's rows under AllGather CP over `comm`, or over the communicator
    thdcp keeps for the torch.distributed `group` (Communicator.for_group) when comm is None.
    Every rank of the group calls it.

    q, k: [T / cp, Hq, D_qk], [T / cp, Hkv, D_qk]; v: [T / cp, Hkv, D_v]: this rank's rows
    under `layout` (cp_split with the same layout gives them), bf16 or fp16 CUDA tensors of the
    communicator's device (head dims as thdcp.attention's on CUDA). layout: "dual_chunk"
    (every padded length a multiple of 2 * cp) or "contiguous" (T a multiple of cp; no
    per-document padding, and no reorder of the gathered K/V). cp_comm: "all_gather" (K/V
    gathered, dK/dV reduce-scattered) or "all_to_all" (Ulysses: the heads are sharded for the
    attention, q_heads and kv_heads multiples of cp; any layout, no padding of documents
    beyond the layout's) or "a2a+ag" (an all-to-all inside groups of a2a_size consecutive
    ranks shards the heads over each group, AllGather CP runs across the cp / a2a_size groups:
    a2a_size divides cp, q_heads and kv_heads; TransformerEngine's a2a+p2p with an AllGather
    in place of the ring). reduce_dtype: None / torch.float32 (dK/dV partial sums cross
    ranks in fp32, the default and the tightest) or q's dtype (half the reduce-scatter's
    bytes, for at most cp u times the partials' magnitudes more error; thdcp/cp/cp.h).
    head_slices: None or 1 (every head at once, the default) or S. all_to_all: S divides both
    head counts per rank; the rank's heads go through the exchanges and the attention in S
    slices, each slice's exchange beside another slice's attention (bench/RESULTS.md section 2
    has what it gains: at cp 2, nothing over NCCL's kernels, 1.5 % over its copy engines).
    all_gather: S divides both head counts; the forward gathers K/V and attends in S slices of
    heads, each slice's gather beside the attention of the one before, so that only the first
    slice's gather waits (the same bits for every S). a2a+ag: 1. sinks: as thdcp.attention's, the same on every
    rank; their gradient is summed over the ranks' rows (every rank gets the whole [Hq]).
    cu_seqlens, cu_seqlens_padded: the global layout, int32 CUDA [B + 1], the same on every
    rank, the last padded entry T (cp_layout makes them for either layout). Returns this
    rank's out [T / cp, Hq, D_v] (and LSE [Hq, T / cp], the max logit per head reduced over
    the group). The first call for a shape makes the CP plan (collective, on the host): run it
    eagerly before capturing a graph. Calls on one communicator run on one stream.
    """
    arguments.check_devices("cp_attention", _attention_tensors(q, k, v, cu_seqlens, cu_seqlens_padded))
    left, right = arguments.window("cp_attention", window)
    scale = arguments.softmax_scale("cp_attention", softmax_scale)
    layout = arguments.cp_layout("cp_attention", layout)
    cp_comm = arguments.cp_comm("cp_attention", cp_comm)
    group_size = arguments.a2a_size("cp_attention", a2a_size, cp_comm)
    reduce = arguments.reduce_dtype("cp_attention", reduce_dtype, q)
    slices = arguments.head_slices("cp_attention", head_slices, cp_comm)
    if sinks is not None:
        sinks = arguments.sinks("cp_attention", sinks, q)
    if comm is None:
        comm = Communicator.for_group(group)
    if cp_comm == "all_to_all":
        for name, heads in (("q", q.shape[1]), ("k", k.shape[1])):
            if heads % comm.size != 0:
                raise ValueError("thdcp.cp_attention: cp_comm='all_to_all' shards the heads over the %d ranks, but %s "
                                 "has %d heads, not a multiple of %d: pass cp_comm='all_gather', or a group whose "
                                 "size divides q's and k's heads" % (comm.size, name, heads, comm.size))
    if cp_comm == "a2a+ag":
        arguments.a2a_groups("cp_attention", group_size, comm.size, q.shape[1], k.shape[1])
    if slices != 1:
        arguments.head_slices_fit("cp_attention", slices, comm.size, q.shape[1], k.shape[1], cp_comm)
    out, lse, max_logit = _ops.cp_attention_forward(
        q, k, v, cu_seqlens, cu_seqlens_padded, comm.handle, left, right, scale, bool(return_max_logit), sinks,
        layout, cp_comm, group_size, reduce, slices
    )
    return _results(out, lse, max_logit, return_lse, return_max_logit)


@torch.library.register_fake("thdcp::cp_attention_forward")
def _cp_forward_fake(q, k, v, cu_seqlens, cu_seqlens_padded, comm, window_left, window_right, softmax_scale,
                     return_max_logit, sinks=None, layout="dual_chunk", cp_comm="all_gather", a2a_size=1,
                     reduce_dtype="fp32", head_slices=1):
    arguments.check_devices("cp_attention", _attention_tensors(q, k, v, cu_seqlens, cu_seqlens_padded)
                            + (("sinks", sinks),))
    rows, heads, _ = q.shape
    return (q.new_empty((rows, heads, v.shape[-1])), q.new_empty((heads, rows), dtype=torch.float32),
            q.new_empty((heads if return_max_logit else 0,), dtype=torch.float32))


@torch.library.register_fake("thdcp::cp_attention_backward")
def _cp_backward_fake(dout, q, k, v, out, lse, cu_seqlens, cu_seqlens_padded, comm, window_left, window_right,
                      softmax_scale, sinks=None, layout="dual_chunk", cp_comm="all_gather", a2a_size=1,
                      reduce_dtype="fp32", head_slices=1):
    arguments.check_devices("cp_attention backward",
                            _attention_backward_tensors(dout, q, k, v, out, lse, cu_seqlens, cu_seqlens_padded)
                            + (("sinks", sinks),))
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            _dsinks_fake(q, sinks))


def _cp_setup(ctx, inputs, output):
    q, k, v, cu_seqlens, cu_seqlens_padded, comm, left, right, scale, _, *rest = inputs
    out, lse, max_logit = output
    sinks = rest[0] if rest else None
    layout = rest[1] if len(rest) > 1 else "dual_chunk"
    cp_comm = rest[2] if len(rest) > 2 else "all_gather"
    a2a_size = rest[3] if len(rest) > 3 else 1
    reduce = rest[4] if len(rest) > 4 else "fp32"
    slices = rest[5] if len(rest) > 5 else 1
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens, cu_seqlens_padded, sinks)
    ctx.args = (comm, left, right, scale, layout, cp_comm, a2a_size, reduce, slices)
    ctx.mark_non_differentiable(lse, max_logit)


def _cp_backward(ctx, dout, dlse, dmax_logit):
    q, k, v, out, lse, cu_seqlens, cu_seqlens_padded, sinks = ctx.saved_tensors
    comm, left, right, scale, layout, cp_comm, a2a_size, reduce, slices = ctx.args
    dq, dk, dv, dsinks = _ops.cp_attention_backward(_kernel_ready(dout), q, k, v, out, lse, cu_seqlens,
                                                    cu_seqlens_padded, comm, left, right, scale, sinks, layout,
                                                    cp_comm, a2a_size, reduce, slices)
    return (dq, dk, dv, None, None, None, None, None, None, None, dsinks if sinks is not None else None, None, None,
            None, None, None)


torch.library.register_autograd("thdcp::cp_attention_forward", _cp_backward, setup_context=_cp_setup)


def cp_layout(lengths: Sequence[int], cp: int, max_seqs: Optional[int] = None, max_tokens: Optional[int] = None,
              *, layout: str = "dual_chunk") -> Tuple[torch.Tensor, torch.Tensor]:
    """(cu_seqlens, cu_seqlens_padded) as CPU int32 tensors [B + 1] for documents of `lengths`
    packed back to back, split over cp ranks by `layout`:

    - "dual_chunk": each document padded to a multiple of 2 * cp (cp_attention's layout).
      With max_seqs / max_tokens, the capacity form: max_seqs + 1 entries, trailing
      zero-length placeholders, the last absorbing rows up to max_tokens (what a CUDA graph
      of that capacity takes).
    - "contiguous": no padding of their own; only the last document is padded so that the
      rows are a multiple of cp. In the capacity form (max_tokens a multiple of cp) the
      placeholders follow the documents and the last absorbs the rows up to max_tokens.
    """
    op = "cp_layout"
    lengths = arguments.lengths(op, lengths)
    cp = arguments.cp_size(op, cp)
    layout = arguments.cp_layout(op, layout)
    if max_seqs is None and max_tokens is None:
        both = torch.tensor(_ops.make_layout(lengths, cp, layout), dtype=torch.int32)
        return both[: len(lengths) + 1].clone(), both[len(lengths) + 1:].clone()
    if max_seqs is None or max_tokens is None:
        raise ValueError("thdcp.cp_layout: pass both max_seqs and max_tokens (the capacity form), or neither")
    return _capacity_layout(op, lengths, cp, max_tokens, max_seqs, layout)


def cp_rank_rows(cu_seqlens_padded: torch.Tensor, cp: int, rank: int, *, layout: str = "dual_chunk") -> torch.Tensor:
    """Global row of each of `rank`'s rows (int64 [T / cp], in its local order) under `layout`:
    "dual_chunk" (chunks rank and 2 cp - 1 - rank of each document, every padded length a
    multiple of 2 * cp) or "contiguous" (rows [rank T / cp, (rank + 1) T / cp), T a multiple
    of cp)."""
    return _rank_rows("cp_rank_rows", cu_seqlens_padded, cp, rank, layout)


def _rank_rows(op: str, cu_seqlens_padded: torch.Tensor, cp: int, rank: int, layout: str) -> torch.Tensor:
    arguments.check_host_tensor(op, "cu_seqlens_padded", cu_seqlens_padded)
    cp = arguments.cp_size(op, cp)
    rank = arguments.integer(op, "rank", rank, 0, arguments.INT32_MAX)
    layout = arguments.cp_layout(op, layout)
    try:
        return _ops.cp_rank_rows(cu_seqlens_padded.to(device="cpu", dtype=torch.int32).contiguous(), cp, rank, layout)
    except ValueError as e:
        # The op names itself; a refusal met through cp_split or cp_merge names the call made.
        prefix, text = "thdcp.cp_rank_rows: ", str(e)
        if op == "cp_rank_rows" or not text.startswith(prefix):
            raise
        raise ValueError("thdcp.%s: %s" % (op, text[len(prefix):])) from None


def cp_split(x: torch.Tensor, cu_seqlens_padded: torch.Tensor, cp: int, rank: int, *,
             layout: str = "dual_chunk") -> torch.Tensor:
    """The rows of the global tensor x ([T, ...]: tokens, labels, activations) that `rank`
    holds under `layout` (cp_rank_rows)."""
    rows = _rank_rows("cp_split", cu_seqlens_padded, cp, rank, layout).to(x.device)
    return x.index_select(0, rows)


def cp_merge(parts: List[torch.Tensor], cu_seqlens_padded: torch.Tensor, *, layout: str = "dual_chunk") -> torch.Tensor:
    """The global tensor from every rank's rows under `layout` (parts[r]: rank r's tensor,
    [T / cp, ...]; cp is len(parts))."""
    if len(parts) == 0:
        raise ValueError("thdcp.cp_merge: parts is empty: pass one tensor per rank (parts[r]: rank r's rows)")
    cp = len(parts)
    first = parts[0]
    merged = first.new_empty((first.shape[0] * cp,) + tuple(first.shape[1:]))
    for rank, part in enumerate(parts):
        arguments.check_devices("cp_merge", (("parts[0]", first), ("parts[%d]" % rank, part)))
        merged.index_copy_(0, _rank_rows("cp_merge", cu_seqlens_padded, cp, rank, layout).to(part.device), part)
    return merged
