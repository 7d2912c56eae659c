"""Single-device attention and RoPE: Python entry points, fake implementations (for
torch.compile and meta tensors) and autograd formulas of the thdcp operators."""
from typing import Optional, Sequence, Tuple, Union

import torch

from . import arguments

_ops = torch.ops.thdcp


def _kernel_ready(grad: torch.Tensor) -> torch.Tensor:
    """The incoming gradient itself where the kernels take it as a view (any row and head
    strides: a transposed, head-major or sliced gradient passes with no copy), else a
    contiguous copy: autograd may hand over a gradient with a strided head dim, a broadcast
    (stride 0, e.g. from expand) or, on CUDA, rows not on 16-byte boundaries, which the
    kernels refuse. Reads host metadata only (no data pointer: fake tensors have none)."""
    if grad.dim() != 3:
        return grad.contiguous()
    if grad.size(2) > 1 and grad.stride(2) != 1:
        return grad.contiguous()
    element = grad.element_size()
    for dim in (0, 1):
        if grad.size(dim) > 1 and (grad.stride(dim) == 0 or (grad.is_cuda and grad.stride(dim) * element % 16)):
            return grad.contiguous()
    if grad.is_cuda and grad.storage_offset() * element % 16:  # the caching allocator's blocks are aligned
        return grad.contiguous()
    return grad


def _results(out, lse, max_logit, return_lse, return_max_logit):
    if not return_lse and not return_max_logit:
        return out
    result = [out]
    if return_lse:
        result.append(lse)
    if return_max_logit:
        result.append(max_logit)
    return tuple(result)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    cu_seqlens_padded: Optional[torch.Tensor] = None,
    *,
    window: Sequence[int] = (-1, 0),
    softmax_scale: Optional[float] = None,
    return_lse: bool = False,
    return_max_logit: bool = False,
    sinks: Optional[torch.Tensor] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, ...]]:
    """Attention over packed sequences (FlashAttention's varlen semantics on absolute positions).

    q, k: [T, Hq, D_qk], [T, Hkv, D_qk]; v: [T, Hkv, D_v] (Hq a multiple of Hkv: GQA/MQA;
    D_v = v.shape[-1], which may differ from D_qk: MLA's 192/128), bf16 or fp16 on CUDA
    (D_qk = D_v in {64, 96, 128, 192, 256}, or D_qk 192 with D_v 128; another pair raises
    ValueError naming both), or float32/bf16/fp16 on the CPU (D_qk and D_v multiples of 8 up
    to 256). Any view whose last dimension is
    contiguous is taken as it is, with no copy, on both backends: views of one packed QKV
    buffer [T, Hq + 2 Hkv, D], padded heads, and head-major views x.transpose(0, 1) of
    [H, T, D] memory (K/V as transformers' cache holds them). On CUDA the data pointer and the
    row and head strides must be multiples of 16 bytes (8 elements; refused otherwise, naming
    the tensor); a broadcast (stride 0) dimension is copied.
    cu_seqlens: int32 [B + 1], prefix sums of the valid lengths; cu_seqlens_padded: int32
    [B + 1], prefix sums of the lengths in memory (None: no padding), last entry T. Trailing
    zero-length sequences (placeholders) are allowed; padding rows get 0 and an LSE of -inf.
    window: (left, right) keys visible around each query, -1 unbounded: (-1, 0) causal,
    (-1, -1) full, (L, 0) causal sliding window.
    sinks: None, or attention sinks (gpt-oss): a float32 tensor [Hq] on q's device, one
    learnable logit per query head that joins each row's softmax denominator and adds no
    value (unscaled: softmax_scale does not apply to it). Differentiable: the backward gives
    d(sinks), float32 [Hq], summed over every query row in a fixed order. Both backends take
    them.
    Returns out [T, Hq, D_v], and with return_lse the float32 LSE [Hq, T] (the sink included),
    with return_max_logit the float32 max score per head [Hq] (over q.k, the sink excluded).
    LSE and max_logit are not differentiable.
    """
    arguments.check_devices("attention", _attention_tensors(q, k, v, cu_seqlens, cu_seqlens_padded))
    if cu_seqlens_padded is None:
        cu_seqlens_padded = cu_seqlens
    left, right = arguments.window("attention", window)
    if sinks is not None:
        sinks = arguments.sinks("attention", sinks, q)
    out, lse, max_logit = _ops.attention_forward(
        q, k, v, cu_seqlens, cu_seqlens_padded, left, right, arguments.softmax_scale("attention", softmax_scale),
        bool(return_max_logit), sinks
    )
    return _results(out, lse, max_logit, return_lse, return_max_logit)


def _attention_tensors(q, k, v, cu_seqlens, cu_seqlens_padded):
    return (("q", q), ("k", k), ("v", v), ("cu_seqlens", cu_seqlens), ("cu_seqlens_padded", cu_seqlens_padded))


def _attention_backward_tensors(dout, q, k, v, out, lse, cu_seqlens, cu_seqlens_padded):
    return (("q", q), ("dout", dout), ("k", k), ("v", v), ("out", out), ("lse", lse), ("cu_seqlens", cu_seqlens),
            ("cu_seqlens_padded", cu_seqlens_padded))


# The fake implementations serve FakeTensorMode (torch.compile) and all-meta calls. The
# dispatcher also runs them when any input is on meta (Meta outranks CPU and CUDA), where
# their empty outputs would pass for results: they refuse every mix of devices first.
@torch.library.register_fake("thdcp::attention_forward")
def _attention_forward_fake(q, k, v, cu_seqlens, cu_seqlens_padded, window_left, window_right, softmax_scale,
                            return_max_logit, sinks=None):
    arguments.check_devices("attention", _attention_tensors(q, k, v, cu_seqlens, cu_seqlens_padded)
                            + (("sinks", sinks),))
    tokens, heads, _ = q.shape
    out = q.new_empty((tokens, heads, v.shape[-1]))  # D_v
    lse = q.new_empty((heads, tokens), dtype=torch.float32)
    max_logit = q.new_empty((heads if return_max_logit else 0,), dtype=torch.float32)
    return out, lse, max_logit


