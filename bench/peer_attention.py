#!/usr/bin/env python3
"""Peers of `thdcp bench` on the same batch, measured in the same run on the same card.

  - torch.nn.attention.varlen.varlen_attn (FlashAttention-2 class, packed THD tensors);
  - FlexAttention with a document mask (torch.compile'd), on [1, H, T, D];
  - cuDNN's fused attention (the sdpa / sdpa_backward graphs TransformerEngine runs), through
    the cudnn-frontend Python API (nvidia-cudnn-frontend) on the packed THD buffers: ragged
    offsets, padding mask with per-document lengths, a top-left diagonal band for the masks.
    Only cuDNN backend engines are taken (the frontend may also rank its own Python kernels);
    the plan that ran and the fwd/bwd workspaces are printed. --cudnn-det adds a row with the
    deterministic backward (use_deterministic_algorithm).

Every peer is checked before it is timed: O and dQ, dK, dV (and cuDNN's softmax stats) against
an fp32 reference on the three shortest documents and the longest, on the tensors it is then
timed on; what fails the check is not timed.

Reads the document lengths written by `thdcp bench --lengths-out FILE`, packs them back to
back (no padding: every peer takes cu_seqlens of the real tokens), and counts TFLOP/s from the
same exact allowed (query, key) pairs as thdcp: fwd 2*pairs*Hq*(D_qk+D_v), bwd
2*pairs*Hq*(3*D_qk+2*D_v) (4*pairs*D*Hq and 10*pairs*D*Hq where D_qk = D_v = D). --head-dim
and --v-head-dim are thdcp bench's (MLA: --head-dim 192 --v-head-dim 128).
Peers that are missing or refuse an argument are reported as such, never silently replaced.
"""
import argparse
import inspect
import math
import os
import sys
import warnings

import torch

# create_block_mask(_compile=True) warns that torch.compile(create_block_mask) is the new way;
# both build the mask without materialising T x T booleans.
warnings.filterwarnings("ignore", category=DeprecationWarning)

VERIFY_LIMIT = 2e-2  # max |peer - fp32 reference| / max |reference|, per tensor


def allowed_pairs(lengths, window_left):
    """Pairs (i, j) of one document with j <= i and (window_left < 0 or j >= i - window_left)."""
    total = 0
    for n in lengths:
        if window_left < 0 or window_left >= n:
            total += n * (n + 1) // 2
        else:
            w = window_left
            # rows i < w see i+1 keys; rows i >= w see w+1 keys
            total += w * (w + 1) // 2 + (n - w) * (w + 1)
    return total


