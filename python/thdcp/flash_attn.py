"""thdcp.flash_attn_varlen_func: FlashAttention's varlen call shape (flash_attn 2's positional
arguments, FlashAttention 3's keywords) over thdcp.attention, for self-attention.

    out = thdcp.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, causal=True)
"""
from typing import Optional, Sequence

import torch

from . import arguments, call_shapes
from .ops import attention

_OP = "flash_attn_varlen_func"


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: Optional[torch.Tensor] = None,
    *,
    seqused_q: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    qv: Optional[torch.Tensor] = None,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
    attention_chunk: int = 0,
    num_splits: int = 1,
    pack_gqa: Optional[bool] = None,
    sm_margin: int = 0,
    learnable_sink: Optional[torch.Tensor] = None,
):
    """flash_attn.flash_attn_varlen_func's signature and conventions, computed by
    thdcp.attention (the same bits as thdcp.attention with the translated arguments).

    q [T, Hq, D], k, v [T, Hkv, D] (Hq a multiple of Hkv: GQA/MQA); cu_seqlens_q, cu_seqlens_k:
    int32 [B + 1], one layout (self-attention: pass one tensor twice; two tensors are compared
    on the host); max_seqlen_q, max_seqlen_k: ints, checked and not needed.
    causal: right window side 0 (left kept); window_size (left, right), negative unbounded;
    FlashAttention's bottom-right alignment is the top-left one in self-attention, thdcp's
    absolute positions. softmax_scale: None for 1/sqrt(D). deterministic: accepted (thdcp's
    backward always is). FlashAttention 3's seqused_q / seqused_k (valid rows of each sequence,
    cu_seqlens giving where it sits) are thdcp's cu_seqlens / cu_seqlens_padded: pass both, the
    same; rows past them get 0. num_splits, pack_gqa and sm_margin tune FlashAttention 3's
    scheduling and are ignored. learnable_sink (FlashAttention 4's name for attention sinks):
    None or a float32 tensor [Hq] on q's device, thdcp.attention's sinks (differentiable).
    Returns out [T, Hq, D]; with return_attn_probs, (out, softmax_lse, None) as flash_attn 2
    returns them without dropout: softmax_lse float32 [Hq, T], no probabilities.
    Refused (ValueError): dropout_p > 0, softcap != 0, alibi_slopes, block_table, qv,
    q/k/v_descale, attention_chunk != 0, cross-attention.
    """
    _refuse_unsupported(dropout_p, softcap, alibi_slopes, block_table, qv, q_descale, k_descale, v_descale,
                        attention_chunk)
    cu_seqlens = call_shapes.self_attention(_OP, q, k, cu_seqlens_q, cu_seqlens_k,
                                            ("q", "k", "cu_seqlens_q", "cu_seqlens_k"))
    call_shapes.max_seqlens(_OP, (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)))
    window = call_shapes.flash_window(_OP, bool(causal), window_size)
    cu_seqlens, cu_seqlens_padded = _layout(cu_seqlens, seqused_q, seqused_k)
    sinks = None if learnable_sink is None else arguments.sinks(_OP, learnable_sink, q, "learnable_sink")
    result = attention(q, k, v, cu_seqlens, cu_seqlens_padded, window=window, softmax_scale=softmax_scale,
                       return_lse=bool(return_attn_probs), sinks=sinks)
    if return_attn_probs:
        out, lse = result
        return out, lse, None
    return result


def _refuse_unsupported(dropout_p, softcap, alibi_slopes, block_table, qv, q_descale, k_descale, v_descale,
                        attention_chunk):
    if float(dropout_p) != 0.0:
        call_shapes.refuse(_OP, "dropout_p", dropout_p, "thdcp has no attention dropout: pass dropout_p=0.0")
    if float(softcap) != 0.0:
        call_shapes.refuse(_OP, "softcap", softcap, "thdcp does not soft-cap scores: pass softcap=0.0")
    call_shapes.no_alibi(_OP, alibi_slopes)
    if block_table is not None:
        call_shapes.refuse(_OP, "block_table", block_table,
                           "thdcp takes packed K/V rows, not a paged KV cache: pass None")
    if qv is not None:
        call_shapes.refuse(_OP, "qv", qv, "thdcp has no extra query-value product (MLA absorption): pass None")
    for name, value in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if value is not None:
            call_shapes.refuse(_OP, name, value, "thdcp takes bf16/fp16 (or CPU float32) inputs, not FP8: pass None")
    if attention_chunk != 0:
        call_shapes.refuse(_OP, "attention_chunk", attention_chunk,
                           "thdcp's masks are (left, right) windows: pass 0 and a window_size")


def _layout(cu_seqlens, seqused_q, seqused_k):
    if seqused_q is None and seqused_k is None:
        return cu_seqlens, None
    if seqused_q is None or seqused_k is None:
        missing = "seqused_k" if seqused_k is None else "seqused_q"
        call_shapes.refuse(_OP, missing, None, "thdcp does self-attention only: pass seqused_q and seqused_k, "
                           "the same tensor")
    call_shapes.one_layout(_OP, seqused_q, seqused_k, ("seqused_q", "seqused_k"))
    return call_shapes.valid_lengths_layout(_OP, cu_seqlens, seqused_q, "seqused_q"), cu_seqlens
