"""thdcp.attention against a float64 PyTorch reference: forward, LSE, max_logit and
gradients on small varlen batches (every mask kind, GQA, padding rows, zero-length
documents), packed-QKV views, torch.compile(fullgraph=True), CUDA graph capture and replay on
a new packing, and bad input."""
import math
import random

import pytest
import torch

import thdcp
from reference import attention_reference, make_layout

WINDOWS = [(-1, 0), (-1, -1), (7, 0), (5, 3)]


def dtype_for(device):
    return torch.bfloat16 if device == "cuda" else torch.float32


def tolerance(dtype):
    # bf16 storage: inputs are exact, outputs rounded once; fp32 accumulation in the kernels.
    return (2e-2, 2e-2) if dtype == torch.bfloat16 else (2e-3, 2e-3) if dtype == torch.float16 else (1e-5, 1e-5)


def batch(device, lengths, hq, hkv, d, dtype, pad_to=8, extra_padding=3, placeholders=1, seed=0):
    cu, cu_padded = make_layout(lengths, pad_to=pad_to, extra_padding=extra_padding, placeholders=placeholders)
    tokens = int(cu_padded[-1])
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, hq, d, generator=g).to(dtype)
    k = torch.randn(tokens, hkv, d, generator=g).to(dtype)
    v = torch.randn(tokens, hkv, d, generator=g).to(dtype)
    return [t.to(device) for t in (q, k, v, cu, cu_padded)]


def padding_rows(cu, cu_padded):
    rows = []
    for b in range(len(cu) - 1):
        rows += list(range(int(cu_padded[b]) + int(cu[b + 1] - cu[b]), int(cu_padded[b + 1])))
    return rows


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (4, 1)])
def test_forward_and_backward_match_the_float64_reference(device, window, hq, hkv):
    dtype = dtype_for(device)
    lengths = [37, 1, 0, 64, 13]
    q, k, v, cu, cu_padded = batch(device, lengths, hq, hkv, 64, dtype)
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    out, lse, max_logit = thdcp.attention(q, k, v, cu, cu_padded, window=window, return_lse=True,
                                          return_max_logit=True)
    ref_q, ref_k, ref_v = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_out, ref_lse = attention_reference(ref_q, ref_k, ref_v, cu.cpu(), cu_padded.cpu(), window)
    rtol, atol = tolerance(dtype)
    torch.testing.assert_close(out.double(), ref_out.detach(), rtol=rtol, atol=atol)
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse.double()[finite], ref_lse.detach()[finite], rtol=1e-4, atol=1e-4)
    assert torch.all(torch.isinf(lse[~finite.to(lse.device)]) & (lse[~finite.to(lse.device)] < 0))
    pad = padding_rows(cu.cpu(), cu_padded.cpu())
    assert pad, "the batch has padding rows"
    assert torch.count_nonzero(out[pad]) == 0, "padding rows of out are 0"
    # max_logit: max over allowed pairs of the scaled score, per head.
    scale = 1.0 / math.sqrt(64)
    expected_max = torch.full((hq,), -math.inf, dtype=torch.float64)
    qd, kd = q.detach().double().cpu(), k.detach().double().cpu().repeat_interleave(hq // hkv, 1)
    for b in range(len(lengths)):
        n, s = lengths[b], int(cu_padded[b])
        if n == 0:
            continue
        scores = torch.einsum("ihd,jhd->hij", qd[s:s + n], kd[s:s + n]) * scale
        i, j = torch.arange(n).view(n, 1), torch.arange(n).view(1, n)
        allowed = torch.ones(n, n, dtype=torch.bool)
        if window[0] >= 0:
            allowed &= j >= i - window[0]
        if window[1] >= 0:
            allowed &= j <= i + window[1]
        expected_max = torch.maximum(expected_max, scores.masked_fill(~allowed, -math.inf).amax(dim=(1, 2)))
    torch.testing.assert_close(max_logit.double().cpu(), expected_max, rtol=1e-4, atol=1e-4)

    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(dtype).to(device)
    dout[pad] = 0
    out.backward(dout)
    ref_out.backward(dout.double().cpu().to(ref_out.device))
    for name, got, want in (("dq", q.grad, ref_q.grad), ("dk", k.grad, ref_k.grad), ("dv", v.grad, ref_v.grad)):
        torch.testing.assert_close(got.double(), want, rtol=rtol, atol=atol * 4, msg=lambda m: name + ": " + m)
    assert torch.count_nonzero(k.grad[pad]) == 0 and torch.count_nonzero(v.grad[pad]) == 0


def test_cpu_fp32_backward_passes_gradcheck_against_float64():
    # The reference backend in fp32 against the float64 formula: the autograd wiring
    # (setup_context, saved tensors, the op's gradient order) is what is tested.
    q, k, v, cu, cu_padded = batch("cpu", [9, 4], 2, 1, 8, torch.float32, pad_to=2, extra_padding=1)
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    loss = (thdcp.attention(q, k, v, cu, cu_padded) ** 2).sum()
    loss.backward()
    rq, rk, rv = (t.detach().double().requires_grad_() for t in (q, k, v))
    (attention_reference(rq, rk, rv, cu, cu_padded, (-1, 0))[0] ** 2).sum().backward()
    for got, want in ((q.grad, rq.grad), (k.grad, rk.grad), (v.grad, rv.grad)):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_packed_qkv_views_give_the_bits_of_contiguous_copies(device):
    dtype = dtype_for(device)
    hq, hkv, d = 4, 2, 64
    cu, cu_padded = make_layout([30, 17, 50], pad_to=8, extra_padding=2)
    tokens = int(cu_padded[-1])
    qkv = torch.randn(tokens, hq + 2 * hkv, d, generator=torch.Generator().manual_seed(3)).to(dtype).to(device)
    cu, cu_padded = cu.to(device), cu_padded.to(device)
    qkv.requires_grad_()
    q, k, v = qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:]
    assert not q.is_contiguous()
    out = thdcp.attention(q, k, v, cu, cu_padded)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(4)).to(dtype).to(device)
    out.backward(dout)
    qc, kc, vc = (t.detach().contiguous().requires_grad_() for t in (q, k, v))
    out_c = thdcp.attention(qc, kc, vc, cu, cu_padded)
    out_c.backward(dout)
    assert torch.equal(out, out_c)
    assert torch.equal(qkv.grad[:, :hq], qc.grad)
    assert torch.equal(qkv.grad[:, hq:hq + hkv], kc.grad)
    assert torch.equal(qkv.grad[:, hq + hkv:], vc.grad)