def time_ms(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def pass_flops(what, args):
    """FLOPs of a pass ("fwd", "bwd" or "fwd+bwd") per allowed pair and query head, as thdcp
    bench counts them: the matrix products, fwd 2*(D_qk+D_v), bwd 2*(3*D_qk+2*D_v)."""
    fwd = 2 * (args.head_dim + args.v_head_dim)
    bwd = 2 * (3 * args.head_dim + 2 * args.v_head_dim)
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[what]


def report(peer, mask, what, pairs, ms, args):
    tflops = pass_flops(what, args) * pairs * args.q_heads / (ms * 1e9)
    print(f"{peer:<12} {mask:<7} {what:<8} {pairs:>12} {ms:>10.3f} {tflops:>9.1f}", flush=True)


def gemm_rate(dtype, n=8192, iters=10):
    """The card's dense GEMM rate in TFLOP/s: n^3 torch.matmul in `dtype`, median of `iters`;
    a pass's floor is its FLOPs at this rate."""
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    ms = time_ms(lambda: torch.matmul(a, b), 3, iters)
    del a, b
    torch.cuda.empty_cache()
    return 2 * n**3 / (ms * 1e9)


def print_floors(args, lengths, masks, rate):
    """The floor of every pass: its FLOPs (exact pairs) at the GEMM rate."""
    for mask_name, window_left in masks:
        pairs = allowed_pairs(lengths, window_left)
        for what in ("fwd", "bwd", "fwd+bwd"):
            ms = pass_flops(what, args) * pairs * args.q_heads / (rate * 1e9)
            print(f"{'floor':<12} {mask_name:<7} {what:<8} {pairs:>12} {ms:>10.3f} {rate:>9.1f}", flush=True)


def checked_documents(lengths):
    """The documents a peer is checked on: the three shortest and the longest (all of them
    when there are few), shortest first."""
    order = sorted((i for i in range(len(lengths)) if lengths[i] > 0), key=lambda i: lengths[i])
    return sorted(set(order[:3] + order[-1:]), key=lambda i: lengths[i])


def fp32_references(inputs, doc_view, check, window_left, scale):
    """[(i, attention_reference of document i)] for the documents in `check`, from inputs q, k,
    v and do (doc_view(tensor, i): document i as [n, H, D])."""
    with torch.no_grad():
        return [(i, attention_reference(*(doc_view(inputs[name], i) for name in ("q", "k", "v", "do")),
                                        window_left, scale)) for i in check]


def verify_peer(peer, mask_name, window_left, lengths, inputs, run, doc_view, scale):
    """One forward and backward of a peer, run() -> {o, dq, dk, dv}, checked against the fp32
    reference on checked_documents. inputs: its q, k, v and dout; doc_view(tensor, i): document
    i of one of those tensors (or of an output) as [n, H, D]. Prints one line; returns whether
    every tensor is within VERIFY_LIMIT."""
    check = checked_documents(lengths)
    refs = fp32_references(inputs, doc_view, check, window_left, scale)
    outputs = run()
    torch.cuda.synchronize()
    errs = relative_errors(refs, outputs, ("o", "dq", "dk", "dv"), doc_view)
    ok = max(errs.values()) < VERIFY_LIMIT
    docs = ", ".join(str(lengths[i]) for i in check)
    print(f"{peer} {mask_name}: {'verified' if ok else 'verification FAILED'} against fp32 on "
          f"documents of {docs} tokens: {error_line(errs)} (limit {VERIFY_LIMIT:g})"
          f"{'' if ok else '; not timed'}")
    return ok


def bench_varlen(args, lengths, masks):
    try:
        from torch.nn.attention.varlen import varlen_attn
    except Exception as e:  # noqa: BLE001
        print(f"varlen_attn: not available in torch {torch.__version__}: {e}")
        return
    params = inspect.signature(varlen_attn).parameters
    print(f"varlen_attn signature: {inspect.signature(varlen_attn)}")
    T = sum(lengths)
    cu, q, k, v, dout = packed_inputs(args, lengths)
    max_len = max(lengths)

    gqa_note = ""
    extra = {}
    if "enable_gqa" in params:
        extra["enable_gqa"] = True
    for mask_name, window_left in masks:
        kwargs = dict(extra)
        if "window_size" in params:
            kwargs["window_size"] = (window_left, 0)
        elif "is_causal" in params and window_left < 0:
            kwargs["is_causal"] = True
        else:
            print(f"varlen_attn {mask_name}: not supported by this signature (no window_size)")
            continue

        def call(kk, vv):
            return varlen_attn(q, kk, vv, cu, cu, max_len, max_len, **kwargs)

        kk, vv = k, v
        try:
            call(kk, vv)
        except Exception as e:  # noqa: BLE001
            if args.q_heads == args.kv_heads:
                print(f"varlen_attn {mask_name}: failed: {e}")
                continue
            # No native GQA: repeat K/V heads (outside the timed region) and say so.
            gqa_note = " (K/V heads repeated: no native GQA)"
            print(f"varlen_attn {mask_name}: GQA call failed ({str(e).splitlines()[0]}); repeating K/V heads")
            rep = args.q_heads // args.kv_heads
            kk = k.detach().repeat_interleave(rep, dim=1).requires_grad_()
            vv = v.detach().repeat_interleave(rep, dim=1).requires_grad_()

        def outputs():
            for t in (q, k, v, kk, vv):
                t.grad = None
            out = call(kk, vv)
            out.backward(dout)
            dk, dv = kk.grad, vv.grad
            if dk.shape[1] != args.kv_heads:  # repeated K/V heads: sum each K/V head's copies
                dk = dk.view(T, args.kv_heads, -1, args.head_dim).sum(2)
                dv = dv.view(T, args.kv_heads, -1, args.v_head_dim).sum(2)
            return dict(o=out.detach(), dq=q.grad, dk=dk, dv=dv)

        cu_list = cu.tolist()
        if not verify_peer("varlen_attn", mask_name, window_left, lengths, dict(q=q, k=k, v=v, do=dout),
                           outputs, lambda t, i: t[cu_list[i]:cu_list[i + 1]], 1.0 / math.sqrt(args.head_dim)):
            continue
        pairs = allowed_pairs(lengths, window_left)
        with torch.no_grad():
            ms = time_ms(lambda: call(kk, vv), args.warmup, args.iters)
        report("varlen_attn", mask_name, "fwd", pairs, ms, args)

        def fwd_bwd():
            out = call(kk, vv)
            out.backward(dout)

        ms = time_ms(fwd_bwd, args.warmup, args.iters)
        report("varlen_attn", mask_name, "fwd+bwd", pairs, ms, args)
        if gqa_note:
            print(f"varlen_attn {mask_name}:{gqa_note}")
    del q, k, v, dout
    torch.cuda.empty_cache()


def packed_inputs(args, lengths, dev="cuda"):
    """cu_seqlens (int32, on dev) and q, k, v (requiring grad) and dout as packed [T, H, D]
    buffers of random values, the layout varlen_attn and FlashAttention take."""
    dtype = getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[args.dtype])
    T = sum(lengths)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0)
    q = torch.randn(T, args.q_heads, args.head_dim, device=dev, dtype=dtype, requires_grad=True)
    k = torch.randn(T, args.kv_heads, args.head_dim, device=dev, dtype=dtype, requires_grad=True)
    v = torch.randn(T, args.kv_heads, args.v_head_dim, device=dev, dtype=dtype, requires_grad=True)
    dout = torch.randn(T, args.q_heads, args.v_head_dim, device=dev, dtype=dtype)
    return cu.to(dev), q, k, v, dout


