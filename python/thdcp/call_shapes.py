"""Argument translation shared by the familiar call shapes: thdcp.varlen_attn (PyTorch's
varlen_attn), thdcp.flash_attn_varlen_func (FlashAttention's), thdcp.te.DotProductAttention
(TransformerEngine's THD arguments) and the PyTorch flash-attention provider. Each turns its
own conventions into thdcp.attention's arguments, through the functions here, and calls
thdcp.attention (or thdcp.cp_attention); none assembles attention of its own.

What thdcp does not do (cross-attention, dropout, softcap, ALiBi, paged KV, ...) is refused
with a ValueError naming the argument, its value and what to pass instead.
"""
from typing import Optional, Sequence, Tuple

import torch

from . import arguments


def describe(value) -> str:
    """value as an error message shows it: a tensor by its dtype and shape, not its values."""
    if isinstance(value, torch.Tensor):
        return "<tensor %s %s>" % (str(value.dtype).replace("torch.", ""), list(value.shape))
    return repr(value)


def refuse(op: str, name: str, value, fix: str):
    raise ValueError("thdcp.%s: %s=%s is not supported: %s" % (op, name, describe(value), fix))


def no_alibi(op: str, alibi_slopes):
    """Refuses ALiBi slopes (FlashAttention's and TransformerEngine's argument) by name."""
    if alibi_slopes is not None:
        refuse(op, "alibi_slopes", alibi_slopes,
               "thdcp adds no ALiBi bias (positions enter through thdcp.rope): pass None")


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b are one tensor (the same object, or views of the same memory with the
    same shape, strides and dtype). Reads host metadata only: no sync, safe under capture.
    While torch.compile traces, only the same object counts (a traced tensor has no address)."""
    if a is b:
        return True
    if torch.compiler.is_compiling():
        return False
    return (a.device == b.device and a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            and a.data_ptr() == b.data_ptr())


def _cannot_read_values() -> bool:
    # Comparing values reads them on the host: not while tracing (no values) or capturing
    # (a sync is illegal there).
    if torch.compiler.is_compiling():
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def self_attention(op: str, q: torch.Tensor, k: torch.Tensor, cu_seqlens_q: torch.Tensor,
                   cu_seqlens_k: torch.Tensor, names: Tuple[str, str, str, str]) -> torch.Tensor:
    """The one layout of a self-attention call whose API takes a query and a key layout:
    thdcp attends queries and keys of one packed batch, so k has q's rows and cu_seqlens_k is
    cu_seqlens_q (one_layout). names: what the API calls q, k, cu_seqlens_q, cu_seqlens_k."""
    q_name, k_name, cu_q_name, cu_k_name = names
    arguments.check_devices(op, ((q_name, q), (k_name, k), (cu_q_name, cu_seqlens_q), (cu_k_name, cu_seqlens_k)))
    if q.dim() >= 1 and k.dim() >= 1 and q.shape[0] != k.shape[0]:
        raise ValueError(
            "thdcp.%s: %s has %d rows but %s has %d: thdcp does self-attention only (queries and keys of one "
            "packed batch, one layout); for cross-attention use the library this call shape comes from"
            % (op, q_name, q.shape[0], k_name, k.shape[0]))
    return one_layout(op, cu_seqlens_q, cu_seqlens_k, (cu_q_name, cu_k_name))


def one_layout(op: str, first: torch.Tensor, second: torch.Tensor, names: Tuple[str, str]) -> torch.Tensor:
    """first, when second is the same tensor or holds the same values (queries' and keys'
    layouts of a self-attention call). The same tensor passes with no look at its values; two
    tensors are compared on the host (a sync on CUDA), which torch.compile and CUDA graph
    capture cannot do: pass the same tensor there."""
    if same_tensor(first, second):
        return first
    if _cannot_read_values():
        raise ValueError(
            "thdcp.%s: %s and %s are different tensors, and their values cannot be compared under "
            "torch.compile or CUDA graph capture: pass the same tensor for both (thdcp does self-attention only)"
            % (op, names[0], names[1]))
    if first.device != second.device or first.shape != second.shape or not torch.equal(first, second):
        raise ValueError(
            "thdcp.%s: %s differs from %s: thdcp does self-attention only (one layout for queries and keys): "
            "pass the same tensor for both" % (op, names[1], names[0]))
    return first


def max_seqlens(op: str, pairs: Sequence[Tuple[str, object]], optional: bool = False) -> None:
    """Checks the maximum lengths the FlashAttention-style APIs take: integers >= 0 (None too
    where optional). thdcp needs no maximum length (its kernels are sized by rows and by the
    segment table), so the values are not used."""
    for name, value in pairs:
        if value is None and optional:
            continue
        arguments.integer(op, name, value, 0, arguments.INT64_MAX)


def flash_window(op: str, causal: bool, window_size: Sequence[int], name: str = "window_size") -> Tuple[int, int]:
    """FlashAttention's (causal, window_size) as thdcp's window: a negative side is unbounded
    (-1), and causal sets the right side to 0, keeping the left (FlashAttention 2's and 3's
    rule). Self-attention, so FlashAttention's bottom-right alignment is thdcp's absolute
    positions."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise ValueError("thdcp.%s: %s=%s; pass (left, right): (-1, -1) full, (-1, 0) causal, (W, 0) causal "
                         "sliding window" % (op, name, describe(window_size)))
    left = arguments.integer(op, "%s[0]" % name, window_size[0], -arguments.INT32_MAX - 1, arguments.INT32_MAX)
    right = arguments.integer(op, "%s[1]" % name, window_size[1], -arguments.INT32_MAX - 1, arguments.INT32_MAX)
    left, right = max(left, -1), max(right, -1)
    if causal:
        right = 0
    return left, right


def valid_lengths_layout(op: str, cu_seqlens: torch.Tensor, seqused: torch.Tensor, name: str) -> torch.Tensor:
    """cu_seqlens of the valid rows when cu_seqlens gives where each sequence sits and
    seqused [B] how many of its rows are real (FlashAttention 3's seqused_q / seqused_k):
    thdcp's (cu_seqlens, cu_seqlens_padded) pair. A prefix sum on the device: no sync."""
    arguments.check_devices(op, (("cu_seqlens", cu_seqlens), (name, seqused)))
    if seqused.dim() != 1 or seqused.shape[0] != cu_seqlens.shape[0] - 1:
        raise ValueError("thdcp.%s: %s has shape %s; pass one length per sequence, [%d]"
                         % (op, name, list(seqused.shape), cu_seqlens.shape[0] - 1))
    valid = torch.zeros_like(cu_seqlens)
    torch.cumsum(seqused, 0, dtype=cu_seqlens.dtype, out=valid[1:])
    return valid


def lse_request(op: str, return_aux) -> bool:
    """Whether a varlen_attn call asked for the LSE (torch.nn.attention.varlen.AuxRequest or
    anything with an `lse` field)."""
    if return_aux is None:
        return False
    if not hasattr(return_aux, "lse"):
        raise ValueError("thdcp.%s: return_aux=%s; pass torch.nn.attention.varlen.AuxRequest(lse=True) or None"
                         % (op, describe(return_aux)))
    return bool(return_aux.lse)

