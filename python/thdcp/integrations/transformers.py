"""thdcp as an attention implementation of Hugging Face transformers (5.x; tested with 5.17).

    import thdcp.integrations.transformers          # registers attn_implementation="thdcp"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="thdcp")

Importing this module calls register() (it can be called again: it is idempotent), which
registers two functions under the name "thdcp":
- attention_forward with transformers' AttentionInterface, and
- padding_mask with its AttentionMaskInterface. Without a mask function transformers builds no
  mask at all for an implementation it does not know: the padding mask would be dropped without
  a warning. padding_mask hands the 2D padding mask to the attention (None when nothing is
  padded), as transformers' FlashAttention path does, and refuses mask patterns thdcp cannot
  express (chunked attention, bidirectional image-token overlays, custom mask functions).

How attention_forward lays out a batch [B, S] (the first that applies):
1. thdcp_cp=ContextParallel(...) passed to the model: this rank's rows under context
   parallelism, attended by thdcp.cp_attention (one GPU per rank, NCCL).
2. A padding mask: each row is one document; its valid tokens are moved first (thdcp's layout:
   valid rows first; left padding and holes are moved, right padding stays put) and the output
   is moved back; padded positions get 0.
3. cu_seq_lens_q / cu_seq_lens_k (DataCollatorWithFlattening(return_flash_attn_kwargs=True)):
   the documents of the B*S rows read as one packed buffer.
4. position_ids: a document starts at every row's start and wherever a position is not the
   previous one + 1 (DataCollatorWithFlattening), as transformers' SDPA mask reads packed
   batches.
5. Otherwise each row is one document.
Windows: causal, with sliding_window=w as transformers passes it (a query sees itself and the
w - 1 keys before it: window=(w - 1, 0)); is_causal=False (encoders): full attention. GQA/MQA
as the model's heads are; `scaling` is the softmax scale.

Attention sinks (gpt-oss passes its per-head `sinks` parameter as s_aux, in the model's dtype)
are thdcp.attention's sinks, taken in float32 (the gradient flows back to the parameter); the CPU
backend computes them, the CUDA backend once its kernels have them; not with thdcp_cp yet.

Refused with a ValueError that says what to change: attention dropout, logit softcapping
(softcap), output_attentions, additive position biases, 4D or float
masks, a query length different from the key length (generation with a KV cache, cross-
attention), a sliding window without causality, fp32 on CUDA outside autocast.
"""
import weakref
from typing import Optional, Sequence

import torch

import thdcp
from thdcp import arguments

NAME = "thdcp"

try:
    from transformers import AttentionInterface as _AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface as _AttentionMaskInterface
except ImportError as error:  # transformers missing, or older than 5 (no AttentionMaskInterface)
    raise ImportError(
        "thdcp.integrations.transformers needs Hugging Face transformers 5.x (tested with 5.17): "
        "pip install 'transformers==5.17.0' (%s)" % error
    ) from error


def register(name: str = NAME) -> str:
    """Registers attention_forward and padding_mask with transformers under `name` (default
    "thdcp"), so that attn_implementation=name selects them. Returns name."""
    _AttentionInterface.register(name, attention_forward)
    _AttentionMaskInterface.register(name, padding_mask)
    return name


# ---- the mask function ----

# The parts of the mask functions transformers builds (masking_utils) that thdcp expresses: causal
# or bidirectional attention, sliding windows (the width comes to the attention as
# sliding_window), packed documents (found again from position_ids) and the combination of these.
# Anything else (chunked attention, or_masks overlays such as bidirectional image tokens, a
# caller's own function) is refused rather than dropped.
_EXPRESSED_MASK_PARTS = {
    "causal_mask_function",
    "bidirectional_mask_function",
    "sliding_window_overlay.<locals>.inner_mask",
    "sliding_window_bidirectional_overlay.<locals>.inner_mask",
    "packed_sequence_mask_function.<locals>.inner_mask",
    "and_masks.<locals>.and_mask",
}


def _mask_parts(function, seen):
    if id(function) in seen:
        return
    seen.add(id(function))
    yield getattr(function, "__module__", "") + ":" + getattr(function, "__qualname__", repr(function))
    for cell in getattr(function, "__closure__", None) or ():
        contents = cell.cell_contents
        if isinstance(contents, (tuple, list)):
            for item in contents:
                if callable(item) and not isinstance(item, torch.Tensor):
                    yield from _mask_parts(item, seen)
        elif callable(contents) and not isinstance(contents, torch.Tensor):
            yield from _mask_parts(contents, seen)