def test_compile_fullgraph_traces_forward_and_backward(device):
    dtype = dtype_for(device)
    q, k, v, cu, cu_padded = batch(device, [20, 33], 4, 2, 64, dtype)

    def f(q, k, v):
        out, lse = thdcp.attention(q, k, v, cu, cu_padded, window=(16, 0), return_lse=True)
        return (out.float() ** 2).sum() + torch.where(torch.isfinite(lse), lse, 0.0).sum() * 1e-3

    # aot_eager on the CPU (no C++ codegen in CI); inductor on the GPU.
    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(f, fullgraph=True, backend=backend)
    inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    loss = compiled(*inputs)
    loss.backward()
    eager_inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    eager_loss = f(*eager_inputs)
    eager_loss.backward()
    torch.testing.assert_close(loss, eager_loss, rtol=1e-3, atol=1e-3)
    for got, want in zip(inputs, eager_inputs):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-2, atol=1e-2)
    explanation = torch._dynamo.explain(f)(q, k, v)
    assert explanation.graph_break_count == 0, explanation.break_reasons


def test_cuda_graph_replays_a_new_packing_equal_to_eager(cuda):
    # One capacity (max_seqs sequences, T rows): captured on one packing, replayed on another.
    hq, hkv, d, max_seqs = 8, 2, 128, 6
    tokens = 512
    rng = random.Random(5)

    def layout(lengths):
        cu, cu_padded = make_layout(lengths, pad_to=2, placeholders=max_seqs - len(lengths))
        cu_padded[-1] = tokens  # the last placeholder absorbs the rest of the capacity
        cu[-1] = cu[-2]
        return cu, cu_padded

    static = {
        "q": torch.zeros(tokens, hq, d, dtype=torch.bfloat16, device="cuda", requires_grad=True),
        "k": torch.zeros(tokens, hkv, d, dtype=torch.bfloat16, device="cuda", requires_grad=True),
        "v": torch.zeros(tokens, hkv, d, dtype=torch.bfloat16, device="cuda", requires_grad=True),
        "dout": torch.zeros(tokens, hq, d, dtype=torch.bfloat16, device="cuda"),
        "cu": torch.zeros(max_seqs + 1, dtype=torch.int32, device="cuda"),
        "cu_padded": torch.zeros(max_seqs + 1, dtype=torch.int32, device="cuda"),
    }

    def step():
        out = thdcp.attention(static["q"], static["k"], static["v"], static["cu"], static["cu_padded"],
                              window=(100, 0))
        grads = torch.autograd.grad(out, (static["q"], static["k"], static["v"]), static["dout"])
        return (out,) + grads

    def load(seed, lengths):
        g = torch.Generator().manual_seed(seed)
        cu, cu_padded = layout(lengths)
        with torch.no_grad():
            for name in ("q", "k", "v", "dout"):
                static[name].copy_(torch.randn(static[name].shape, generator=g).to(torch.bfloat16))
            static["cu"].copy_(cu)
            static["cu_padded"].copy_(cu_padded)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    load(1, [100, 200, 60])
    with torch.cuda.stream(side):
        step()  # warm-up
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for seed, lengths in ((2, [250, 3, 1, 150, 90]), (3, [511]), (4, [64] * 5)):
        load(seed, lengths)
        graph.replay()
        eager = step()
        for got, want in zip(captured, eager):
            assert torch.equal(got, want), "replay equals eager bit for bit (lengths %s)" % lengths


def test_bad_input_raises_value_errors_naming_the_argument(device):
    dtype = dtype_for(device)
    q, k, v, cu, cu_padded = batch(device, [10, 6], 4, 2, 64, dtype)
    with pytest.raises(ValueError, match="window"):
        thdcp.attention(q, k, v, cu, cu_padded, window=(-2, 0))
    with pytest.raises(ValueError, match="cu_seqlens has dtype"):
        thdcp.attention(q, k, v, cu.long(), cu_padded)
    with pytest.raises(ValueError, match="q has 2 dimensions"):
        thdcp.attention(q[:, 0], k, v, cu, cu_padded)
    with pytest.raises(ValueError, match="softmax_scale"):
        thdcp.attention(q, k, v, cu, cu_padded, softmax_scale=-1.0)
    with pytest.raises(ValueError, match="q has dtype"):
        thdcp.attention(q.to(torch.float64), k, v, cu, cu_padded)
    with pytest.raises(ValueError):  # heads: Hq not a multiple of Hkv
        thdcp.attention(q[:, :3], k, v, cu, cu_padded)
    if device == "cuda":
        with pytest.raises(ValueError, match="cu_seqlens is on cpu"):
            thdcp.attention(q, k, v, cu.cpu(), cu_padded)
        with pytest.raises(ValueError, match="CUDA backend takes"):
            thdcp.attention(q.float(), k.float(), v.float(), cu, cu_padded)
