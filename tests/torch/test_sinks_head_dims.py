"""thdcp.attention with attention sinks (sinks=, gpt-oss) and a value head dim of its own
(D_v = v.shape[-1], MLA's 192/128): forward, LSE and gradients (d(sinks) included) against
the float64 reference of reference.py (softmax over the scores with the sink column appended,
the column dropped before the values), whose own gradient is checked by finite differences;
GQA, causal, full and windowed masks; torch.compile and fake tensors (out [T, Hq, D_v],
dsinks [Hq]); bad sinks refused by name; FlashAttention 4's learnable_sink. The CUDA cases
compare the CUDA backend with the CPU backend in bf16, check head dims 96, 192/128 and 256
against the float64 reference and a pair without kernels refused by name (they run on the GPU
machine)."""
import math

import pytest
import torch

import thdcp
from reference import assert_close_to_reference, attention_reference, make_layout

WINDOWS = [(-1, 0), (-1, -1), (7, 0), (5, 3)]
LENGTHS = [37, 1, 0, 20, 13]
FP32 = (1e-5, 1e-5)
BF16 = (2e-2, 2e-2)  # the CUDA pytest cases' bf16 tolerance (test_attention.py)


def inputs(lengths, hq, hkv, d_qk, d_v, dtype=torch.float32, seed=0, device="cpu"):
    cu, cu_padded = make_layout(lengths, pad_to=8, extra_padding=3, placeholders=1)
    tokens = int(cu_padded[-1])
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, hq, d_qk, generator=g).to(dtype)
    k = torch.randn(tokens, hkv, d_qk, generator=g).to(dtype)
    v = torch.randn(tokens, hkv, d_v, generator=g).to(dtype)
    sinks = torch.randn(hq, generator=g) * 2.0  # float32 whatever the inputs' dtype
    dout = torch.randn(tokens, hq, d_v, generator=g).to(dtype)
    return [t.to(device) for t in (q, k, v, sinks, dout, cu, cu_padded)]


