#!/usr/bin/env python3
"""Peers of `thdcp bench` on the same batch, measured in the same run on the same card.

  - torch.nn.attention.varlen.varlen_attn (FlashAttention-2 class, packed THD tensors);
  - FlexAttention with a document mask (torch.compile'd), on [1, H, T, D].

Reads the document lengths written by `thdcp bench --lengths-out FILE`, packs them back to
back (no padding: both peers take cu_seqlens of the real tokens), and counts TFLOP/s from the
same exact allowed (query, key) pairs as thdcp: fwd 4*pairs*D*Hq, bwd 10*pairs*D*Hq.
Peers that are missing or refuse an argument are reported as such, never silently replaced.
"""
import argparse
import inspect
import math
import sys
import warnings

import torch

# create_block_mask(_compile=True) warns that torch.compile(create_block_mask) is the new way;
# both build the mask without materialising T x T booleans.
warnings.filterwarnings("ignore", category=DeprecationWarning)


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


def report(peer, mask, what, pairs, ms, flop_factor, args):
    tflops = flop_factor * pairs * args.head_dim * args.q_heads / (ms * 1e9)
    print(f"{peer:<12} {mask:<7} {what:<8} {pairs:>12} {ms:>10.3f} {tflops:>9.1f}", flush=True)


def bench_varlen(args, lengths, masks):
    try:
        from torch.nn.attention.varlen import varlen_attn
    except Exception as e:  # noqa: BLE001
        print(f"varlen_attn: not available in torch {torch.__version__}: {e}")
        return
    params = inspect.signature(varlen_attn).parameters
    print(f"varlen_attn signature: {inspect.signature(varlen_attn)}")
    dev = "cuda"
    dtype = getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[args.dtype])
    T = sum(lengths)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0)
    cu = cu.to(dev)
    max_len = max(lengths)
    q = torch.randn(T, args.q_heads, args.head_dim, device=dev, dtype=dtype, requires_grad=True)
    k = torch.randn(T, args.kv_heads, args.head_dim, device=dev, dtype=dtype, requires_grad=True)
    v = torch.randn(T, args.kv_heads, args.head_dim, device=dev, dtype=dtype, requires_grad=True)
    dout = torch.randn(T, args.q_heads, args.head_dim, device=dev, dtype=dtype)

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
        pairs = allowed_pairs(lengths, window_left)
        with torch.no_grad():
            ms = time_ms(lambda: call(kk, vv), args.warmup, args.iters)
        report("varlen_attn", mask_name, "fwd", pairs, ms, 4, args)

        def fwd_bwd():
            out = call(kk, vv)
            out.backward(dout)

        ms = time_ms(fwd_bwd, args.warmup, args.iters)
        report("varlen_attn", mask_name, "fwd+bwd", pairs, ms, 14, args)
        if gqa_note:
            print(f"varlen_attn {mask_name}:{gqa_note}")
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
    v = torch.randn(1, args.kv_heads, T, args.head_dim, device=dev, dtype=dtype, requires_grad=True)
    dout = torch.randn(1, args.q_heads, T, args.head_dim, device=dev, dtype=dtype)
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
            with torch.no_grad():
                ms = time_ms(lambda: compiled(q, k, v, block_mask=block_mask, enable_gqa=True),
                             args.warmup, args.iters)
            report("flex", mask_name, "fwd", pairs, ms, 4, args)

            def fwd_bwd():
                out = compiled(q, k, v, block_mask=block_mask, enable_gqa=True)
                out.backward(dout)

            ms = time_ms(fwd_bwd, args.warmup, args.iters)
            report("flex", mask_name, "fwd+bwd", pairs, ms, 14, args)
        except Exception as e:  # noqa: BLE001
            print(f"flex {mask_name}: failed: {e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lengths", required=True, help="file of document lengths, one per line")
    parser.add_argument("--q-heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--peers", default="varlen,flex")
    args = parser.parse_args()
    with open(args.lengths) as f:
        lengths = [int(line) for line in f if line.strip()]
    if not torch.cuda.is_available():
        print("no CUDA device: peers not measured")
        return 1
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}; {len(lengths)} documents, "
          f"{sum(lengths)} tokens, longest {max(lengths)}")
    print(f"{'peer':<12} {'mask':<7} {'pass':<8} {'pairs':>12} {'ms':>10} {'TFLOP/s':>9}")
    masks = [("causal", -1), ("window", args.window)]
    peers = args.peers.split(",")
    if "varlen" in peers:
        bench_varlen(args, lengths, masks)
    if "flex" in peers:
        bench_flex(args, lengths, masks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