def bench_fa4(args, lengths, masks):
    """FlashAttention-4 (flash-attn-4, CuTe DSL; flash_attn.cute.flash_attn_varlen_func) on the
    packed buffers: cu_seqlens int32, max_seqlen a Python int, native GQA, causal with
    window_size=(W, 0) for a left window W. Rows: fa4 (its default, non-deterministic backward)
    and fa4-det (deterministic=True), each with fwd, bwd (autograd.grad on a retained graph) and
    fwd+bwd."""
    try:
        import flash_attn.cute as fa4
        from flash_attn.cute import flash_attn_varlen_func
    except Exception as e:  # noqa: BLE001
        print_failure("fa4: not available", e)
        return
    print(f"fa4: flash_attn.cute {getattr(fa4, '__version__', '(no __version__)')} from "
          f"{os.path.dirname(fa4.__file__)}")
    cu, q, k, v, dout = packed_inputs(args, lengths)
    max_len = max(lengths)
    cu_list = cu.tolist()
    pairs_of = {}
    for mask_name, window_left in masks:
        window = (None, None) if window_left < 0 else (window_left, 0)
        pairs_of[mask_name] = allowed_pairs(lengths, window_left)
        for peer, deterministic in (("fa4", False), ("fa4-det", True)):
            def call(det=deterministic, w=window):
                return flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max_len,
                                              max_seqlen_k=max_len, causal=True, window_size=w,
                                              deterministic=det)

            def outputs():
                for t in (q, k, v):
                    t.grad = None
                out = call()
                out = out[0] if isinstance(out, tuple) else out
                out.backward(dout)
                return dict(o=out.detach(), dq=q.grad, dk=k.grad, dv=v.grad)

            try:
                if not verify_peer(peer, mask_name, window_left, lengths, dict(q=q, k=k, v=v, do=dout), outputs,
                                   lambda t, i: t[cu_list[i]:cu_list[i + 1]], 1.0 / math.sqrt(args.head_dim)):
                    continue
                if deterministic:
                    first = [t.grad.clone() for t in (q, k, v)]
                    outputs()
                    same = all(torch.equal(a, t.grad) for a, t in zip(first, (q, k, v)))
                    print(f"{peer} {mask_name}: two backward runs bitwise {'identical' if same else 'different'}")
                    del first
                pairs = pairs_of[mask_name]
                if not deterministic:
                    with torch.no_grad():
                        ms = time_ms(call, args.warmup, args.iters)
                    report(peer, mask_name, "fwd", pairs, ms, args)
                out = call()
                out = out[0] if isinstance(out, tuple) else out
                ms = time_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
                             args.warmup, args.iters)
                report(peer, mask_name, "bwd", pairs, ms, args)
                del out

                def fwd_bwd():
                    o = call()
                    o = o[0] if isinstance(o, tuple) else o
                    torch.autograd.grad(o, (q, k, v), dout)

                ms = time_ms(fwd_bwd, args.warmup, args.iters)
                report(peer, mask_name, "fwd+bwd", pairs, ms, args)
            except Exception as e:  # noqa: BLE001
                print_failure(f"{peer} {mask_name}: failed", e)
    del q, k, v, dout
    torch.cuda.empty_cache()


