"""thdcp.attention and thdcp.rope on views with any row and head strides, with no copy: head-major
views x.transpose(0, 1) of [H, T, D] memory (K/V as transformers' cache holds them, also a
slice of a longer cache), padded heads, packed QKV, GQA, a broadcast (expand) input. Forward
and backward give the bits of the same calls on contiguous copies, on the CPU (and on CUDA
with a GPU: bf16 and fp16, head dims 64 and 128, causal, window and full masks). Gradients
that autograd hands over strided pass with no copy; a misaligned CUDA view is refused naming
it."""
import pytest
import torch

import thdcp
from reference import make_layout

WINDOWS = [(-1, 0), (5, 3), (-1, -1)]


def layout(device):
    cu, cu_padded = make_layout([30, 1, 0, 47, 12], pad_to=8, extra_padding=2)
    return cu.to(device), cu_padded.to(device)


def head_major(x, cache_rows=0):
    """The same values as a view of head-major memory [H, T + cache_rows, D] (a slice of a
    cache of T + cache_rows rows): row stride D, head stride (T + cache_rows) * D."""
    tokens, heads, dim = x.shape
    memory = torch.empty(heads, tokens + cache_rows, dim, dtype=x.dtype, device=x.device)
    memory.normal_()
    memory[:, :tokens] = x.transpose(0, 1)
    view = memory[:, :tokens].transpose(0, 1)
    assert view.stride() == (dim, (tokens + cache_rows) * dim, 1)
    return view


def padded_heads(x, pad=8):
    """The same values as a view with head stride D + pad (a slice of a wider last dim)."""
    tokens, heads, dim = x.shape
    memory = torch.randn(tokens, heads, dim + pad, dtype=torch.float32, device=x.device).to(x.dtype)
    memory[..., :dim] = x
    return memory[..., :dim]


ARRANGEMENTS = {
    "head_major": lambda x: head_major(x),
    "head_major_cache_slice": lambda x: head_major(x, cache_rows=13),
    "padded_heads": padded_heads,
}


def check_bitwise(device, dtype, hq, hkv, d, window, arrange_q, arrange_kv, seed=0):
    cu, cu_padded = layout(device)
    tokens = int(cu_padded[-1])
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(tokens, h, d, generator=g).to(dtype).to(device) for h in (hq, hkv, hkv))
    dout = torch.randn(tokens, hq, d, generator=g).to(dtype).to(device)
    qc, kc, vc = (t.clone().requires_grad_() for t in (q, k, v))
    out_c, lse_c = thdcp.attention(qc, kc, vc, cu, cu_padded, window=window, return_lse=True)
    out_c.backward(dout)
    qs, ks, vs = arrange_q(q), arrange_kv(k), arrange_kv(v)
    for t in (qs, ks, vs):
        t.requires_grad_()
    out_s, lse_s = thdcp.attention(qs, ks, vs, cu, cu_padded, window=window, return_lse=True)
    out_s.backward(dout)
    assert torch.equal(out_s, out_c) and torch.equal(lse_s, lse_c)
    for name, got, want in (("dq", qs.grad, qc.grad), ("dk", ks.grad, kc.grad), ("dv", vs.grad, vc.grad)):
        assert torch.equal(got, want), name


@pytest.mark.parametrize("arrangement", sorted(ARRANGEMENTS))
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2)])
def test_cpu_views_give_the_bits_of_contiguous_copies(arrangement, window, hq, hkv):
    arrange = ARRANGEMENTS[arrangement]
    for dtype in (torch.float32, torch.bfloat16):
        check_bitwise("cpu", dtype, hq, hkv, 16, window, arrange, arrange)
    # Contiguous q with head-major K/V: the transformers case.
    check_bitwise("cpu", torch.float32, hq, hkv, 16, window, lambda x: x, arrange)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("window", WINDOWS)
def test_cuda_views_give_the_bits_of_contiguous_copies(cuda, dtype, d, window):
    for arrangement in sorted(ARRANGEMENTS):
        arrange = ARRANGEMENTS[arrangement]
        check_bitwise(cuda, dtype, 8, 2, d, window, arrange, arrange)
        check_bitwise(cuda, dtype, 8, 2, d, window, lambda x: x, arrange)


