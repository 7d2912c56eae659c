"""thdcp.varlen_attn: PyTorch's torch.nn.attention.varlen.varlen_attn call shape (torch 2.11)
over thdcp.attention.

    from torch.nn.attention.varlen import AuxRequest
    out = thdcp.varlen_attn(q, k, v, cu_seq, cu_seq, max_len, max_len, window_size=(-1, 0))
    out, lse = thdcp.varlen_attn(q, k, v, cu_seq, cu_seq, max_len, max_len, return_aux=AuxRequest(lse=True))
"""
from typing import NamedTuple, Optional, Sequence, Tuple, Union

import torch

from . import call_shapes
from .ops import attention

try:  # the request type varlen_attn callers already hold, where torch has it
    from torch.nn.attention.varlen import AuxRequest
except ImportError:  # older torch: the same fields
    class AuxRequest(NamedTuple):
        """Which auxiliary outputs varlen_attn returns (torch.nn.attention.varlen.AuxRequest)."""

        lse: bool = False


def varlen_attn(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_q: torch.Tensor,
    cu_seq_k: torch.Tensor,
    max_q: int,
    max_k: int,
    *,
    return_aux: Optional[AuxRequest] = None,
    scale: Optional[float] = None,
    window_size: Sequence[int] = (-1, -1),
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """torch.nn.attention.varlen.varlen_attn's signature and conventions, computed by
    thdcp.attention (the same bits as thdcp.attention with the translated arguments).

    query [T, Hq, D], key, value [T, Hkv, D] (Hq a multiple of Hkv); cu_seq_q, cu_seq_k: int32
    [B + 1], the same layout (self-attention: pass one tensor twice; two tensors are compared
    on the host); max_q, max_k: ints, checked and not needed. window_size (left, right):
    (-1, -1) full (the default, as in PyTorch), (-1, 0) causal, (W, 0) causal sliding window;
    absolute positions within each sequence. scale: None for 1/sqrt(D).
    Returns out [T, Hq, D]; with return_aux=AuxRequest(lse=True), (out, lse) with lse float32
    [Hq, T], the layout PyTorch's kernel returns (its docstring says (T, H); its kernel and
    fake implementation give (H, T)). Differentiable in query, key and value; torch 2.11 has no
    out= form, and neither does this.
    """
    op = "varlen_attn"
    cu_seqlens = call_shapes.self_attention(op, query, key, cu_seq_q, cu_seq_k,
                                            ("query", "key", "cu_seq_q", "cu_seq_k"))
    call_shapes.max_seqlens(op, (("max_q", max_q), ("max_k", max_k)))
    window = call_shapes.flash_window(op, False, window_size)
    return attention(query, key, value, cu_seqlens, window=window, softmax_scale=scale,
                     return_lse=call_shapes.lse_request(op, return_aux))