@torch.library.register_fake("thdcp::attention_backward")
def _attention_backward_fake(dout, q, k, v, out, lse, cu_seqlens, cu_seqlens_padded, window_left, window_right,
                             softmax_scale, deterministic, sinks=None):
    arguments.check_devices("attention backward",
                            _attention_backward_tensors(dout, q, k, v, out, lse, cu_seqlens, cu_seqlens_padded)
                            + (("sinks", sinks),))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), _dsinks_fake(q, sinks)


def _dsinks_fake(q, sinks):
    """The backward's d(sinks): float32 [Hq] with sinks, else [0] (the operators return a tensor either way)."""
    return q.new_empty((q.shape[1] if sinks is not None else 0,), dtype=torch.float32)


def _attention_setup(ctx, inputs, output):
    q, k, v, cu_seqlens, cu_seqlens_padded, left, right, scale, _, *rest = inputs
    sinks = rest[0] if rest else None
    out, lse, max_logit = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens, cu_seqlens_padded, sinks)
    ctx.window = (left, right)
    ctx.scale = scale
    ctx.mark_non_differentiable(lse, max_logit)


def _attention_backward(ctx, dout, dlse, dmax_logit):
    q, k, v, out, lse, cu_seqlens, cu_seqlens_padded, sinks = ctx.saved_tensors
    dq, dk, dv, dsinks = _ops.attention_backward(
        _kernel_ready(dout), q, k, v, out, lse, cu_seqlens, cu_seqlens_padded, ctx.window[0], ctx.window[1],
        ctx.scale, True, sinks
    )
    return dq, dk, dv, None, None, None, None, None, None, dsinks if sinks is not None else None


torch.library.register_autograd("thdcp::attention_forward", _attention_backward, setup_context=_attention_setup)


def rope(
    x: torch.Tensor,
    cu_seqlens: torch.Tensor,
    cu_seqlens_padded: Optional[torch.Tensor] = None,
    *,
    cp_size: int = 1,
    cp_rank: int = 0,
    theta: float = 10000.0,
    rotary_dim: int = 0,
    interleaved: bool = False,
    start_offsets: Optional[torch.Tensor] = None,
    layout: str = "dual_chunk",
) -> torch.Tensor:
    """Rotary position embedding of a THD tensor, positions counted from each sequence's start.

    x: [T / cp_size, H, D], this rank's rows under the CP `layout` (cp_size = 1: the whole
    batch): "dual_chunk" (every padded length of the global layout a multiple of 2 * cp_size
    when cp_size > 1) or "contiguous" (T a multiple of cp_size); cu_seqlens /
    cu_seqlens_padded: the *global* layout. interleaved: GPT-J pairs (2i, 2i+1), else NeoX
    halves. rotary_dim: leading elements rotated (0: all). start_offsets: int32 [B] added to
    each sequence's positions (e.g. a document continued from an earlier batch).
    Returns a new tensor (x is not changed); differentiable.
    """
    arguments.check_devices("rope", _rope_tensors(x, cu_seqlens, cu_seqlens_padded, start_offsets))
    if cu_seqlens_padded is None:
        cu_seqlens_padded = cu_seqlens
    cp_size = arguments.cp_size("rope", cp_size, "cp_size")
    cp_rank = arguments.integer("rope", "cp_rank", cp_rank, 0, arguments.INT32_MAX)
    rotary_dim = arguments.integer("rope", "rotary_dim", rotary_dim, 0, arguments.INT64_MAX)
    layout = arguments.cp_layout("rope", layout)
    return _ops.rope(x, cu_seqlens, cu_seqlens_padded, start_offsets, cp_size, cp_rank, float(theta), rotary_dim,
                     bool(interleaved), False, layout)


def _rope_tensors(x, cu_seqlens, cu_seqlens_padded, start_offsets):
    return (("x", x), ("cu_seqlens", cu_seqlens), ("cu_seqlens_padded", cu_seqlens_padded),
            ("start_offsets", start_offsets))


@torch.library.register_fake("thdcp::rope")
def _rope_fake(x, cu_seqlens, cu_seqlens_padded, start_offsets, cp, rank, theta, rotary_dim, interleaved, backward,
               layout="dual_chunk"):
    arguments.check_devices("rope", _rope_tensors(x, cu_seqlens, cu_seqlens_padded, start_offsets))
    return x.new_empty(x.shape)


def _rope_setup(ctx, inputs, output):
    x, cu_seqlens, cu_seqlens_padded, start_offsets, cp, rank, theta, rotary_dim, interleaved, backward, *rest = inputs
    ctx.save_for_backward(cu_seqlens, cu_seqlens_padded, start_offsets)
    ctx.args = (cp, rank, theta, rotary_dim, interleaved, backward, rest[0] if rest else "dual_chunk")


def _rope_backward(ctx, grad):
    cu_seqlens, cu_seqlens_padded, start_offsets = ctx.saved_tensors
    cp, rank, theta, rotary_dim, interleaved, backward, layout = ctx.args
    dx = _ops.rope(_kernel_ready(grad), cu_seqlens, cu_seqlens_padded, start_offsets, cp, rank, theta, rotary_dim,
                   interleaved, not backward, layout)
    return dx, None, None, None, None, None, None, None, None, None, None


torch.library.register_autograd("thdcp::rope", _rope_backward, setup_context=_rope_setup)