def _check_mask_function(mask_function) -> None:
    if mask_function is None:
        return
    for part in _mask_parts(mask_function, set()):
        module, _, name = part.partition(":")
        if module != "transformers.masking_utils" or name not in _EXPRESSED_MASK_PARTS:
            raise ValueError(
                "thdcp (attn_implementation=%r): the mask this model builds includes %s, which thdcp does not "
                "express: it does causal or bidirectional attention, sliding windows, packed documents and "
                "padding. Use attn_implementation='sdpa' for this model" % (NAME, name or part))


def padding_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0, mask_function=None,
                 attention_mask: Optional[torch.Tensor] = None, **kwargs) -> Optional[torch.Tensor]:
    """transformers' mask function for attn_implementation="thdcp": the bool padding mask
    [batch_size, kv_length] (True: a real token) when some token is padding, else None. The
    causal, window and document structure is the attention's to apply (from is_causal,
    sliding_window, position_ids or cu_seq_lens_q/k); a mask_function with any other part is
    refused. Checking for padding reads one bool on the host per forward, as transformers' own
    FlashAttention and SDPA mask functions do."""
    _check_mask_function(mask_function)
    if attention_mask is None:
        return None
    if attention_mask.shape[-1] > kv_length:
        attention_mask = attention_mask[:, -kv_length:]
    if bool(attention_mask.all()):
        return None
    return attention_mask


# ---- layouts ----

class _Derived:
    """Layouts read from a tensor that every layer of one forward passes again (position_ids,
    cu_seq_lens_q): computed once, since reading them on the host synchronises, and kept while
    that tensor object lives unchanged (weak reference plus version counter)."""

    def __init__(self, size: int = 4):
        self._size = size
        self._entries = []  # (weakref to the tensor, its _version, key, value)

    def get(self, tensor: torch.Tensor, key, compute):
        try:
            version = tensor._version
        except RuntimeError:  # an inference tensor has no version counter: nothing to trust
            return compute()
        for ref, seen_version, seen_key, value in self._entries:
            if ref() is tensor and seen_version == version and seen_key == key:
                return value
        value = compute()
        live = [entry for entry in self._entries if entry[0]() is not None]
        self._entries = [(weakref.ref(tensor), version, key, value)] + live[: self._size - 1]
        return value


_DERIVED = _Derived()


def _packed_from_position_ids(position_ids: torch.Tensor, batch: int, length: int, device: torch.device):
    if position_ids.dim() == 1:
        position_ids = position_ids.unsqueeze(0)
    if position_ids.dim() != 2 or position_ids.shape[-1] != length or position_ids.shape[0] not in (1, batch):
        raise ValueError(
            "thdcp (attn_implementation=%r): position_ids of shape %s do not match the batch [%d, %d]; pass "
            "position_ids [batch, seq_len] (or cu_seq_lens_q/cu_seq_lens_k) to mark the documents"
            % (NAME, tuple(position_ids.shape), batch, length))

    def compute():
        positions = position_ids.to(device).expand(batch, length)
        starts = torch.ones((batch, length), dtype=torch.bool, device=device)
        starts[:, 1:] = positions[:, 1:] - positions[:, :-1] != 1
        first_rows = starts.flatten().nonzero().flatten().to(torch.int32)  # reads the count on the host
        cu_seqlens = torch.cat([first_rows, first_rows.new_tensor([batch * length])])
        return cu_seqlens, cu_seqlens

    return _DERIVED.get(position_ids, ("position_ids", batch, length, device), compute)


def _packed_from_cu_seq_lens(cu_q: torch.Tensor, cu_k: torch.Tensor, batch: int, length: int,
                             device: torch.device):
    def compute():
        cu = cu_q.to(device=device, dtype=torch.int32)
        if cu_k is not cu_q and not torch.equal(cu, cu_k.to(device=device, dtype=torch.int32)):
            raise ValueError(
                "thdcp (attn_implementation=%r): cu_seq_lens_q differs from cu_seq_lens_k; thdcp attends "
                "each document to itself (self-attention): pass the same prefix sums for both" % NAME)
        # Rows past the last document (a batch padded after packing) become a trailing
        # zero-length placeholder, so that the layout covers every row as thdcp requires.
        rows = cu.new_tensor([batch * length])
        return torch.cat([cu, cu[-1:]]), torch.cat([cu, rows])

    return _DERIVED.get(cu_q, ("cu_seq_lens", batch, length, device), compute)