def run(q, k, v, sinks, dout, cu, cu_padded, window, with_sinks=True):
    """thdcp.attention's out, lse and (dq, dk, dv, dsinks) for the loss sum(out * dout)."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, sinks)]
    out, lse = thdcp.attention(*leaves[:3], cu, cu_padded, window=window, return_lse=True,
                               sinks=leaves[3] if with_sinks else None)
    out.backward(dout)
    return out.detach(), lse, [t.grad for t in leaves]


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("d_qk,d_v", [(64, 64), (32, 16), (16, 48)])
def test_cpu_sinks_and_value_head_dims_match_the_float64_reference(window, hq, hkv, d_qk, d_v):
    q, k, v, sinks, dout, cu, cu_padded = inputs(LENGTHS, hq, hkv, d_qk, d_v)
    out, lse, grads = run(q, k, v, sinks, dout, cu, cu_padded, window)
    assert out.shape == (q.shape[0], hq, d_v)
    ref = [t.double().requires_grad_() for t in (q, k, v, sinks)]
    ref_out, ref_lse = attention_reference(*ref[:3], cu, cu_padded, window, sinks=ref[3])
    ref_out.backward(dout.double())
    torch.testing.assert_close(out.double(), ref_out.detach(), rtol=1e-5, atol=1e-5)
    # lse includes the sink: finite on every valid row, -inf on padding rows.
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse.double()[finite], ref_lse.detach()[finite], rtol=1e-5, atol=1e-5)
    assert torch.all(torch.isneginf(lse[~finite]))
    for name, got, want in zip(("dq", "dk", "dv", "dsinks"), grads, (t.grad for t in ref)):
        assert got.dtype == torch.float32 and got.shape == want.shape, name
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4, msg=lambda m: name + ": " + m)


def test_mla_head_dims_192_and_128_with_sinks_on_the_cpu():
    window = (-1, 0)
    q, k, v, sinks, dout, cu, cu_padded = inputs([9, 0, 14], 2, 1, 192, 128, seed=4)
    out, lse, grads = run(q, k, v, sinks, dout, cu, cu_padded, window)
    ref = [t.double().requires_grad_() for t in (q, k, v, sinks)]
    ref_out, _ = attention_reference(*ref[:3], cu, cu_padded, window, sinks=ref[3])
    ref_out.backward(dout.double())
    assert out.shape[-1] == 128 and grads[0].shape[-1] == 192 and grads[2].shape[-1] == 128
    torch.testing.assert_close(out.double(), ref_out.detach(), rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, (t.grad for t in ref)):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_the_references_gradient_with_sinks_passes_gradcheck_in_float64():
    # The reference's d(sinks), dq, dk, dv against finite differences (the CPU backend has no
    # float64 storage, so thdcp is compared with the reference's autograd above).
    q, k, v, sinks, _, cu, cu_padded = inputs([5, 3], 2, 1, 8, 16, seed=2)
    leaves = [t.double().requires_grad_() for t in (q, k, v, sinks)]

    def f(q, k, v, sinks):
        return attention_reference(q, k, v, cu, cu_padded, (2, 0), sinks=sinks)[0]

    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-6)


def test_sinks_change_the_result_and_a_sink_of_minus_infinity_is_none():
    q, k, v, sinks, dout, cu, cu_padded = inputs([30, 11], 4, 2, 32, 32, seed=5)
    plain, plain_lse, plain_grads = run(q, k, v, sinks, dout, cu, cu_padded, (-1, 0), with_sinks=False)
    with_sinks, _, _ = run(q, k, v, sinks, dout, cu, cu_padded, (-1, 0))
    assert (plain - with_sinks).abs().max() > 1e-2, "a sink takes probability away from the keys"
    none, none_lse, none_grads = run(q, k, v, torch.full_like(sinks, -math.inf), dout, cu, cu_padded, (-1, 0))
    torch.testing.assert_close(none, plain, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(none_lse, plain_lse, rtol=1e-6, atol=1e-6)
    for got, want in zip(none_grads[:3], plain_grads[:3]):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert torch.count_nonzero(none_grads[3]) == 0, "a sink of -inf takes no probability, so its gradient is 0"
    assert plain_grads[3] is None, "no sinks, no gradient"


def test_compile_fullgraph_and_fake_tensors_give_out_with_d_v_and_dsinks_with_hq():
    q, k, v, sinks, dout, cu, cu_padded = inputs([20, 33], 4, 2, 32, 16, seed=6)

    def f(q, k, v, sinks):
        out = thdcp.attention(q, k, v, cu, cu_padded, window=(16, 0), sinks=sinks)
        return (out * dout).sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, sinks)]
    compiled(*leaves).backward()
    eager = [t.detach().clone().requires_grad_() for t in (q, k, v, sinks)]
    f(*eager).backward()
    for got, want in zip(leaves, eager):
        assert got.grad.shape == want.shape
        torch.testing.assert_close(got.grad, want.grad, rtol=0, atol=0)
    # The fake implementations alone (all-meta inputs).
    meta = [t.to("meta") for t in (q, k, v, sinks, dout, cu, cu_padded)]
    out, lse = thdcp.attention(*meta[:3], meta[5], meta[6], sinks=meta[3], return_lse=True)
    assert out.shape == (q.shape[0], 4, 16) and lse.shape == (4, q.shape[0])
    grads = torch.ops.thdcp.attention_backward(meta[4], meta[0], meta[1], meta[2], out, lse, meta[5], meta[6], 16, 0,
                                               0.0, True, meta[3])
    assert [tuple(g.shape) for g in grads] == [tuple(q.shape), tuple(k.shape), tuple(v.shape), (4,)]
    assert grads[3].dtype == torch.float32


@pytest.mark.parametrize("bad,message", [
    (lambda s: s.double(), r"sinks has dtype torch.float64: pass a torch.float32 tensor \(sinks.float\(\)\)"),
    (lambda s: s.bfloat16(), r"sinks has dtype torch.bfloat16"),
    (lambda s: s[:3], r"sinks has shape \(3,\) but q has 4 query heads: pass one logit per query head, shape \(4,\)"),
    (lambda s: s.view(2, 2), r"sinks has shape \(2, 2\)"),
    (lambda s: s.to("meta"), r"sinks is on meta but q is on cpu: move sinks to cpu"),
    (lambda s: s.tolist(), r"sinks='list' is not a tensor"),
])
def test_bad_sinks_are_refused_naming_the_argument_its_value_and_the_fix(bad, message):
    q, k, v, sinks, _, cu, cu_padded = inputs([10, 6], 4, 2, 16, 16)
    with pytest.raises(ValueError, match=message):
        thdcp.attention(q, k, v, cu, cu_padded, sinks=bad(sinks))


def test_bad_sinks_reaching_the_operator_directly_are_refused_by_the_cpp_checks():
    q, k, v, sinks, _, cu, cu_padded = inputs([10, 6], 4, 2, 16, 16)
    with pytest.raises(ValueError, match=r"sinks has shape \[3\]; pass one logit per query head: shape \[4\]"):
        torch.ops.thdcp.attention_forward(q, k, v, cu, cu_padded, -1, 0, 0.0, False, sinks[:3])
    with pytest.raises(ValueError, match="sinks is not contiguous"):
        torch.ops.thdcp.attention_forward(q, k, v, cu, cu_padded, -1, 0, 0.0, False,
                                          torch.zeros(8)[::2])
    with pytest.raises(ValueError, match="sinks has dtype Half"):
        torch.ops.thdcp.attention_forward(q, k, v, cu, cu_padded, -1, 0, 0.0, False, sinks.half())


def test_non_contiguous_sinks_pass_as_a_copy_and_get_their_gradient():
    q, k, v, _, dout, cu, cu_padded = inputs([10, 6], 4, 2, 16, 16)
    base = torch.randn(8, generator=torch.Generator().manual_seed(9)).requires_grad_()
    out = thdcp.attention(q, k, v, cu, cu_padded, sinks=base[::2])
    out.backward(dout)
    ref = base.detach().double()[::2].requires_grad_()
    attention_reference(q, k, v, cu, cu_padded, (-1, 0), sinks=ref)[0].backward(dout.double())
    torch.testing.assert_close(base.grad[::2].double(), ref.grad, rtol=1e-4, atol=1e-4)
    assert torch.count_nonzero(base.grad[1::2]) == 0


def test_flash_attn_varlen_func_learnable_sink_is_thdcp_attention_with_sinks():
    q, k, v, sinks, dout, cu, _ = inputs([12, 7, 30], 4, 2, 32, 32, seed=8)
    cu = torch.tensor([0, 12, 19, 49], dtype=torch.int32)
    q, k, v = q[:49], k[:49], v[:49]
    a = [t.detach().clone().requires_grad_() for t in (q, k, v, sinks)]
    out = thdcp.flash_attn_varlen_func(*a[:3], cu, cu, 30, 30, causal=True, learnable_sink=a[3])
    out.backward(dout[:49])
    b = [t.detach().clone().requires_grad_() for t in (q, k, v, sinks)]
    want = thdcp.attention(*b[:3], cu, window=(-1, 0), sinks=b[3])
    want.backward(dout[:49])
    assert torch.equal(out, want)
    for got, expected in zip(a, b):
        assert torch.equal(got.grad, expected.grad)
    with pytest.raises(ValueError, match="flash_attn_varlen_func: learnable_sink has dtype torch.float64"):
        thdcp.flash_attn_varlen_func(q, k, v, cu, cu, 30, 30, causal=True, learnable_sink=sinks.double())


def test_cp_attention_fake_shapes_and_bad_sinks_refused_before_a_communicator():
    # cp_attention runs on CUDA only; its fake implementations and argument checks run anywhere.
    q, k, v, sinks, dout, cu, cu_padded = inputs([12, 20], 4, 2, 32, 16)
    meta = [t.to("meta") for t in (q, k, v, sinks, dout, cu, cu_padded)]
    out, lse, max_logit = torch.ops.thdcp.cp_attention_forward(*meta[:3], meta[5], meta[6], 0, -1, 0, 0.0, True,
                                                               meta[3])
    assert out.shape == (q.shape[0], 4, 16) and lse.shape == (4, q.shape[0]) and max_logit.shape == (4,)
    grads = torch.ops.thdcp.cp_attention_backward(meta[4], *meta[:3], out, lse, meta[5], meta[6], 0, -1, 0, 0.0,
                                                  meta[3])
    assert [tuple(g.shape) for g in grads] == [tuple(q.shape), tuple(k.shape), tuple(v.shape), (4,)]
    no_sinks = torch.ops.thdcp.cp_attention_backward(meta[4], *meta[:3], out, lse, meta[5], meta[6], 0, -1, 0, 0.0)
    assert tuple(no_sinks[3].shape) == (0,)
    with pytest.raises(ValueError, match=r"thdcp.cp_attention: sinks has shape \(3,\) but q has 4 query heads"):
        thdcp.cp_attention(q, k, v, cu, cu_padded, sinks=sinks[:3])


# ---- CUDA against the CPU backend (bf16), on the GPU machine ----


@pytest.mark.parametrize("window", [(-1, 0), (-1, -1), (7, 0)])
@pytest.mark.parametrize("hq,hkv,d", [(4, 4, 64), (8, 2, 128), (4, 1, 64)])
def test_cuda_sinks_match_the_cpu_backend_in_bf16(cuda, window, hq, hkv, d):
    cpu = inputs(LENGTHS, hq, hkv, d, d, dtype=torch.bfloat16, seed=11)
    gpu = [t.to(cuda) for t in cpu]
    want_out, want_lse, want_grads = run(*cpu, window)
    out, lse, grads = run(*gpu, window)
    rtol, atol = BF16
    torch.testing.assert_close(out.cpu().float(), want_out.float(), rtol=rtol, atol=atol)
    finite = torch.isfinite(want_lse)
    torch.testing.assert_close(lse.cpu()[finite], want_lse[finite], rtol=1e-3, atol=1e-3)
    assert torch.all(torch.isneginf(lse.cpu()[~finite]))
    for name, got, want in zip(("dq", "dk", "dv", "dsinks"), grads, want_grads):
        assert got.dtype == want.dtype, name
        torch.testing.assert_close(got.cpu().float(), want.float(), rtol=rtol, atol=atol * 4,
                                   msg=lambda m: name + ": " + m)


@pytest.mark.parametrize("window", [(-1, 0), (7, 0)])
@pytest.mark.parametrize("d_qk,d_v", [(96, 96), (192, 128), (256, 256)])
def test_cuda_head_dims_match_the_float64_reference(cuda, window, d_qk, d_v):
    """The CUDA kernels' head dims other than 64 and 128 (MLA's 192/128 among them), forward
    and backward, against the float64 reference (bf16 tolerances)."""
    q, k, v, _, dout, cu, cu_padded = inputs(LENGTHS, 4, 2, d_qk, d_v, dtype=torch.bfloat16, seed=d_qk + d_v,
                                             device=cuda)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = thdcp.attention(*leaves, cu, cu_padded, window=window)
    out.backward(dout)
    assert out.shape == (q.shape[0], 4, d_v)
    assert_close_to_reference(out.detach(), [t.grad for t in leaves], q, k, v, cu, cu_padded, window, dout)


@pytest.mark.parametrize("d_qk,d_v", [(128, 64), (32, 32)])
def test_cuda_refuses_a_head_dim_pair_without_kernels_naming_both(cuda, d_qk, d_v):
    q, k, v, _, _, cu, cu_padded = inputs([20, 9], 4, 2, d_qk, d_v, dtype=torch.bfloat16, device=cuda)
    with pytest.raises(ValueError, match=r"head_dim=%d \(q.shape\[-1\]\) with v_head_dim=%d \(v.shape\[-1\]\) is not "
                                         r"supported by the CUDA backend: it takes " % (d_qk, d_v)):
        thdcp.attention(q, k, v, cu, cu_padded)


def test_cuda_refuses_sinks_on_another_device(cuda):
    q, k, v, sinks, _, cu, cu_padded = inputs([20, 9], 4, 2, 64, 64, dtype=torch.bfloat16, device=cuda)
    with pytest.raises(ValueError, match="sinks is on cpu but q is on cuda:0: move sinks to cuda:0"):
        thdcp.attention(q, k, v, cu, cu_padded, sinks=sinks.cpu())
