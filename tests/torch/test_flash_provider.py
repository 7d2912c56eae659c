"""thdcp as PyTorch's flash-attention provider (issue 29): importing thdcp registers "thdcp" with
torch.nn.attention.register_flash_attention_impl and activates nothing; activation replaces
the CUDA kernels of aten::_flash_attention_forward / _backward and restore puts PyTorch's back.

On the CPU, where PyTorch has no flash kernel, the same kernels installed for the CPU key let
PyTorch's own varlen_attn (its custom op and autograd formula) run through thdcp: forward, LSE
and gradients equal thdcp.varlen_attn bit for bit. Calls thdcp does not take (dense, cross-
attention, dropout) go to the kernel that was there before, here a stand-in."""
import pytest
import torch
import torch.nn.attention as nn_attention
from torch.nn.attention.varlen import AuxRequest
from torch.nn.attention.varlen import varlen_attn as torch_varlen_attn

import thdcp
from reference import make_layout

provider = thdcp.flash_provider
pytestmark = pytest.mark.skipif(not provider.available(), reason="this PyTorch has no flash-attention provider hook")


def inputs(lengths=(37, 1, 64, 13), hq=4, hkv=2, d=32, dtype=torch.float32, device="cpu", seed=0):
    cu, _ = make_layout(list(lengths))
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(int(cu[-1]), h, d, generator=g).to(dtype).to(device) for h in (hq, hkv, hkv))
    return q, k, v, cu.to(device)


@pytest.fixture
def on_cpu():
    handle = provider.install("CPU")
    yield
    handle.remove()


def test_import_registers_the_provider_and_activates_nothing():
    assert "thdcp" in nn_attention.list_flash_attention_impls()
    assert nn_attention.current_flash_attention_impl() != "thdcp"


def test_activate_replaces_the_cuda_kernels_and_restore_puts_pytorchs_back():
    # Registration needs no GPU: the kernels are swapped in the dispatcher's table.
    def cuda_kernels():
        return [repr(torch.library.get_kernel(op, "CUDA")) for op in (provider._FORWARD, provider._BACKWARD)]

    before = cuda_kernels()
    nn_attention.activate_flash_attention_impl("thdcp")
    try:
        assert nn_attention.current_flash_attention_impl() == "thdcp"
        during = cuda_kernels()
        assert all("flash_provider.py" in kernel for kernel in during) and during != before
        nn_attention.activate_flash_attention_impl("thdcp")  # again: PyTorch restores first
    finally:
        nn_attention.restore_flash_attention_impl()
    assert nn_attention.current_flash_attention_impl() is None
    assert cuda_kernels() == before


@pytest.mark.parametrize("window_size", [(-1, -1), (-1, 0), (6, 0), (4, 2)])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 1)])
def test_pytorchs_varlen_attn_through_the_provider_is_thdcp_varlen_attn_bit_for_bit(on_cpu, window_size, hq, hkv):
    q, k, v, cu = inputs(hq=hq, hkv=hkv)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = torch_varlen_attn(*leaves, cu, cu, 64, 64, window_size=window_size, return_aux=AuxRequest(lse=True))
    same = [t.clone().requires_grad_() for t in (q, k, v)]
    want, want_lse = thdcp.varlen_attn(*same, cu, cu, 64, 64, window_size=window_size,
                                       return_aux=AuxRequest(lse=True))
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    for got, expected in zip(torch.autograd.grad(out, leaves, dout), torch.autograd.grad(want, same, dout)):
        assert torch.equal(got, expected)


def test_scale_and_is_causal_reach_thdcp(on_cpu):
    q, k, v, cu = inputs()
    out = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, 64, 64, 0.0, True, False, scale=0.2,
                                                  window_size_left=5)[0]
    assert torch.equal(out, thdcp.attention(q, k, v, cu, window=(5, 0), softmax_scale=0.2))


@pytest.mark.parametrize("name,value", [("alibi_slopes", torch.ones(4)),
                                        ("seqused_k", torch.ones(4, dtype=torch.int32))])
def test_arguments_the_backward_cannot_see_are_refused_by_name(on_cpu, name, value):
    q, k, v, cu = inputs()
    with pytest.raises(ValueError) as error:
        torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, 64, 64, 0.0, True, False, **{name: value})
    assert str(error.value).startswith("thdcp.flash_provider: %s=" % name)
    assert "restore_flash_attention_impl" in str(error.value)


def test_calls_thdcp_does_not_take_go_to_the_kernel_that_was_there():
    # A stand-in for PyTorch's kernel on the CPU key, then thdcp over it.
    seen = []

    def stand_in(*args, **kwargs):
        seen.append(args[3] is None)
        q = args[0]
        return (q.new_full(q.shape, 7.0), q.new_zeros((q.shape[-2], q.shape[0]), dtype=torch.float32),
                torch.zeros(2, dtype=torch.uint64), torch.zeros((), dtype=torch.uint64), q.new_empty(0))

    stand_in_library = torch.library.Library("aten", "IMPL", "CPU")  # noqa: TOR901
    stand_in_library.impl("_flash_attention_forward", stand_in, "CPU")
    handle = provider.install("CPU")
    try:
        q, k, v, cu = inputs()
        forward = torch.ops.aten._flash_attention_forward
        assert torch.equal(forward(q, k, v, cu, cu, 64, 64, 0.0, True, False)[0],
                           thdcp.attention(q, k, v, cu, window=(-1, 0)))
        for call in (lambda: forward(q, k, v, cu, cu.clone(), 64, 64, 0.0, True, False),  # another layout tensor
                     lambda: forward(q, k, v, cu, cu, 64, 64, 0.1, True, False),  # dropout
                     lambda: forward(q, k[:-3], v[:-3], cu, cu, 64, 64, 0.0, True, False),  # other key rows
                     lambda: forward(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), None, None, 64, 64, 0.0, True,
                                     False)):  # dense
            assert torch.all(call()[0] == 7.0)
        assert seen == [False, False, False, True]
    finally:
        handle.remove()
        stand_in_library._destroy()
    assert provider.declined(q, k, cu, cu, 0.0) is None


def test_activated_provider_runs_varlen_attn_through_thdcp_on_cuda(cuda):
    q, k, v, cu = inputs(lengths=(300, 1, 77, 512), hq=8, hkv=2, d=128, dtype=torch.bfloat16, device="cuda")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    same = [t.clone().requires_grad_() for t in (q, k, v)]
    dense = torch.randn(2, 8, 256, 128, dtype=torch.bfloat16, device="cuda")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        dense_before = torch.nn.functional.scaled_dot_product_attention(dense, dense, dense, is_causal=True)
    nn_attention.activate_flash_attention_impl("thdcp")
    try:
        out, lse = torch_varlen_attn(*leaves, cu, cu, 512, 512, window_size=(-1, 0), return_aux=AuxRequest(lse=True))
        want, want_lse = thdcp.varlen_attn(*same, cu, cu, 512, 512, window_size=(-1, 0),
                                           return_aux=AuxRequest(lse=True))
        assert torch.equal(out, want) and torch.equal(lse, want_lse)
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16).cuda()
        for got, expected in zip(torch.autograd.grad(out, leaves, dout), torch.autograd.grad(want, same, dout)):
            assert torch.equal(got, expected)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # dense SDPA keeps PyTorch's kernel
            dense_during = torch.nn.functional.scaled_dot_product_attention(dense, dense, dense, is_causal=True)
        assert torch.equal(dense_during, dense_before)
    finally:
        nn_attention.restore_flash_attention_impl()
