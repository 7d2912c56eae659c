"""The CPU side of the package (runs in CI): the reference backend in bf16/fp16 storage,
RoPE with start offsets, and the errors of the host helpers."""
import math

import pytest
import torch

import thdcp
from reference import attention_reference, make_layout, rope_reference


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("window", [(-1, 0), (9, 2)])
def test_cpu_attention_in_16_bit_storage_matches_float64(dtype, window):
    cu, cu_padded = make_layout([23, 0, 7, 40], pad_to=4, extra_padding=1)
    tokens = int(cu_padded[-1])
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(tokens, h, 32, generator=g).to(dtype).requires_grad_() for h in (4, 2, 2))
    out, lse = thdcp.attention(q, k, v, cu, cu_padded, window=window, return_lse=True)
    assert out.dtype == dtype and lse.dtype == torch.float32 and lse.shape == (4, tokens)
    rq, rk, rv = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref, ref_lse = attention_reference(rq, rk, rv, cu, cu_padded, window)
    tol = 2e-2 if dtype == torch.bfloat16 else 3e-3
    torch.testing.assert_close(out.double(), ref.detach(), rtol=tol, atol=tol)
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse.double()[finite], ref_lse.detach()[finite], rtol=1e-4, atol=1e-4)
    dout = torch.randn(out.shape, generator=g).to(dtype)
    out.backward(dout)
    ref.backward(dout.double())
    for got, want in ((q.grad, rq.grad), (k.grad, rk.grad), (v.grad, rv.grad)):
        torch.testing.assert_close(got.double(), want, rtol=tol * 2, atol=tol * 4)


def test_cpu_rope_with_start_offsets_matches_the_reference():
    cu, cu_padded = make_layout([5, 12, 3], pad_to=2)
    tokens = int(cu_padded[-1])
    x = torch.randn(tokens, 2, 16, generator=torch.Generator().manual_seed(3))
    offsets = torch.tensor([100, 0, 7], dtype=torch.int32)
    positions = torch.zeros(tokens, dtype=torch.float64)
    for b in range(3):
        s, e = int(cu_padded[b]), int(cu_padded[b + 1])
        positions[s:e] = torch.arange(e - s, dtype=torch.float64) + int(offsets[b])
    got = thdcp.rope(x, cu, cu_padded, start_offsets=offsets, theta=500.0)
    want = rope_reference(x, cu, cu_padded, theta=500.0, positions=positions)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_host_helpers_refuse_bad_arguments_naming_them():
    cu, cu_padded = make_layout([5, 12], pad_to=2)
    x = torch.randn(int(cu_padded[-1]), 2, 16)
    with pytest.raises(ValueError, match="cp=2, rank=2"):
        thdcp.rope(x, cu, cu_padded, cp_size=2, cp_rank=2)
    with pytest.raises(ValueError, match="start_offsets"):
        thdcp.rope(x, cu, cu_padded, start_offsets=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="cu_seqlens_padded"):
        thdcp.attention(x, x[:, :1], x[:, :1], cu, cu_padded[:-1])
    with pytest.raises(ValueError, match="both max_seqs and max_tokens"):
        thdcp.cp_layout([3, 4], 2, max_seqs=4)
    with pytest.raises(ValueError, match="batch sizes"):
        torch.ops.thdcp.plan_capacity([3, 4, 5], [2], 64, 1, 0.01)
    with pytest.raises(ValueError):
        thdcp.plan_capacity([[5000]], 4096, cp=1)  # a document longer than a batch
    with pytest.raises(ValueError, match="window"):
        thdcp.attention(x, x, x, cu, cu_padded, window=(0,))


def test_default_softmax_scale_is_one_over_sqrt_head_dim():
    cu, cu_padded = make_layout([9], pad_to=1)
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(9, 2, 16, generator=g) for _ in range(3))
    default = thdcp.attention(q, k, v, cu, cu_padded)
    explicit = thdcp.attention(q, k, v, cu, cu_padded, softmax_scale=1.0 / math.sqrt(16))
    doubled = thdcp.attention(q, k, v, cu, cu_padded, softmax_scale=2.0 / math.sqrt(16))
    assert torch.equal(default, explicit)
    assert not torch.equal(default, doubled)
