"""thdcp.cp_attention over torch.distributed (NCCL, one process per GPU), against
thdcp.attention on the whole batch on each rank's GPU, under both CP layouts, also with
attention sinks;
thdcp.te.DotProductAttention with the
world as its CP group, equal to cp_attention bit for bit; then the CP step captured in a CUDA
graph and replayed on a new packing of the same capacity, equal to eager bit for bit.

    torchrun --nproc-per-node N tests/torch/cp_worker.py     # cp = N (N = 1 on one GPU)
Prints 'cp_worker: PASS ...' on rank 0; exits nonzero on any mismatch.
"""
import math
import os
import random
import sys

import torch
import torch.distributed as dist

import thdcp


def main():
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank, cp = dist.get_rank(), dist.get_world_size()
    comm = thdcp.Communicator()
    hq, hkv, d = 8, 2, 128
    rng = random.Random(11)
    checked = 0
    # Lengths: 1, not multiples of 2cp, one long document, a zero-length placeholder.
    lengths = [1, 2 * cp + 1, 700, rng.randint(1, 300), 0, 129]
    cu, cu_padded = thdcp.cp_layout(lengths, cp)
    tokens = int(cu_padded[-1])
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(tokens, h, d, generator=g).to(torch.bfloat16).cuda() for h in (hq, hkv, hkv))
    dout = torch.randn(tokens, hq, d, generator=g).to(torch.bfloat16).cuda()
    cu_d, cu_padded_d = cu.cuda(), cu_padded.cuda()
    for window in ((-1, 0), (-1, -1), (100, 0)):
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        ref = thdcp.attention(qg, kg, vg, cu_d, cu_padded_d, window=window)
        ref_grads = torch.autograd.grad(ref, (qg, kg, vg), dout)
        ql, kl, vl = (thdcp.cp_split(t, cu_padded, cp, rank).requires_grad_() for t in (q, k, v))
        # The group form (thdcp keeps a communicator per group) on one mask, comm= on the others.
        by = {"group": dist.group.WORLD} if window == (-1, -1) else {"comm": comm}
        out = thdcp.cp_attention(ql, kl, vl, cu_d, cu_padded_d, window=window, **by)
        grads = torch.autograd.grad(out, (ql, kl, vl), thdcp.cp_split(dout, cu_padded, cp, rank))
        torch.testing.assert_close(out, thdcp.cp_split(ref, cu_padded, cp, rank), rtol=1e-2, atol=1e-2)
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(got, thdcp.cp_split(want, cu_padded, cp, rank), rtol=2e-2, atol=2e-2)
        checked += 1

    # The contiguous layout (layout="contiguous"): no per-document padding, rank r holding the
    # r-th piece of the packed rows; against thdcp.attention on the same packed batch.
    cu_c, cu_padded_c = thdcp.cp_layout(lengths, cp, layout="contiguous")
    rows_c = int(cu_padded_c[-1])
    qc, kc, vc, doutc = (t[:rows_c] for t in (q, k, v, dout))
    cu_c_d, cu_padded_c_d = cu_c.cuda(), cu_padded_c.cuda()
    for window in ((-1, 0), (100, 0)):
        qg, kg, vg = (t.clone().requires_grad_() for t in (qc, kc, vc))
        ref = thdcp.attention(qg, kg, vg, cu_c_d, cu_padded_c_d, window=window)
        ref_grads = torch.autograd.grad(ref, (qg, kg, vg), doutc)
        split = [thdcp.cp_split(t, cu_padded_c, cp, rank, layout="contiguous") for t in (qc, kc, vc, doutc)]
        ql, kl, vl = (t.requires_grad_() for t in split[:3])
        out = thdcp.cp_attention(ql, kl, vl, cu_c_d, cu_padded_c_d, window=window, comm=comm, layout="contiguous")
        grads = torch.autograd.grad(out, (ql, kl, vl), split[3])
        torch.testing.assert_close(out, thdcp.cp_split(ref, cu_padded_c, cp, rank, layout="contiguous"),
                                   rtol=1e-2, atol=1e-2)
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(got, thdcp.cp_split(want, cu_padded_c, cp, rank, layout="contiguous"),
                                       rtol=2e-2, atol=2e-2)
        checked += 1

    # dK/dV partial sums crossing ranks in bf16 (reduce_dtype): the forward and dq the fp32
    # reduce-scatter's bits, dk and dv against thdcp.attention within cp u more.
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    ref = thdcp.attention(qg, kg, vg, cu_d, cu_padded_d, window=(100, 0))
    ref_grads = torch.autograd.grad(ref, (qg, kg, vg), dout)
    outs, grads_by = [], []
    for reduce in (None, torch.bfloat16):
        ql, kl, vl = (thdcp.cp_split(t, cu_padded, cp, rank).requires_grad_() for t in (q, k, v))
        out = thdcp.cp_attention(ql, kl, vl, cu_d, cu_padded_d, window=(100, 0), comm=comm, reduce_dtype=reduce)
        outs.append(out)
        grads_by.append(torch.autograd.grad(out, (ql, kl, vl), thdcp.cp_split(dout, cu_padded, cp, rank)))
    assert torch.equal(outs[0], outs[1]) and torch.equal(grads_by[0][0], grads_by[1][0]), "reduce_dtype moved out or dq"
    for got, want in zip(grads_by[1][1:], ref_grads[1:]):
        torch.testing.assert_close(got, thdcp.cp_split(want, cu_padded, cp, rank), rtol=2e-2, atol=2e-2 + cp * 2 ** -7)
    checked += 1

    # The head-sharded communications under both layouts, against thdcp.attention: all-to-all
    # (Ulysses, cp_comm="all_to_all": heads sharded over the ranks, kv_heads = cp, q_heads =
    # 4 cp), and a2a+ag (cp_comm="a2a+ag": all-to-all groups of 2 ranks, 1 on an odd world,
    # AllGather across the groups), with sinks on some.
    ha_q, ha_kv = 4 * cp, cp
    qa, ka, va, douta = (torch.randn(tokens, h, d, generator=g).to(torch.bfloat16).cuda()
                         for h in (ha_q, ha_kv, ha_kv, ha_q))
    sinks_a = (torch.randn(ha_q, generator=g) * 2.0).cuda()
    group = 2 if cp % 2 == 0 else 1
    modes = (("all_to_all", None, "dual_chunk", (-1, 0), None), ("all_to_all", None, "contiguous", (100, 0), sinks_a),
             ("a2a+ag", group, "dual_chunk", (100, 0), sinks_a), ("a2a+ag", group, "contiguous", (-1, 0), sinks_a))
    for cp_comm, a2a_size, layout, window, sink in modes:
        lay_cu, lay_padded = (cu, cu_padded) if layout == "dual_chunk" else (cu_c, cu_padded_c)
        rows = int(lay_padded[-1])
        full = [t[:rows] for t in (qa, ka, va, douta)]
        qg, kg, vg = (t.clone().requires_grad_() for t in full[:3])
        ref = thdcp.attention(qg, kg, vg, lay_cu.cuda(), lay_padded.cuda(), window=window, sinks=sink)
        ref_grads = torch.autograd.grad(ref, (qg, kg, vg), full[3])
        split = [thdcp.cp_split(t, lay_padded, cp, rank, layout=layout) for t in full]
        ql, kl, vl = (t.requires_grad_() for t in split[:3])
        out = thdcp.cp_attention(ql, kl, vl, lay_cu.cuda(), lay_padded.cuda(), window=window, comm=comm,
                                 layout=layout, cp_comm=cp_comm, a2a_size=a2a_size, sinks=sink)
        grads = torch.autograd.grad(out, (ql, kl, vl), split[3])
        torch.testing.assert_close(out, thdcp.cp_split(ref, lay_padded, cp, rank, layout=layout), rtol=1e-2, atol=1e-2)
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(got, thdcp.cp_split(want, lay_padded, cp, rank, layout=layout),
                                       rtol=2e-2, atol=2e-2)
        checked += 1

    # all_to_all's head slices (head_slices=2: 2 of the 4 query and 1 of the 2 key heads per
    # rank in each slice), the bits of one slice; NCCL's copy-engine collectives
    # (Communicator(copy_engine=True): workspaces in symmetric windows), the bits of plain NCCL
    # under all_gather and all_to_all. An NCCL older than 2.28.3 refuses copy_engine: then
    # that part reports what it skipped.
    hs_q, hs_kv = 4 * cp, 2 * cp
    qs, ks, vs, douts = (torch.randn(tokens, h, d, generator=g).to(torch.bfloat16).cuda()
                         for h in (hs_q, hs_kv, hs_kv, hs_q))
    split_s = [thdcp.cp_split(t, cu_padded, cp, rank) for t in (qs, ks, vs, douts)]

    def run(over, **kw):
        ql, kl, vl = (t.clone().requires_grad_() for t in split_s[:3])
        out = thdcp.cp_attention(ql, kl, vl, cu_d, cu_padded_d, window=(100, 0), comm=over, **kw)
        return (out,) + torch.autograd.grad(out, (ql, kl, vl), split_s[3])

    def same_bits(a, b, what):
        if not all(torch.equal(x, y) for x, y in zip(a, b)):
            print("cp_worker: rank %d: %s" % (rank, what), file=sys.stderr)
            sys.exit(1)

    same_bits(run(comm, cp_comm="all_to_all", head_slices=2), run(comm, cp_comm="all_to_all"),
              "head_slices=2 differs from one slice")
    checked += 1
    try:
        ce = thdcp.Communicator(copy_engine=True)
    except NotImplementedError as e:  # thdcp's kUnsupported: this NCCL has no copy engines
        ce = None
        if rank == 0:
            print("cp_worker: copy_engine not checked: %s" % e)
    if ce is not None:
        for cp_comm in ("all_gather", "all_to_all"):
            got, want = run(ce, cp_comm=cp_comm), run(comm, cp_comm=cp_comm)
            # The gathers and exchanges only move bytes: out and dQ are the same bits. Under
            # all_gather, dK and dV are fp32 reduce-scatters, which NCCL may sum in another
            # order with a zero-CTA policy: at cp > 2 they may differ by the last bits.
            exact = 4 if cp_comm == "all_to_all" or cp == 2 else 2
            same_bits(got[:exact], want[:exact], "copy_engine=True differs from plain NCCL under %s" % cp_comm)
            for g_, w_ in zip(got[exact:], want[exact:]):
                torch.testing.assert_close(g_, w_, rtol=1e-2, atol=1e-3)
            checked += 1
        ce.close()

    # Dynamic CP from one parent: Communicator.split(size) makes the CP group of `size`
    # consecutive ranks (ncclCommSplit, no torch.distributed call). The whole group's split
    # gives the parent's bits; one-rank groups attend the whole batch, against thdcp.attention.
    whole = comm.split(cp)
    assert (whole.rank, whole.size) == (rank, cp), whole
    same_bits(run(whole), run(comm), "split(cp) differs from its parent")
    whole.close()
    alone = comm.split(1)
    assert (alone.rank, alone.size) == (0, 1), alone
    qg, kg, vg = (t.clone().requires_grad_() for t in (qs, ks, vs))
    got = thdcp.cp_attention(qg, kg, vg, cu_d, cu_padded_d, window=(100, 0), comm=alone)
    got_grads = torch.autograd.grad(got, (qg, kg, vg), douts)
    qr, kr, vr = (t.clone().requires_grad_() for t in (qs, ks, vs))
    ref = thdcp.attention(qr, kr, vr, cu_d, cu_padded_d, window=(100, 0))
    ref_grads = torch.autograd.grad(ref, (qr, kr, vr), douts)
    for a, b in zip((got,) + got_grads, (ref,) + ref_grads):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)
    alone.close()
    checked += 2

    # Attention sinks (gpt-oss): cp_attention(sinks=) against thdcp.attention(sinks=) on the whole
    # batch; d(sinks) is the whole [Hq] on every rank, the same bits on every rank.
    sinks = (torch.randn(hq, generator=g) * 2.0).cuda()
    sinks[0] = 6.0  # above every score of head 0's rows
    for window in ((-1, 0), (100, 0)):
        qg, kg, vg, sg = (t.clone().requires_grad_() for t in (q, k, v, sinks))
        ref = thdcp.attention(qg, kg, vg, cu_d, cu_padded_d, window=window, sinks=sg)
        ref_grads = torch.autograd.grad(ref, (qg, kg, vg, sg), dout)
        ql, kl, vl = (thdcp.cp_split(t, cu_padded, cp, rank).requires_grad_() for t in (q, k, v))
        sl = sinks.clone().requires_grad_()
        out = thdcp.cp_attention(ql, kl, vl, cu_d, cu_padded_d, window=window, comm=comm, sinks=sl)
        grads = torch.autograd.grad(out, (ql, kl, vl, sl), thdcp.cp_split(dout, cu_padded, cp, rank))
        torch.testing.assert_close(out, thdcp.cp_split(ref, cu_padded, cp, rank), rtol=1e-2, atol=1e-2)
        for got, want in zip(grads[:3], ref_grads[:3]):
            torch.testing.assert_close(got, thdcp.cp_split(want, cu_padded, cp, rank), rtol=2e-2, atol=2e-2)
        # dsinks: both backends sum P_sink (dO . O) over the same rows, from out rounded to bf16.
        torch.testing.assert_close(grads[3], ref_grads[3], rtol=2e-2, atol=2e-2 * float(ref_grads[3].abs().max()))
        every = [torch.empty_like(grads[3]) for _ in range(cp)]
        dist.all_gather(every, grads[3])
        if not all(torch.equal(e, every[0]) for e in every):
            print("cp_worker: rank %d: d(sinks) differs between ranks" % rank, file=sys.stderr)
            sys.exit(1)
        checked += 1

    # thdcp.te.DotProductAttention with the world as its CP group (TransformerEngine's THD
    # arguments): the bits of cp_attention (thdcp.attention at cp = 1), forward and backward.
    module = thdcp.te.DotProductAttention(hq, d, num_gqa_groups=hkv, attn_mask_type="padding_causal",
                                          cp_group=dist.group.WORLD, cp_comm_type="all_gather")
    ql, kl, vl = (thdcp.cp_split(t, cu_padded, cp, rank).requires_grad_() for t in (q, k, v))
    te_out = module(ql, kl, vl, cu_seqlens_q=cu_d, cu_seqlens_kv=cu_d, cu_seqlens_q_padded=cu_padded_d,
                    cu_seqlens_kv_padded=cu_padded_d, pad_between_seqs=True)
    same = [t.detach().clone().requires_grad_() for t in (ql, kl, vl)]
    scale = 1.0 / math.sqrt(d)
    want = (thdcp.cp_attention(*same, cu_d, cu_padded_d, comm=comm, softmax_scale=scale) if cp > 1
            else thdcp.attention(*same, cu_d, cu_padded_d, softmax_scale=scale))
    dout_local = thdcp.cp_split(dout, cu_padded, cp, rank)
    te_grads = torch.autograd.grad(te_out, (ql, kl, vl), dout_local.reshape(te_out.shape))
    want_grads = torch.autograd.grad(want, same, dout_local)
    if not torch.equal(te_out, want.reshape(te_out.shape)) or not all(
            torch.equal(a, b) for a, b in zip(te_grads, want_grads)):
        print("cp_worker: rank %d: thdcp.te.DotProductAttention differs from cp_attention" % rank, file=sys.stderr)
        sys.exit(1)
    checked += 1

    # Capture: static local tensors of one capacity, replayed on new packings.
    max_seqs, max_tokens = 8, 2048 * cp
    rows = max_tokens // cp
    static = {name: torch.zeros(rows, h, d, dtype=torch.bfloat16, device="cuda", requires_grad=name != "dout")
              for name, h in (("q", hq), ("k", hkv), ("v", hkv), ("dout", hq))}
    cu_s = torch.zeros(max_seqs + 1, dtype=torch.int32, device="cuda")
    cu_padded_s = torch.zeros(max_seqs + 1, dtype=torch.int32, device="cuda")

    def step(layout):
        out = thdcp.cp_attention(static["q"], static["k"], static["v"], cu_s, cu_padded_s, comm=comm, window=(500, 0),
                                 layout=layout)
        return (out,) + torch.autograd.grad(out, (static["q"], static["k"], static["v"]), static["dout"])

    def load(seed, layout):
        r = random.Random(seed)
        lengths = [r.randint(1, 600) for _ in range(r.randint(1, max_seqs - 1))]
        while sum(lengths) + 2 * cp * len(lengths) > max_tokens:  # fits either layout's capacity form
            lengths.pop()
        c, cp_ = thdcp.cp_layout(lengths, cp, max_seqs=max_seqs, max_tokens=max_tokens, layout=layout)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name in static:
                full = torch.randn(max_tokens, static[name].shape[1], d, generator=gen).to(torch.bfloat16)
                static[name].copy_(thdcp.cp_split(full, cp_, cp, rank, layout=layout))
            cu_s.copy_(c)
            cu_padded_s.copy_(cp_)

    # Either layout: a graph of its own, replayed on new packings in that layout.
    for layout, seeds in (("dual_chunk", (101, 102, 103)), ("contiguous", (201, 202))):
        load(seeds[0] - 1, layout)
        step(layout)  # eager: makes the CP plan (collective) before the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = step(layout)
        for seed in seeds:
            load(seed, layout)
            graph.replay()
            eager = step(layout)
            for got, want in zip(captured, eager):
                if not torch.equal(got, want):
                    print("cp_worker: rank %d: %s replay differs from eager (seed %d)" % (rank, layout, seed),
                          file=sys.stderr)
                    sys.exit(1)
            checked += 1
        del graph, captured
    torch.cuda.synchronize()
    dist.barrier()
    if rank == 0:
        print("cp_worker: PASS cp=%d: %d checks (3 masks vs single-device attention, fwd+bwd; 2 masks under the "
              "contiguous layout; all-to-all under both layouts; head slices and the copy engines equal to one slice and "
              "plain NCCL bit for bit; split(cp) and split(1) for dynamic CP; 2 masks with sinks, d(sinks) the same bits on every rank; thdcp.te over the group "
              "equal to cp_attention bit for bit; 3 + 2 graph replays (dual_chunk, contiguous) on new packings equal "
              "eager bit for bit)"
              % (cp, checked))
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