def test_head_major_views_are_not_copied(device):
    # The op reads the view's own memory: writing the memory afterwards changes nothing that
    # was computed, and the view handed over is the cache's storage.
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    cu, cu_padded = layout(device)
    tokens = int(cu_padded[-1])
    k = head_major(torch.randn(tokens, 2, 64).to(dtype).to(device), cache_rows=5)
    memory = k.transpose(0, 1)
    assert k.data_ptr() == memory.data_ptr() and not k.is_contiguous()
    q = torch.randn(tokens, 4, 64).to(dtype).to(device)
    out = thdcp.attention(q, k, k, cu, cu_padded)
    assert torch.equal(out, thdcp.attention(q, k.contiguous(), k.contiguous(), cu, cu_padded))


def test_broadcast_kv_is_materialised(device):
    # k expanded over its heads (stride 0): thdcp's strides read 0 as contiguous, so the op
    # copies it; the result equals the materialised tensor's.
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    cu, cu_padded = layout(device)
    tokens = int(cu_padded[-1])
    q = torch.randn(tokens, 4, 64).to(dtype).to(device)
    k = torch.randn(tokens, 1, 64).to(dtype).to(device).expand(tokens, 2, 64)
    assert k.stride(1) == 0
    out = thdcp.attention(q, k, k, cu, cu_padded)
    assert torch.equal(out, thdcp.attention(q, k.contiguous(), k.contiguous(), cu, cu_padded))


def test_strided_gradients_pass_without_a_copy():
    from thdcp.ops import _kernel_ready

    g = torch.randn(6, 20, 16).transpose(0, 1)  # head-major [20, 6, 16]
    assert _kernel_ready(g) is g
    sliced = torch.randn(20, 6, 24)[..., :16]
    assert _kernel_ready(sliced) is sliced
    expanded = torch.randn(20, 1, 16).expand(20, 6, 16)
    assert _kernel_ready(expanded).is_contiguous()
    strided_dim = torch.randn(20, 16, 6).transpose(1, 2)  # head_dim not contiguous
    assert _kernel_ready(strided_dim).is_contiguous()


def test_backward_through_a_transposed_output_gradient(device):
    # A loss that reads out head-major hands the backward a head-major gradient.
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    cu, cu_padded = layout(device)
    tokens = int(cu_padded[-1])
    q, k, v = (torch.randn(tokens, h, 64).to(dtype).to(device).requires_grad_() for h in (4, 2, 2))
    weights = torch.randn(4, tokens, 64).to(dtype).to(device)
    (thdcp.attention(q, k, v, cu, cu_padded).transpose(0, 1) * weights).sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    thdcp.attention(q2, k2, v2, cu, cu_padded).backward(weights.transpose(0, 1).contiguous())
    for got, want in zip(grads, (q2.grad, k2.grad, v2.grad)):
        assert torch.equal(got, want)


def test_rope_takes_head_major_views(device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    cu, cu_padded = layout(device)
    tokens = int(cu_padded[-1])
    x = torch.randn(tokens, 4, 64).to(dtype).to(device)
    view = head_major(x, cache_rows=3).requires_grad_()
    y = thdcp.rope(view, cu, cu_padded)
    assert torch.equal(y, thdcp.rope(x, cu, cu_padded))
    y.backward(torch.ones_like(y))
    xc = x.clone().requires_grad_()
    thdcp.rope(xc, cu, cu_padded).backward(torch.ones_like(y))
    assert torch.equal(view.grad, xc.grad)


def test_cuda_refuses_a_misaligned_view_naming_it(cuda):
    cu, cu_padded = layout(cuda)
    tokens = int(cu_padded[-1])
    q = torch.randn(tokens, 4, 64, dtype=torch.bfloat16, device=cuda)
    wide = torch.randn(tokens, 2, 68, dtype=torch.bfloat16, device=cuda)
    k = wide[..., :64]  # head stride 68 elements: 136 bytes, not a multiple of 16
    with pytest.raises(ValueError, match=r"k.head_stride=68 is not a multiple of 8 elements \(16 bytes of bf16\)"):
        thdcp.attention(q, k, k, cu, cu_padded)


def test_transformers_rows_view_head_major_kv_without_a_copy():
    pytest.importorskip("transformers")
    from thdcp.integrations.transformers import _rows

    cache = torch.randn(1, 2, 20, 16)  # transformers' [B, H, S, D]
    rows = _rows(cache.transpose(1, 2))  # [B, S, H, D] as THD rows
    assert rows.shape == (20, 2, 16) and rows.stride() == (16, 320, 1)
    assert rows.data_ptr() == cache.data_ptr()