def bench_flex(args, lengths, masks):
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except Exception as e:  # noqa: BLE001
        print(f"flex_attention: not available in torch {torch.__version__}: {e}")
        return
    dev = "cuda"
    dtype = getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[args.dtype])
    T = sum(lengths)
    doc = torch.repeat_interleave(torch.arange(len(lengths), device=dev),
                                  torch.tensor(lengths, device=dev))
    starts = torch.zeros(len(lengths), dtype=torch.int64, device=dev)
    starts[1:] = torch.cumsum(torch.tensor(lengths, device=dev), 0)[:-1]
    pos = torch.arange(T, device=dev) - starts[doc]
    q = torch.randn(1, args.q_heads, T, args.head_dim, device=dev, dtype=dtype, requires_grad=True)
    k = torch.randn(1, args.kv_heads, T, args.head_dim, device=dev, dtype=dtype, requires_grad=True)
    v = torch.randn(1, args.kv_heads, T, args.v_head_dim, device=dev, dtype=dtype, requires_grad=True)
    dout = torch.randn(1, args.q_heads, T, args.v_head_dim, device=dev, dtype=dtype)
    compiled = torch.compile(flex_attention, dynamic=False)
    for mask_name, window_left in masks:
        if window_left < 0:
            def mask_mod(b, h, qi, ki):
                return (doc[qi] == doc[ki]) & (ki <= qi)
        else:
            def mask_mod(b, h, qi, ki, w=window_left):
                return (doc[qi] == doc[ki]) & (ki <= qi) & (pos[qi] - pos[ki] <= w)
        try:  # compiled mask construction avoids materialising T x T booleans
            block_mask = create_block_mask(mask_mod, None, None, T, T, device=dev, _compile=True)
        except TypeError:
            block_mask = create_block_mask(mask_mod, None, None, T, T, device=dev)
        pairs = allowed_pairs(lengths, window_left)
        try:
            def outputs():
                for t in (q, k, v):
                    t.grad = None
                out = compiled(q, k, v, block_mask=block_mask, enable_gqa=True)
                out.backward(dout)
                return dict(o=out.detach(), dq=q.grad, dk=k.grad, dv=v.grad)

            bounds = [0] + torch.cumsum(torch.tensor(lengths), 0).tolist()
            if not verify_peer("flex", mask_name, window_left, lengths, dict(q=q, k=k, v=v, do=dout), outputs,
                               lambda t, i: t[0, :, bounds[i]:bounds[i + 1]].transpose(0, 1),
                               1.0 / math.sqrt(args.head_dim)):
                continue
            with torch.no_grad():
                ms = time_ms(lambda: compiled(q, k, v, block_mask=block_mask, enable_gqa=True),
                             args.warmup, args.iters)
            report("flex", mask_name, "fwd", pairs, ms, args)

            def fwd_bwd():
                out = compiled(q, k, v, block_mask=block_mask, enable_gqa=True)
                out.backward(dout)

            ms = time_ms(fwd_bwd, args.warmup, args.iters)
            report("flex", mask_name, "fwd+bwd", pairs, ms, args)
        except Exception as e:  # noqa: BLE001
            print(f"flex {mask_name}: failed: {e}")


# ---------------------------------------------------------------------------------------------
# cuDNN (cudnn-frontend): THD as cuDNN takes it. b = documents, s = longest document; every
# [T, H, D] buffer is described as [b, H, s, D] with BSHD strides (token H*D, head D) and a
# ragged offset per tensor: element offsets cu_seqlens * H * D, int64 [b+1, 1, 1, 1]. The
# softmax stats are a ragged [T, Hq] fp32 tensor (offsets cu_seqlens * Hq). Per-document
# lengths go in as seq_len_q / seq_len_kv with the padding mask.



def cudnn_mask_kwargs(cudnn, window_left):
    """The bench's masks as a top-left diagonal band: key j stays for query i iff
    j <= i (right bound 0: row + 0 >= col) and, with a window, col + left_bound > row, i.e.
    j >= i - (left_bound - 1): left_bound = W + 1 gives i - W <= j <= i."""
    kwargs = dict(diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT, diagonal_band_right_bound=0)
    if window_left >= 0:
        kwargs["diagonal_band_left_bound"] = window_left + 1
    return kwargs


