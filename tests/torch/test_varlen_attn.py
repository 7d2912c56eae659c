"""thdcp.varlen_attn, PyTorch's varlen_attn call shape (issue 29): the bits of thdcp.attention
with the translated arguments (forward, LSE, gradients), the float64 reference, the LSE layout
of PyTorch's own varlen_attn, GQA, windows (full by default, causal as (-1, 0)), what is
refused, torch.compile, and PyTorch's own varlen_attn on CUDA."""
import pytest
import torch
from torch.nn.attention.varlen import AuxRequest
from torch.nn.attention.varlen import varlen_attn as torch_varlen_attn

import thdcp
from reference import assert_close_to_reference, make_layout

# (window_size passed to varlen_attn or None for its default, thdcp's window)
WINDOWS = [(None, (-1, -1)), ((-1, 0), (-1, 0)), ((7, 0), (7, 0)), ((5, 3), (5, 3)), ((-4, 2), (-1, 2))]


def inputs(device, lengths, hq, hkv, d, dtype, seed=0):
    cu, _ = make_layout(lengths)
    tokens = int(cu[-1])
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(tokens, h, d, generator=g).to(dtype).to(device) for h in (hq, hkv, hkv))
    return q, k, v, cu.to(device)


def dtype_for(device):
    return torch.bfloat16 if device == "cuda" else torch.float32


@pytest.mark.parametrize("window_size,window", WINDOWS)
@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (4, 1)])
def test_varlen_attn_is_thdcp_attention_bit_for_bit_and_matches_the_reference(device, window_size, window, hq, hkv):
    dtype = dtype_for(device)
    lengths = [37, 1, 64, 13]
    q, k, v, cu = inputs(device, lengths, hq, hkv, 64, dtype)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    kwargs = {} if window_size is None else {"window_size": window_size}
    out, lse = thdcp.varlen_attn(*leaves, cu, cu, max(lengths), max(lengths), return_aux=AuxRequest(lse=True), **kwargs)
    same = [t.clone().requires_grad_() for t in (q, k, v)]
    want, want_lse = thdcp.attention(*same, cu, window=window, return_lse=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    assert lse.shape == (hq, q.shape[0]) and lse.dtype == torch.float32
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype).to(device)
    grads = torch.autograd.grad(out, leaves, dout)
    for got, expected in zip(grads, torch.autograd.grad(want, same, dout)):
        assert torch.equal(got, expected)
    # Against the float64 reference (fp32 on the CPU, bf16 on the GPU).
    ref_lse = assert_close_to_reference(out, grads, q, k, v, cu, cu, window, dout)
    torch.testing.assert_close(lse.double().cpu(), ref_lse.detach(), rtol=1e-4, atol=1e-4)


def test_varlen_attn_returns_what_pytorchs_varlen_attn_returns_in_shape_and_type():
    # PyTorch's varlen_attn on meta tensors gives the shapes its CUDA kernel returns: lse is
    # [H, T] (its docstring says (T, H); the kernel and the fake implementation say otherwise).
    q, k, v, cu = inputs("cpu", [5, 9, 3], 4, 2, 16, torch.float32)
    meta = [t.to("meta") for t in (q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16), cu)]
    torch_out, torch_lse = torch_varlen_attn(*meta, meta[3], 9, 9, return_aux=AuxRequest(lse=True))
    out, lse = thdcp.varlen_attn(q, k, v, cu, cu, 9, 9, return_aux=AuxRequest(lse=True))
    assert out.shape == torch_out.shape and lse.shape == torch_lse.shape and lse.dtype == torch_lse.dtype
    assert isinstance(thdcp.varlen_attn(q, k, v, cu, cu, 9, 9), torch.Tensor)
    assert isinstance(thdcp.varlen_attn(q, k, v, cu, cu, 9, 9, return_aux=AuxRequest(lse=False)), torch.Tensor)
    # A copy of cu_seq_q with the same values is the same layout (compared on the host).
    assert torch.equal(thdcp.varlen_attn(q, k, v, cu, cu.clone(), 9, 9), thdcp.varlen_attn(q, k, v, cu, cu, 9, 9))


