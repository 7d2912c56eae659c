"""thdcp.flash_attn_varlen_func, FlashAttention's varlen call shape (issue 29): the bits of
thdcp.attention with the translated arguments (causal and window_size as FlashAttention 2 and 3
combine them, GQA, forward, LSE, gradients), the float64 reference, flash_attn 2's positional
order and return_attn_probs triple, FlashAttention 3's seqused_q / seqused_k as thdcp's padded
layout, and every refused argument named with its value."""
import pytest
import torch

import thdcp
from reference import assert_close_to_reference, make_layout

# (causal, window_size, thdcp's window): causal sets the right side to 0 and keeps the left.
MASKS = [(False, (-1, -1), (-1, -1)), (True, (-1, -1), (-1, 0)), (True, (7, 3), (7, 0)), (False, (5, 3), (5, 3)),
         (False, (-1, 0), (-1, 0)), (True, (-1, 9), (-1, 0))]


def inputs(lengths, hq, hkv, d=32, dtype=torch.float32, seed=0, device="cpu"):
    cu, _ = make_layout(lengths)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(int(cu[-1]), h, d, generator=g).to(dtype).to(device) for h in (hq, hkv, hkv))
    return q, k, v, cu.to(device)


@pytest.mark.parametrize("causal,window_size,window", MASKS)
@pytest.mark.parametrize("hq,hkv", [(4, 4), (6, 2), (4, 1)])
def test_flash_attn_varlen_func_is_thdcp_attention_bit_for_bit_and_matches_the_reference(device, causal, window_size,
                                                                                         window, hq, hkv):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    lengths = [29, 1, 50, 8]
    q, k, v, cu = inputs(lengths, hq, hkv, 64, dtype, device=device)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = thdcp.flash_attn_varlen_func(*leaves, cu, cu, 50, 50, causal=causal, window_size=window_size)
    same = [t.clone().requires_grad_() for t in (q, k, v)]
    want = thdcp.attention(*same, cu, window=window)
    assert torch.equal(out, want)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(dtype).to(device)
    grads = torch.autograd.grad(out, leaves, dout)
    for got, expected in zip(grads, torch.autograd.grad(want, same, dout)):
        assert torch.equal(got, expected)
    assert_close_to_reference(out, grads, q, k, v, cu, cu, window, dout)


def test_positional_arguments_in_flash_attn_2_order_and_the_return_attn_probs_triple():
    q, k, v, cu = inputs([12, 30, 5], 4, 2)
    # q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, softmax_scale, causal, window_size, softcap,
    # alibi_slopes, deterministic, return_attn_probs
    out, lse, probs = thdcp.flash_attn_varlen_func(q, k, v, cu, cu, 30, 30, 0.0, 0.3, True, (4, 0), 0.0, None, True,
                                                   True)
    want, want_lse = thdcp.attention(q, k, v, cu, window=(4, 0), softmax_scale=0.3, return_lse=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse) and probs is None
    assert lse.shape == (4, q.shape[0]) and lse.dtype == torch.float32  # flash_attn's (nheads, total_q)
    # FlashAttention 3's scheduling hints change nothing.
    hinted = thdcp.flash_attn_varlen_func(q, k, v, cu, cu, 30, 30, softmax_scale=0.3, causal=True, window_size=(4, 0),
                                          num_splits=4, pack_gqa=True, sm_margin=8, deterministic=False)
    assert torch.equal(hinted, want)


def test_seqused_q_and_k_are_thdcps_padded_layout():
    # FlashAttention 3: cu_seqlens says where each sequence sits, seqused how many of its rows
    # are real; thdcp: cu_seqlens_padded and cu_seqlens. Rows past seqused come out 0.
    cu_valid, cu_padded = make_layout([7, 0, 20, 3], pad_to=8, extra_padding=2)
    tokens = int(cu_padded[-1])
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(tokens, h, 16, generator=g).requires_grad_() for h in (4, 2, 2))
    seqused = (cu_valid[1:] - cu_valid[:-1]).to(torch.int32)
    out = thdcp.flash_attn_varlen_func(q, k, v, cu_padded, cu_padded, 30, 30, causal=True, seqused_q=seqused,
                                       seqused_k=seqused)
    want = thdcp.attention(q, k, v, cu_valid, cu_padded, window=(-1, 0))
    assert torch.equal(out, want)
    padding = [row for b in range(4) for row in range(int(cu_padded[b]) + int(seqused[b]), int(cu_padded[b + 1]))]
    assert padding and torch.count_nonzero(out[padding]) == 0
    same = thdcp.flash_attn_varlen_func(q, k, v, cu_padded, cu_padded, 30, 30, causal=True, seqused_q=seqused,
                                        seqused_k=seqused.clone())
    assert torch.equal(same, want)


REFUSALS = [
    (dict(dropout_p=0.1), "dropout_p=0.1 is not supported"),
    (dict(softcap=30.0), "softcap=30.0 is not supported"),
    (dict(alibi_slopes=torch.ones(4)), "alibi_slopes=<tensor float32 [4]> is not supported"),
    (dict(block_table=torch.zeros(3, 2, dtype=torch.int32)), "block_table=<tensor int32 [3, 2]> is not supported"),
    (dict(qv=torch.zeros(1)), "qv=<tensor float32 [1]> is not supported"),
    (dict(q_descale=torch.ones(1)), "q_descale=<tensor float32 [1]> is not supported"),
    (dict(v_descale=torch.ones(1)), "v_descale=<tensor float32 [1]> is not supported"),
    (dict(attention_chunk=64), "attention_chunk=64 is not supported"),
    (dict(seqused_q=torch.tensor([5, 9, 3], dtype=torch.int32)), "seqused_k=None is not supported"),
    (dict(seqused_q=torch.tensor([5, 9, 3], dtype=torch.int32), seqused_k=torch.tensor([5, 9, 2], dtype=torch.int32)),
     "seqused_k differs from seqused_q"),
    (dict(seqused_q=torch.tensor([5, 9], dtype=torch.int32), seqused_k=torch.tensor([5, 9], dtype=torch.int32)),
     "seqused_q has shape [2]; pass one length per sequence, [3]"),
    (dict(cu_seqlens_k=torch.tensor([0, 5, 12, 17], dtype=torch.int32)), "cu_seqlens_k differs from cu_seqlens_q"),
    (dict(k_rows=16), "q has 17 rows but k has 16"),
    (dict(max_seqlen_q=None), "max_seqlen_q=None is not an integer"),
    (dict(window_size=(0, 1, 2)), "window_size=(0, 1, 2)"),
    (dict(window_size=(2.5, 0)), "window_size[0]=2.5"),
]


@pytest.mark.parametrize("change,message", REFUSALS)
def test_unsupported_arguments_are_refused_by_name_with_their_value(change, message):
    q, k, v, cu = inputs([5, 9, 3], 4, 2)
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=9, max_seqlen_k=9)
    change = dict(change)
    rows = change.pop("k_rows", None)
    if rows is not None:
        args["k"], args["v"] = k[:rows], v[:rows]
    args.update(change)
    with pytest.raises(ValueError) as error:
        thdcp.flash_attn_varlen_func(**args)
    text = str(error.value)
    assert text.startswith("thdcp.flash_attn_varlen_func: ") and message in text, text
    if "is not supported" in message:
        assert ": pass " in text.split("is not supported", 1)[1], "the message says what to pass: " + text