def cudnn_graph(cudnn, handle, geo, window_left, backward, deterministic=False):
    """One sdpa (forward, training: stats on) or sdpa_backward graph over the packed batch.
    Returns (graph, {name: graph tensor}); names match the buffers of bench_cudnn."""
    f32, i32, i64 = cudnn.data_type.FLOAT, cudnn.data_type.INT32, cudnn.data_type.INT64
    b, s, d, d_v = geo["b"], geo["s"], geo["d"], geo["d_v"]
    name = ("thd_bwd" if backward else "thd_fwd") + ("_det" if deterministic else "")
    graph = cudnn.pygraph(name=name, io_data_type=geo["io"], intermediate_data_type=f32,
                          compute_data_type=f32, handle=handle)
    t = {}

    def index(name, rows, dtype):
        t[name] = graph.tensor(name=name, dim=[rows, 1, 1, 1], stride=[1, 1, 1, 1], data_type=dtype)
        return t[name]

    def layout(heads, width):
        return [b, heads, s, width], [s * heads * width, width, heads * width, 1]

    def packed_input(name, heads, width=d, dtype=None):
        dim, stride = layout(heads, width)
        t[name] = graph.tensor(name=name, dim=dim, stride=stride, data_type=dtype or geo["io"],
                               ragged_offset=index("off_" + name, b + 1, i64))
        return t[name]

    def packed_output(name, tensor, heads, width=d, dtype=None):
        dim, stride = layout(heads, width)
        tensor.set_output(True).set_data_type(dtype or geo["io"]).set_dim(dim).set_stride(stride)
        tensor.set_ragged_offset(index("off_" + name, b + 1, i64))
        t[name] = tensor

    common = dict(attn_scale=geo["scale"], use_padding_mask=True,
                  seq_len_q=index("seq_q", b, i32), seq_len_kv=index("seq_kv", b, i32),
                  max_total_seq_len_q=geo["T"], max_total_seq_len_kv=geo["T"],
                  **cudnn_mask_kwargs(cudnn, window_left))
    q = packed_input("q", geo["hq"])
    k = packed_input("k", geo["hkv"])
    v = packed_input("v", geo["hkv"], width=d_v)
    if not backward:
        o, stats = graph.sdpa(q=q, k=k, v=v, generate_stats=True, name="sdpa", **common)
        packed_output("o", o, geo["hq"], width=d_v)
        packed_output("stats", stats, geo["hq"], width=1, dtype=f32)
    else:
        o = packed_input("o", geo["hq"], width=d_v)
        do = packed_input("do", geo["hq"], width=d_v)
        stats = packed_input("stats", geo["hq"], width=1, dtype=f32)
        dq, dk, dv = graph.sdpa_backward(q=q, k=k, v=v, o=o, dO=do, stats=stats,
                                         use_deterministic_algorithm=deterministic,
                                         name="sdpa_backward", **common)
        packed_output("dq", dq, geo["hq"])
        packed_output("dk", dk, geo["hkv"])
        packed_output("dv", dv, geo["hkv"], width=d_v)
    return graph, t


def cudnn_build(cudnn, graph):
    """validate, build_operation_graph, create_execution_plans([A, FALLBACK]), then
    check_support + build_plans on the first cuDNN backend plan of the ranked list (the
    frontend ranks its own Python engines in the same list: those are skipped). Returns a
    line naming the plan and the workspace it needs, and the workspace bytes."""
    try:
        from cudnn.engines.engine_ids import is_backend_engine
    except ImportError:  # a frontend without Python engines: every plan is a backend one
        def is_backend_engine(engine_id):
            return engine_id >= 0
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    plans = graph.plans
    backend = [i for i, cfg in enumerate(plans) if is_backend_engine(cfg.engine_id)]
    # A Python plan's name is its engine's plus its knobs in brackets: name each engine once.
    skipped = sorted({graph.get_plan_name_at_index(i).split("[")[0]
                      for i in range(len(plans)) if i not in backend})
    if not backend:
        raise RuntimeError(f"no cuDNN backend plan among the {len(plans)} ranked "
                           f"(only: {', '.join(skipped)})")
    declined, detail = [], ""
    for n, i in enumerate(backend):
        name = graph.get_plan_name_at_index(i)
        try:
            graph.select_plan(i)
            graph.check_support()
            graph.build_plans()
        except Exception as e:  # noqa: BLE001
            detail = str(e) or type(e).__name__
            declined.append(f"{name}: {detail.splitlines()[0]}")
            continue
        workspace = graph.get_workspace_size()
        notes = [f"engine {plans[i].engine_id}", f"backend plan {n + 1} of {len(backend)}"]
        if declined:
            notes.append("declined before it: " + " | ".join(declined))
        if skipped:
            notes.append(f"skipped {len(plans) - len(backend)} non-backend: {', '.join(skipped)}")
        return f"plan {name} ({'; '.join(notes)}), workspace {workspace} bytes", workspace
    # The last refusal in full below the one-line list (cuDNN gives every engine's reason).
    raise RuntimeError("no cuDNN backend plan built: " + " | ".join(declined) + "\n" + detail)


