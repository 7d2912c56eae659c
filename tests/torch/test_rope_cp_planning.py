"""thdcp.rope (against a float64 reference, under CP splits, autograd), the CP helpers
(split/merge round trip, cp_attention at cp = 1 over NCCL equal to thdcp.attention), the
planner and the GraphBank (counters; replays equal eager)."""
import random

import pytest
import torch

import thdcp
from reference import attention_reference, make_layout, rope_reference


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [0, 32])
def test_rope_matches_the_reference_and_its_backward_is_the_inverse(device, interleaved, rotary_dim):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    cu, cu_padded = make_layout([13, 40, 0, 7], pad_to=2, extra_padding=2)
    tokens = int(cu_padded[-1])
    x = torch.randn(tokens, 3, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    ref = rope_reference(x, cu, cu_padded, rotary_dim=rotary_dim, interleaved=interleaved)
    xd = x.to(device).requires_grad_()
    y = thdcp.rope(xd, cu.to(device), cu_padded.to(device), rotary_dim=rotary_dim, interleaved=interleaved)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(y.double().cpu(), ref, rtol=tol, atol=tol)
    # The backward rotates back: the gradient of sum(y * g) is rope^-1(g).
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(2)).to(dtype).to(device)
    y.backward(g)
    back = thdcp.rope(xd.grad, cu.to(device), cu_padded.to(device), rotary_dim=rotary_dim, interleaved=interleaved)
    torch.testing.assert_close(back.double(), g.double(), rtol=tol * 4, atol=tol * 4)


@pytest.mark.parametrize("layout", ["dual_chunk", "contiguous"])
@pytest.mark.parametrize("cp", [2, 3, 4])
def test_rope_under_cp_equals_the_split_of_the_global_rope(device, cp, layout):
    # Positions follow the layout: each rank's rows rotated on their own equal its rows of
    # the whole batch rotated at once, bit for bit.
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    cu, cu_padded = thdcp.cp_layout([13, 40, 7, 1], cp, layout=layout)
    tokens = int(cu_padded[-1])
    x = torch.randn(tokens, 2, 64, generator=torch.Generator().manual_seed(3)).to(dtype).to(device)
    whole = thdcp.rope(x, cu.to(device), cu_padded.to(device))
    for rank in range(cp):
        local = thdcp.cp_split(x, cu_padded, cp, rank, layout=layout)
        rotated = thdcp.rope(local, cu.to(device), cu_padded.to(device), cp_size=cp, cp_rank=rank, layout=layout)
        assert torch.equal(rotated, thdcp.cp_split(whole, cu_padded, cp, rank, layout=layout))
    if layout == "contiguous" and cp == 3:
        # The contiguous rows are not a dual-chunk layout (lengths 13, 40, 7 are not multiples of 6).
        with pytest.raises(ValueError, match=r"is not a multiple of 2\*cp=6"):
            thdcp.rope(thdcp.cp_split(x, cu_padded, cp, 0, layout=layout), cu.to(device), cu_padded.to(device),
                       cp_size=cp, cp_rank=0)
        with pytest.raises(ValueError, match=r"rope: layout='ring' is not a CP layout"):
            thdcp.rope(x, cu.to(device), cu_padded.to(device), layout="ring")