@pytest.mark.parametrize("call,name", [
    (lambda q, k, v, cu: thdcp.varlen_attn(q, k, v, cu, torch.tensor([0, 4, 14, 17], dtype=torch.int32), 9, 9),
     "cu_seq_k differs from cu_seq_q"),
    (lambda q, k, v, cu: thdcp.varlen_attn(q, k[:-1], v[:-1], cu, cu, 9, 9), "query has 17 rows but key has 16"),
    (lambda q, k, v, cu: thdcp.varlen_attn(q, k, v, cu, cu, 9.5, 9), "max_q=9.5"),
    (lambda q, k, v, cu: thdcp.varlen_attn(q, k, v, cu, cu, 9, -1), "max_k=-1"),
    (lambda q, k, v, cu: thdcp.varlen_attn(q, k, v, cu, cu, 9, 9, window_size=(3,)), "window_size="),
    (lambda q, k, v, cu: thdcp.varlen_attn(q, k, v, cu, cu, 9, 9, window_size=(1.5, 0)), "window_size[0]=1.5"),
    (lambda q, k, v, cu: thdcp.varlen_attn(q, k, v, cu, cu, 9, 9, return_aux=True), "return_aux=True"),
    (lambda q, k, v, cu: thdcp.varlen_attn(q, k, v, cu, cu, 9, 9, scale=-1.0), "softmax_scale=-1.0"),
])
def test_varlen_attn_refuses_naming_the_argument(call, name):
    q, k, v, cu = inputs("cpu", [5, 9, 3], 4, 2, 16, torch.float32)
    with pytest.raises(ValueError) as error:
        call(q, k, v, cu)
    assert str(error.value).startswith("thdcp.") and name in str(error.value), str(error.value)


def test_varlen_attn_traces_under_compile_with_one_layout_tensor():
    q, k, v, cu = inputs("cpu", [20, 33], 4, 2, 32, torch.float32)

    def f(q, k, v):
        out, lse = thdcp.varlen_attn(q, k, v, cu, cu, 33, 33, window_size=(16, 0), return_aux=AuxRequest(lse=True))
        return out.square().sum() + lse.sum() * 1e-3

    explanation = torch._dynamo.explain(f)(q, k, v)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(*leaves)
    compiled.backward()
    eager_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    eager = f(*eager_leaves)
    eager.backward()
    torch.testing.assert_close(compiled, eager)
    for got, want in zip(leaves, eager_leaves):
        torch.testing.assert_close(got.grad, want.grad)
    # Two layout tensors cannot be compared while tracing: refused, naming what to pass.
    other = cu.clone()
    with pytest.raises(Exception, match="pass the same tensor for both"):
        torch.compile(lambda q: thdcp.varlen_attn(q, k, v, cu, other, 33, 33), fullgraph=True,
                      backend="aot_eager")(q)


@pytest.mark.parametrize("window_size", [(-1, -1), (-1, 0), (100, 0)])
def test_varlen_attn_matches_pytorchs_varlen_attn_on_cuda(cuda, window_size):
    # PyTorch's varlen_attn runs FlashAttention 2 on CUDA only; compared within bf16 rounding.
    lengths = [300, 1, 77, 512]
    q, k, v, cu = inputs("cuda", lengths, 8, 2, 128, torch.bfloat16)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = thdcp.varlen_attn(*leaves, cu, cu, 512, 512, window_size=window_size, return_aux=AuxRequest(lse=True))
    torch_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    torch_out, torch_lse = torch_varlen_attn(*torch_leaves, cu, cu, 512, 512, window_size=window_size,
                                             return_aux=AuxRequest(lse=True))
    assert lse.shape == torch_lse.shape
    torch.testing.assert_close(out, torch_out, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lse, torch_lse, rtol=1e-3, atol=1e-3)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16).cuda()
    for got, want in zip(torch.autograd.grad(out, leaves, dout), torch.autograd.grad(torch_out, torch_leaves, dout)):
        torch.testing.assert_close(got, want, rtol=3e-2, atol=3e-2)