def attention_reference(q, k, v, dout, window_left, scale, budget=1 << 26):
    """fp32 attention of one document, forward and backward, query rows in chunks of at most
    `budget` scores: q [n, Hq, D_qk], k [n, Hkv, D_qk], v [n, Hkv, D_v], dout [n, Hq, D_v] (GQA:
    query head h reads K/V head h // (Hq / Hkv)). Returns o, lse (natural log of the scaled
    scores), dq, dk, dv."""
    n, hq, d = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    qf, dof = q.float().transpose(0, 1), dout.float().transpose(0, 1)
    kf = k.float().repeat_interleave(group, dim=1).transpose(0, 1)
    vf = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
    o = qf.new_empty(hq, n, vf.shape[-1])
    lse = torch.empty(hq, n, device=q.device)
    dq, dk, dv = torch.empty_like(qf), torch.zeros_like(kf), torch.zeros_like(vf)
    pos = torch.arange(n, device=q.device)
    rows = max(1, budget // (hq * n))
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        c0 = 0 if window_left < 0 else max(0, r0 - window_left)
        i, j = pos[r0:r1, None], pos[None, c0:r1]
        allowed = j <= i
        if window_left >= 0:
            allowed &= j >= i - window_left
        scores = (qf[:, r0:r1] @ kf[:, c0:r1].transpose(1, 2)) * scale
        scores.masked_fill_(~allowed, float("-inf"))
        lse[:, r0:r1] = torch.logsumexp(scores, dim=-1)
        p = torch.exp(scores - lse[:, r0:r1, None])
        o[:, r0:r1] = p @ vf[:, c0:r1]
        dp = dof[:, r0:r1] @ vf[:, c0:r1].transpose(1, 2)
        delta = (dof[:, r0:r1] * o[:, r0:r1]).sum(-1, keepdim=True)
        ds = p * (dp - delta)
        dq[:, r0:r1] = (ds @ kf[:, c0:r1]) * scale
        dk[:, c0:r1] += (ds.transpose(1, 2) @ qf[:, r0:r1]) * scale
        dv[:, c0:r1] += p.transpose(1, 2) @ dof[:, r0:r1]
    dk = dk.view(hkv, group, n, d).sum(1)
    dv = dv.view(hkv, group, n, vf.shape[-1]).sum(1)
    return {"o": o.transpose(0, 1), "lse": lse.transpose(0, 1), "dq": dq.transpose(0, 1),
            "dk": dk.transpose(0, 1), "dv": dv.transpose(0, 1)}


def relative_errors(refs, outputs, names, doc_view):
    """max |output - ref| / max |ref| per tensor name, over the checked documents (a reference
    that is all but zero, as dQ and dK are with a window of 0, is compared against 1e-3)."""
    out = {}
    for name in names:
        err = max(float((doc_view(outputs[name], i).float() - ref[name]).abs().max())
                  for i, ref in refs)
        top = max(float(ref[name].abs().max()) for _, ref in refs)
        out[name] = err / max(top, 1e-3)
    return out


def error_line(errs):
    return "max|err|/max|ref| " + " ".join(f"{n} {e:.1e}" for n, e in errs.items())


def print_failure(prefix, e):
    """One line for the summary, then the rest of a long message (cuDNN lists every engine's
    reason) indented, so that it stays in the log and out of the summary."""
    lines = str(e).splitlines() or [""]
    print(f"{prefix}: {type(e).__name__}: {lines[0][:400]}")
    for line in lines[1:60]:
        print(f"    {line}")


def bench_cudnn(args, lengths, masks):
    try:  # loads torch's libcudnn first: the frontend then finds it loaded
        torch_cudnn = torch.backends.cudnn.version()
    except Exception as e:  # noqa: BLE001
        torch_cudnn = f"unknown ({type(e).__name__}: {str(e).splitlines()[0]})"
    try:
        import cudnn
        version = f"cudnn frontend {cudnn.__version__}, backend {cudnn.backend_version_string()}"
    except Exception as e:  # noqa: BLE001
        print_failure("cudnn: not available", e)
        return
    print(f"{version}; torch's cuDNN {torch_cudnn}")
    dev = "cuda"
    dtype = getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[args.dtype])
    hq, hkv, d, d_v = args.q_heads, args.kv_heads, args.head_dim, args.v_head_dim
    T = sum(lengths)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    geo = dict(b=len(lengths), s=max(lengths), d=d, d_v=d_v, hq=hq, hkv=hkv, T=T, scale=1.0 / math.sqrt(d),
               io={"bf16": cudnn.data_type.BFLOAT16, "fp16": cudnn.data_type.HALF}[args.dtype])
    try:
        handle = cudnn.create_handle()
        cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)  # where time_ms records
        cu_t = torch.tensor(cu, dtype=torch.int64, device=dev).view(-1, 1, 1, 1)
        seq = torch.tensor(lengths, dtype=torch.int32, device=dev).view(-1, 1, 1, 1)
        q = torch.randn(T, hq, d, device=dev, dtype=dtype)
        buf = dict(q=q, k=torch.randn(T, hkv, d, device=dev, dtype=dtype),
                   v=torch.randn(T, hkv, d_v, device=dev, dtype=dtype),
                   do=torch.randn(T, hq, d_v, device=dev, dtype=dtype),
                   o=torch.empty(T, hq, d_v, device=dev, dtype=dtype), dq=torch.empty_like(q),
                   dk=torch.empty(T, hkv, d, device=dev, dtype=dtype),
                   dv=torch.empty(T, hkv, d_v, device=dev, dtype=dtype),
                   stats=torch.empty(T, hq, 1, device=dev, dtype=torch.float32),
                   seq_q=seq, seq_kv=seq)
        for names, elements in ((("q", "dq"), hq * d), (("o", "do"), hq * d_v), (("k", "dk"), hkv * d),
                                (("v", "dv"), hkv * d_v), (("stats",), hq)):
            for name in names:
                buf["off_" + name] = cu_t * elements
    except Exception as e:  # noqa: BLE001
        print_failure("cudnn: not available", e)
        return
    outputs = dict(o=buf["o"], lse=buf["stats"][..., 0], dq=buf["dq"], dk=buf["dk"], dv=buf["dv"])
    check = checked_documents(lengths)

    def doc_view(tensor, i):
        return tensor[cu[i]:cu[i + 1]]

    def workspace(nbytes):
        free, _ = torch.cuda.mem_get_info()
        if nbytes > free - (256 << 20):
            raise MemoryError(f"workspace of {nbytes} bytes ({nbytes / 2**30:.1f} GiB) does not "
                              f"fit: {free / 2**30:.1f} GiB free")
        return torch.empty(max(nbytes, 1), dtype=torch.uint8, device=dev)

    def runner(window_left, backward, deterministic=False):
        """Builds one graph over buf; returns a function that executes it (holding its
        workspace) and the line naming its plan."""
        graph, tensors = cudnn_graph(cudnn, handle, geo, window_left, backward, deterministic)
        line, nbytes = cudnn_build(cudnn, graph)
        ws = workspace(nbytes)
        pack = {tensor: buf[name] for name, tensor in tensors.items()}
        return (lambda: graph.execute(pack, ws, handle=handle)), line

    for mask_name, window_left in masks:
        pairs = allowed_pairs(lengths, window_left)
        run_fwd = refs = None
        try:
            run_fwd, line = runner(window_left, backward=False)
            print(f"cudnn {mask_name} fwd: {line}")
            run_fwd()
            torch.cuda.synchronize()
            refs = fp32_references(buf, doc_view, check, window_left, geo["scale"])
            errs = relative_errors(refs, outputs, ("o", "lse"), doc_view)
            ok = max(errs.values()) < VERIFY_LIMIT
            docs = ", ".join(str(lengths[i]) for i in check)
            print(f"cudnn {mask_name} fwd: {'verified' if ok else 'verification FAILED'} against "
                  f"fp32 on documents of {docs} tokens: {error_line(errs)} "
                  f"(limit {VERIFY_LIMIT:g})")
            if ok:
                ms = time_ms(run_fwd, args.warmup, args.iters)
                report("cudnn", mask_name, "fwd", pairs, ms, args)
            else:
                print(f"cudnn {mask_name}: not timed")
        except Exception as e:  # noqa: BLE001
            print_failure(f"cudnn {mask_name} fwd: failed", e)
            ok = False
        if ok:  # the backward reads the verified forward's O and stats
            for deterministic in (False, True) if args.cudnn_det else (False,):
                bench_cudnn_bwd(args, runner, buf, mask_name, window_left, pairs, refs, outputs,
                                doc_view, run_fwd, deterministic)
        run_fwd = refs = None
        torch.cuda.empty_cache()