def _unpadding(mask: torch.Tensor, batch: int, length: int):
    """(gather, scatter, cu_seqlens, cu_seqlens_padded) of a padded batch: row b is document b
    of `length` rows, its valid tokens first in their order. `gather` (batch and sequence index
    of each THD row) takes a [B, S, ...] tensor to that layout in one copy, whatever its strides;
    `scatter` (a THD row per flattened [B*S] position) takes it back. No host read: every shape
    is known."""
    device = mask.device
    valid = mask.to(torch.int32)
    lengths = valid.sum(-1, dtype=torch.int32)
    rank_in_valid = valid.cumsum(-1) - 1
    rank_in_padding = (1 - valid).cumsum(-1) - 1
    row_start = torch.arange(batch, device=device).unsqueeze(1) * length
    scatter = (torch.where(mask, rank_in_valid, lengths.unsqueeze(1) + rank_in_padding) + row_start).flatten()
    gather = torch.empty_like(scatter).scatter_(0, scatter, torch.arange(batch * length, device=device))
    cu_seqlens = torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    cu_seqlens_padded = torch.arange(0, batch * length + 1, length, dtype=torch.int32, device=device)
    return (gather // length, gather % length), scatter, cu_seqlens, cu_seqlens_padded


def _rows(x: torch.Tensor) -> torch.Tensor:
    """[B, S, H, D] (a transposed [B, H, S, D]) as THD rows [B*S, H, D]. transformers' K/V come
    from its cache head-major (heads before rows in memory); with one batch row (packed
    batches) they are viewed, not copied: every thdcp backend takes head-major views. (B > 1
    cannot merge its batch and sequence dimensions into one stride, so reshape copies.)"""
    return x.reshape(-1, x.shape[-2], x.shape[-1])


# ---- context parallelism ----

class ContextParallel:
    """A packed batch split over the ranks of a torch.distributed group (one GPU per rank), for
    a transformers model with attn_implementation="thdcp". Every rank makes it from the same
    document lengths, feeds the model its rows and passes it as thdcp_cp:

        cp = ContextParallel(lengths)                     # the default group, or group=/comm=
        ids = cp.split(global_ids)[None]                  # [1, rows / cp]; likewise labels
        positions = cp.split(cp.position_ids())[None]
        logits = model(input_ids=ids, position_ids=positions, thdcp_cp=cp).logits

    lengths: the documents' token counts, in packing order. Each document is padded to a
    multiple of 2 * cp (thdcp.cp_layout); global tensors have `rows` rows, document b at
    cu_seqlens_padded[b], its padding after its tokens. Attention runs thdcp.cp_attention over
    `comm` (or the communicator thdcp keeps for `group`): K/V all-gathered in the forward,
    dK/dV reduce-scattered in the backward. Parameter gradients stay per rank: all-reduce them
    over the group, as for data parallelism.
    """

    def __init__(self, lengths: Sequence[int], comm: Optional[thdcp.Communicator] = None, group=None):
        if not torch.cuda.is_available():
            raise ValueError("thdcp.integrations.transformers.ContextParallel: context parallelism needs one CUDA "
                             "GPU per rank and none is visible; run without thdcp_cp on one device instead")
        self.comm = comm if comm is not None else thdcp.Communicator.for_group(group)
        self.size, self.rank = self.comm.size, self.comm.rank
        self.cu_seqlens, self.cu_seqlens_padded = thdcp.cp_layout(lengths, self.size)
        self.rows = int(self.cu_seqlens_padded[-1])
        self.local_rows = self.rows // self.size
        device = torch.device("cuda", self.comm.device)
        self._device_layout = (self.cu_seqlens.to(device), self.cu_seqlens_padded.to(device))

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a global tensor [rows, ...] (tokens, positions, labels)."""
        return thdcp.cp_split(x, self.cu_seqlens_padded, self.size, self.rank)

    def position_ids(self) -> torch.Tensor:
        """Global position ids (int64 [rows]): each row's position in its document, counted
        from the document's first row (its padding rows continue the count)."""
        return cp_position_ids(self.cu_seqlens_padded)

    def packed_rows(self):
        """(local, packed): this rank's rows that hold tokens and where each sits in the unpadded
        packed batch (cp_packed_rows): to compare a rank's outputs with a one-device run."""
        return cp_packed_rows(self.cu_seqlens, self.cu_seqlens_padded, self.size, self.rank)

    def attend(self, q, k, v, window, softmax_scale, sinks=None):
        cu_seqlens, cu_seqlens_padded = self._device_layout
        return thdcp.cp_attention(q, k, v, cu_seqlens, cu_seqlens_padded, comm=self.comm, window=window,
                                  softmax_scale=softmax_scale, sinks=sinks)


def cp_position_ids(cu_seqlens_padded: torch.Tensor) -> torch.Tensor:
    """Each row's position in its document (int64 [rows]) for a layout's cu_seqlens_padded."""
    cu = cu_seqlens_padded.to(device="cpu", dtype=torch.int64)
    sizes = cu[1:] - cu[:-1]
    return torch.arange(int(cu[-1])) - torch.repeat_interleave(cu[:-1], sizes)


def cp_packed_rows(cu_seqlens: torch.Tensor, cu_seqlens_padded: torch.Tensor, cp: int, rank: int):
    """(local, packed), int64: the indices of `rank`'s rows that hold tokens (not padding) and,
    for each, its index in the unpadded packed batch (the documents back to back, as
    DataCollatorWithFlattening lays them out)."""
    rows = thdcp.cp_rank_rows(cu_seqlens_padded, cp, rank)
    cu = cu_seqlens.to(device="cpu", dtype=torch.int64)
    cu_padded = cu_seqlens_padded.to(device="cpu", dtype=torch.int64)
    document = torch.searchsorted(cu_padded, rows, right=True) - 1
    offset = rows - cu_padded[document]
    local = (offset < cu[document + 1] - cu[document]).nonzero().flatten()
    return local, (cu[document] + offset)[local]


# ---- the attention function ----

def _refuse(what: str) -> None:
    raise ValueError("thdcp (attn_implementation=%r): %s" % (NAME, what))


def _sinks(s_aux, q):
    """gpt-oss's s_aux (its `sinks` parameter [Hq], in the model's dtype) as thdcp.attention's
    float32 sinks; None without."""
    if s_aux is None:
        return None
    if not isinstance(s_aux, torch.Tensor) or not s_aux.is_floating_point():
        _refuse("s_aux=%r: attention sinks are a floating-point tensor [%d], one logit per query head"
                % (s_aux if not isinstance(s_aux, torch.Tensor) else s_aux.dtype, q.shape[2]))
    return arguments.sinks("attention (attn_implementation=%r)" % NAME, s_aux.float(), q[0], "s_aux")


def _window(causal: bool, sliding_window) -> tuple:
    if sliding_window is None:
        return (-1, 0) if causal else (-1, -1)
    sliding_window = arguments.integer("integrations.transformers", "sliding_window", sliding_window, 1,
                                       arguments.INT32_MAX)
    if not causal:
        # transformers' own paths disagree here: its SDPA mask lets |i - j| <= w through, its
        # FlashAttention path |i - j| <= w - 1.
        _refuse("a sliding window without causality (is_causal=False, sliding_window=%d) is ambiguous in "
                "transformers; thdcp does causal sliding windows only" % sliding_window)
    return (sliding_window - 1, 0)


def _compute_dtype(query, key, value):
    dtype = query.dtype
    device_type = query.device.type
    if dtype == torch.float32 and torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)  # autocast leaves RoPE's output in fp32
    if device_type == "cuda" and dtype not in (torch.bfloat16, torch.float16):
        _refuse("the CUDA kernels take bf16 or fp16 and the query is %s: load the model with "
                "dtype=torch.bfloat16 or run it under torch.autocast('cuda', dtype=torch.bfloat16)" % dtype)
    return query.to(dtype), key.to(dtype), value.to(dtype)


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                      sliding_window: Optional[int] = None, softcap: Optional[float] = None,
                      is_causal: Optional[bool] = None, s_aux: Optional[torch.Tensor] = None, **kwargs):
    """transformers' attention function for attn_implementation="thdcp" (the signature of its
    FlashAttention path). query [B, Hq, S, D], key and value [B, Hkv, S, D]; attention_mask:
    padding_mask's output (None or bool [B, S]). Returns (out [B, S, Hq, D], None)."""
    if dropout:
        _refuse("attention dropout (dropout=%r: config.attention_dropout while training) is not supported; "
                "set config.attention_dropout = 0.0" % dropout)
    if softcap is not None:
        _refuse("logit softcapping (softcap=%r, e.g. Gemma 2's attn_logit_softcapping) is not supported" % softcap)
    if kwargs.get("output_attentions"):
        _refuse("output_attentions=True: thdcp never forms the attention weights; use "
                "attn_implementation='eager' to inspect them")
    if kwargs.get("position_bias") is not None:
        _refuse("an additive position bias (position_bias) is not supported")
    batch, _, length, _ = query.shape
    if key.shape[0] != batch or key.shape[2] != length or value.shape[2] != length:
        _refuse("query [batch %d, length %d] and key [batch %d, length %d] differ: thdcp attends a sequence to "
                "itself (training, prefill). Generation with a KV cache and cross-attention are not supported: "
                "use attn_implementation='sdpa' for generate()" % (batch, length, key.shape[0], key.shape[2]))
    if attention_mask is not None:
        if (not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2
                or attention_mask.is_floating_point() or tuple(attention_mask.shape) != (batch, length)):
            shape = tuple(attention_mask.shape) if hasattr(attention_mask, "shape") else type(attention_mask)
            _refuse("attention_mask %s: thdcp takes a 2D padding mask [batch %d, length %d] (1 or True: a token). "
                    "4D and float masks (a custom pattern or bias) are not supported; express documents with "
                    "position_ids or cu_seq_lens_q/k" % (shape, batch, length))
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    window = _window(causal, sliding_window)
    query, key, value = _compute_dtype(query, key, value)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # [B, S, H, D]
    sinks = _sinks(s_aux, q)
    context = kwargs.get("thdcp_cp")
    if context is not None:
        if not isinstance(context, ContextParallel):
            _refuse("thdcp_cp=%r; pass a thdcp.integrations.transformers.ContextParallel" % (context,))
        if attention_mask is not None:
            _refuse("attention_mask with thdcp_cp: under context parallelism the padding is the layout's; "
                    "pass attention_mask=None")
        if batch != 1 or length != context.local_rows:
            _refuse("thdcp_cp: the model's input is [%d, %d] but this rank holds [1, %d] rows: pass "
                    "cp.split(global_tensor)[None]" % (batch, length, context.local_rows))
        out = context.attend(_rows(q), _rows(k), _rows(v), window, scaling, sinks)
    elif attention_mask is not None:
        gather, scatter, cu_seqlens, cu_seqlens_padded = _unpadding(attention_mask.to(q.device).bool(), batch, length)
        out = thdcp.attention(q[gather], k[gather], v[gather], cu_seqlens, cu_seqlens_padded, window=window,
                              softmax_scale=scaling, sinks=sinks)
        out = out.index_select(0, scatter)
    else:
        cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
        if cu_q is not None or cu_k is not None:
            if cu_q is None or cu_k is None:
                _refuse("pass both cu_seq_lens_q and cu_seq_lens_k (or neither)")
            cu_seqlens, cu_seqlens_padded = _packed_from_cu_seq_lens(cu_q, cu_k, batch, length, q.device)
        elif kwargs.get("position_ids") is not None:
            cu_seqlens, cu_seqlens_padded = _packed_from_position_ids(kwargs["position_ids"], batch, length,
                                                                      q.device)
        else:
            cu_seqlens = torch.arange(0, batch * length + 1, length, dtype=torch.int32, device=q.device)
            cu_seqlens_padded = cu_seqlens
        out = thdcp.attention(_rows(q), _rows(k), _rows(v), cu_seqlens, cu_seqlens_padded, window=window,
                              softmax_scale=scaling, sinks=sinks)
    return out.view(batch, length, out.shape[-2], out.shape[-1]), None


register()

__all__ = ["NAME", "register", "attention_forward", "padding_mask", "ContextParallel", "cp_position_ids",
           "cp_packed_rows"]