def test_cp_split_and_merge_round_trip():
    cu, cu_padded = thdcp.cp_layout([5, 16, 1], 4)
    assert int(cu_padded[-1]) % 8 == 0 and int(cu[-1]) == 22
    x = torch.arange(int(cu_padded[-1]) * 3).view(-1, 3)
    parts = [thdcp.cp_split(x, cu_padded, 4, r) for r in range(4)]
    assert all(p.shape[0] == x.shape[0] // 4 for p in parts)
    assert torch.equal(thdcp.cp_merge(parts, cu_padded), x)
    # rank 0 holds chunk 0 and chunk 2cp-1 of each sequence: for the first (P = 8, c = 1), rows 0 and 7
    assert thdcp.cp_rank_rows(cu_padded, 4, 0)[:2].tolist() == [0, 7]
    with pytest.raises(ValueError, match="rank"):
        thdcp.cp_rank_rows(cu_padded, 4, 4)


def test_cp_attention_at_cp1_over_nccl_equals_attention(cuda):
    comm = thdcp.Communicator()  # one rank: torch.distributed not initialised
    try:
        cu, cu_padded = thdcp.cp_layout([100, 37, 1, 250], 1)
        tokens = int(cu_padded[-1])
        g = torch.Generator().manual_seed(9)
        q, k, v = (torch.randn(tokens, h, 128, generator=g).to(torch.bfloat16).cuda().requires_grad_()
                   for h in (8, 2, 2))
        cu, cu_padded = cu.cuda(), cu_padded.cuda()
        out, max_logit = thdcp.cp_attention(q, k, v, cu, cu_padded, comm=comm, window=(64, 0),
                                            return_max_logit=True)
        dout = torch.randn(out.shape, generator=g).to(torch.bfloat16).cuda()
        grads = torch.autograd.grad(out, (q, k, v), dout)
        ref_out, ref_max = thdcp.attention(q, k, v, cu, cu_padded, window=(64, 0), return_max_logit=True)
        ref_grads = torch.autograd.grad(ref_out, (q, k, v), dout)
        # At cp = 1 the CP table cuts each sequence into its two dual chunks, so the kernels
        # tile differently from the single-device table: equal up to bf16 rounding.
        torch.testing.assert_close(out, ref_out, rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(max_logit, ref_max, rtol=1e-5, atol=1e-5)
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    finally:
        comm.close()


def test_planner_and_capacity_layout():
    rng = random.Random(0)
    batches = []
    for _ in range(200):
        lengths, used = [], 0
        while True:
            n = max(1, int(rng.lognormvariate(5, 1)))
            if used + n + (n % 2) > 4096:
                break
            lengths.append(n)
            used += n + (n % 2)
        batches.append(lengths)
    plan = thdcp.plan_capacity(batches, 4096, cp=1)
    counts = sorted(len(b) for b in batches)
    assert plan.max_seqs >= counts[int(0.9 * len(counts))] + 1 or plan.max_seqs == 4096 // 2 + 1
    assert 0.0 <= plan.fallback_fraction <= 0.01 and plan.reason
    assert thdcp.default_capacity(4096, 2) == (4096, 4096 // 4 + 1)
    cu, cu_padded = thdcp.capacity_layout([3, 5], 2, 64, 4)
    assert cu.tolist() == [0, 3, 8, 8, 8] and cu_padded.tolist() == [0, 4, 12, 12, 64]
    with pytest.raises(ValueError):
        thdcp.capacity_layout([100], 1, 64, 4)


def test_graph_bank_replays_equal_eager_and_counts(cuda):
    hq, hkv, d = 4, 2, 64
    max_tokens, max_seqs = 1024, 8
    weight = torch.randn(d, d, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16).cuda()
    weight.requires_grad_()
    weight.grad = torch.zeros_like(weight)

    def step(b: thdcp.StaticBatch):
        x = b.buffer("x", (b.local_rows, hq + 2 * hkv, d), torch.bfloat16)
        qkv = x @ weight
        out = thdcp.attention(qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:], b.cu_seqlens, b.cu_seqlens_padded)
        loss = out.float().square().mean()
        loss.backward()
        return loss.detach()

    bank = thdcp.GraphBank(step)
    bank.add_capacity(max_tokens, max_seqs)
    rng = random.Random(1)
    for i in range(6):
        lengths = [rng.randint(1, 120) for _ in range(rng.randint(1, max_seqs - 1))]
        x = torch.randn(max_tokens, hq + 2 * hkv, d, generator=torch.Generator().manual_seed(i)).to(torch.bfloat16)

        def fill(b):
            b.buffer("x", (b.local_rows, hq + 2 * hkv, d), torch.bfloat16).copy_(x)

        weight.grad.zero_()
        loss = bank.run(lengths, fill).clone()
        grad = weight.grad.clone()
        # The same step eagerly, on a fresh static batch of the same capacity.
        eager_batch = thdcp.StaticBatch(1, max_tokens, max_seqs, torch.device("cuda"))
        eager_batch.set_layout(lengths)
        fill(eager_batch)
        weight.grad.zero_()
        eager_loss = step(eager_batch)
        assert torch.equal(loss, eager_loss), "step %d" % i
        assert torch.equal(grad, weight.grad), "step %d" % i
    # A batch with more documents than max_seqs - 1 runs eagerly on the zero-fallback capacity.
    bank.run([2] * (max_seqs + 3), lambda b: b.buffer("x", (b.local_rows, hq + 2 * hkv, d), torch.bfloat16).zero_())
    counters = bank.counters()[(1, max_tokens, max_seqs)]
    assert (counters.warmups, counters.captures, counters.replays, counters.fallbacks) == (1, 1, 4, 1)
    with pytest.raises(ValueError, match="fits no capacity"):
        bank.run([2000], None)