def bench_cudnn_bwd(args, runner, buf, mask_name, window_left, pairs, refs, outputs, doc_view,
                    run_fwd, deterministic):
    """sdpa_backward after the verified forward, use_deterministic_algorithm=deterministic (a
    "cudnn-det" row): dQ, dK, dV checked against the fp32 reference, two runs compared bitwise,
    then forward + backward timed. A plan that does not build or a workspace that does not fit
    is reported, not fatal."""
    peer = "cudnn-det" if deterministic else "cudnn"
    env = "CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT"  # read by the frontend when it builds the graph
    saved = os.environ.get(env)
    limit = ""
    if deterministic and args.cudnn_det_dp_limit is not None:
        os.environ[env] = str(args.cudnn_det_dp_limit)
        limit = f" ({env}={args.cudnn_det_dp_limit})"
    run_bwd = None
    try:
        run_bwd, line = runner(window_left, backward=True, deterministic=deterministic)
        print(f"{peer} {mask_name} bwd: {line}{limit}")
        run_fwd()
        run_bwd()
        torch.cuda.synchronize()
        first = {name: buf[name].clone() for name in ("dq", "dk", "dv")}
        run_bwd()
        torch.cuda.synchronize()
        repeatable = all(torch.equal(first[name], buf[name]) for name in first)
        del first
        errs = relative_errors(refs, outputs, ("dq", "dk", "dv"), doc_view)
        ok = max(errs.values()) < VERIFY_LIMIT
        print(f"{peer} {mask_name} bwd: {'verified' if ok else 'verification FAILED'} against "
              f"fp32: {error_line(errs)} (limit {VERIFY_LIMIT:g}); two runs bitwise "
              f"{'identical' if repeatable else 'different'}")
        if not ok:
            print(f"{peer} {mask_name}: fwd+bwd not timed")
            return

        def fwd_bwd():
            run_fwd()
            run_bwd()

        ms = time_ms(fwd_bwd, args.warmup, args.iters)
        report(peer, mask_name, "fwd+bwd", pairs, ms, args)
    except Exception as e:  # noqa: BLE001
        print_failure(f"{peer} {mask_name} bwd: failed", e)
    finally:
        if limit:
            if saved is None:
                os.environ.pop(env, None)
            else:
                os.environ[env] = saved
        run_bwd = None
        torch.cuda.empty_cache()


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lengths", required=True, help="file of document lengths, one per line")
    parser.add_argument("--q-heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128, help="D_qk, of q and k")
    parser.add_argument("--v-head-dim", type=int, default=None,
                        help="D_v, of v and out (default: --head-dim; MLA: --head-dim 192 --v-head-dim 128)")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--peers", default="varlen,flex,cudnn,fa4",
                        help="comma list of the peers to run: varlen, flex, cudnn, fa4")
    parser.add_argument("--floor", action="store_true",
                        help="first measure the card's GEMM rate (8192^3 torch.matmul in --dtype, median "
                             "of 10) and print each pass's floor: its FLOPs at that rate ('floor' rows, "
                             "ms and the rate in TFLOP/s)")
    parser.add_argument("--cudnn-det", action="store_true",
                        help="cudnn: also time the deterministic backward (a cudnn-det row)")
    parser.add_argument("--cudnn-det-dp-limit", type=int, default=None, metavar="BYTES",
                        help="cudnn-det: CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT for its graph "
                             "(on Hopper with cuDNN >= 9.25 a dP workspace above it takes the "
                             "ordered-dQ deterministic path, workspace linear in length)")
    args = parser.parse_args()
    if args.v_head_dim is None:
        args.v_head_dim = args.head_dim
    with open(args.lengths) as f:
        lengths = [int(line) for line in f if line.strip()]
    if not torch.cuda.is_available():
        print("no CUDA device: peers not measured")
        return 1
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}; {len(lengths)} documents, "
          f"{sum(lengths)} tokens, longest {max(lengths)}")
    print(f"{'peer':<12} {'mask':<7} {'pass':<8} {'pairs':>12} {'ms':>10} {'TFLOP/s':>9}")
    masks = [("causal", -1), ("window", args.window)]
    if args.floor:
        dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
        print_floors(args, lengths, masks, gemm_rate(dtype))
    peers = [p for p in args.peers.split(",") if p]
    for unknown in sorted(set(peers) - {"varlen", "flex", "cudnn", "fa4"}):
        print(f"{unknown}: unknown peer (known: varlen, flex, cudnn, fa4)")
    benches = dict(varlen=bench_varlen, flex=bench_flex, cudnn=bench_cudnn, fa4=bench_fa4)
    for peer in ("varlen", "flex", "cudnn", "fa4"):
        if peer not in peers:
            continue
        try:
            benches[peer](args, lengths, masks)
        except Exception as e:  # noqa: BLE001 - a peer that refuses the shape is reported, not fatal
            print(f"{peer}: refused or failed on this shape: {type(e).__name__}: {str(e).splitlines()[0]}")
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
