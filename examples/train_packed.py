"""Train a small decoder on packed documents with thdcp: THD attention and RoPE, context
parallelism over torch.distributed, and the whole forward+backward step replayed from a
GraphBank for every packing.

    python examples/train_packed.py                                   # one GPU (cp = 1)
    torchrun --nproc-per-node 2 examples/train_packed.py              # cp = 2

The model: 4 layers, width 512, 8 query heads and 2 KV heads of 64, NeoX RoPE, SwiGLU MLP,
on synthetic tokens in documents of lognormal lengths packed into batches of --tokens rows.
For the first --check-steps steps the loss is compared with the same model in plain PyTorch
(scaled_dot_product_attention per document, RoPE in PyTorch) on the whole batch; then
tokens/s of eager steps and of graph replays are printed.
"""
import argparse
import math
import os
import random
import sys
import time


def needs(what):
    """What this example needs and did not find: one line, exit code 2 (no traceback)."""
    rank = os.environ.get("RANK")
    print("train_packed.py%s: %s" % (" (rank %s)" % rank if rank else "", what), file=sys.stderr)
    sys.exit(2)


try:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
except ImportError as e:
    needs("needs PyTorch (%s): install it, then thdcp (pip install . in the thdcp repository)" % e)
try:
    import thdcp
except ImportError as e:
    needs("needs the thdcp package (%s): pip install . in the thdcp repository" % e)

VOCAB, WIDTH, LAYERS, Q_HEADS, KV_HEADS, HEAD_DIM = 1024, 512, 4, 8, 2, 64


class Decoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.blocks = torch.nn.ModuleList()
        for _ in range(LAYERS):
            block = torch.nn.Module()
            block.qkv = torch.nn.Linear(WIDTH, (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM, bias=False)
            block.proj = torch.nn.Linear(Q_HEADS * HEAD_DIM, WIDTH, bias=False)
            block.up = torch.nn.Linear(WIDTH, 2 * 4 * WIDTH, bias=False)
            block.down = torch.nn.Linear(4 * WIDTH, WIDTH, bias=False)
            self.blocks.append(block)
        self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens, attend, rotate):
        """attend(q, k, v) and rotate(x) are the attention and RoPE of the THD rows."""
        x = self.embed(tokens)
        for block in self.blocks:
            h = F.rms_norm(x, (WIDTH,))
            qkv = block.qkv(h).view(-1, Q_HEADS + 2 * KV_HEADS, HEAD_DIM).to(torch.bfloat16)
            q, k, v = qkv[:, :Q_HEADS], qkv[:, Q_HEADS:Q_HEADS + KV_HEADS], qkv[:, Q_HEADS + KV_HEADS:]
            out = attend(rotate(q), rotate(k), v)
            x = x + block.proj(out.reshape(-1, Q_HEADS * HEAD_DIM).float())
            gate, up = block.up(F.rms_norm(x, (WIDTH,))).chunk(2, dim=-1)
            x = x + block.down(F.silu(gate) * up)
        return self.head(F.rms_norm(x, (WIDTH,)))


# ---- the plain-PyTorch reference (whole batch, one device) ----

def reference_rope(x, cu_padded, theta=10000.0):
    positions = torch.zeros(x.shape[0], dtype=torch.float32, device=x.device)
    for b in range(len(cu_padded) - 1):
        s, e = int(cu_padded[b]), int(cu_padded[b + 1])
        positions[s:e] = torch.arange(e - s, dtype=torch.float32, device=x.device)
    inv_freq = theta ** (-torch.arange(0, HEAD_DIM // 2, dtype=torch.float32, device=x.device) * 2 / HEAD_DIM)
    angle = positions[:, None] * inv_freq[None, :]
    cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]
    x1, x2 = x[..., : HEAD_DIM // 2].float(), x[..., HEAD_DIM // 2:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def reference_attention(q, k, v, cu, cu_padded):
    out = torch.zeros_like(q)
    for b in range(len(cu) - 1):
        s, n = int(cu_padded[b]), int(cu[b + 1] - cu[b])
        if n == 0:
            continue
        qs, ks, vs = (t[s:s + n].transpose(0, 1) for t in (q, k, v))  # [H, n, D]
        out[s:s + n] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True).transpose(0, 1)
    return out


# ---- data ----

def documents(rng, count):
    return [min(4096, max(16, int(rng.lognormvariate(6.0, 1.0)))) for _ in range(count)]


def pack(docs, tokens, cp):
    batches, batch, used = [], [], 0
    for n in docs:
        padded = -(-n // (2 * cp)) * 2 * cp
        if used + padded > tokens:
            batches.append(batch)
            batch, used = [], 0
        batch.append(n)
        used += padded
    return batches


def batch_tensors(lengths, cp, max_tokens, max_seqs, seed):
    """Global tokens and next-token labels (-100 on padding and each document's last token)."""
    cu, cu_padded = thdcp.cp_layout(lengths, cp, max_seqs=max_seqs, max_tokens=max_tokens)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.zeros(max_tokens, dtype=torch.long)
    labels = torch.full((max_tokens,), -100, dtype=torch.long)
    for b, n in enumerate(lengths):
        s = int(cu_padded[b])
        # A learnable pattern: each document repeats a short random motif.
        motif = torch.randint(0, VOCAB, (8,), generator=g)
        doc = motif.repeat(n // 8 + 1)[:n]
        tokens[s:s + n] = doc
        labels[s:s + n - 1] = doc[1:]
    return tokens, labels, cu, cu_padded, sum(n - 1 for n in lengths)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=16384, help="rows per batch (all ranks together)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--check-steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()

    # It trains on the GPU and replays CUDA graphs: without one, say so (thdcp itself also runs
    # on the CPU: thdcp.attention on CPU tensors).
    if not torch.cuda.is_available():
        needs("needs a CUDA GPU (it trains on the GPU and replays CUDA graphs), and PyTorch sees none here; "
              "thdcp.attention also runs on CPU tensors (README, PyTorch)")
    if not thdcp.built_with_cuda():
        needs("needs thdcp's CUDA operators, and this thdcp was built without them (no nvcc, or a CPU-only "
              "PyTorch, when it was installed): reinstall it where nvcc and a CUDA PyTorch are present")
    distributed = "RANK" in os.environ
    if distributed and int(os.environ["LOCAL_RANK"]) >= torch.cuda.device_count():
        needs("needs a GPU per process: LOCAL_RANK %s, but %d GPU(s) visible (lower --nproc-per-node)"
              % (os.environ["LOCAL_RANK"], torch.cuda.device_count()))
    if distributed:
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
        rank, cp = dist.get_rank(), dist.get_world_size()
    else:
        rank, cp = 0, 1
    device = torch.device("cuda", torch.cuda.current_device())
    comm = thdcp.Communicator() if cp > 1 else None
    say = print if rank == 0 else (lambda *a, **k: None)

    torch.manual_seed(0)
    model = Decoder().to(device)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # fixed .grad tensors that every graph adds into
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)

    rng = random.Random(1)
    batches = pack(documents(rng, 4000), args.tokens, cp)
    plan = thdcp.plan_capacity(batches, args.tokens, cp=cp)
    say("thdcp %s: cp=%d, %d batches of %d rows; capacity max_seqs=%d (%s)"
        % (thdcp.__version__, cp, len(batches), args.tokens, plan.max_seqs, plan.reason))

    def step(b):
        tokens = b.buffer("tokens", (b.local_rows,), torch.long)
        labels = b.buffer("labels", (b.local_rows,), torch.long)
        inv_count = b.buffer("inv_count", (1,), torch.float32)
        if cp == 1:
            def attend(q, k, v):
                return thdcp.attention(q, k, v, b.cu_seqlens, b.cu_seqlens_padded)
        else:
            def attend(q, k, v):
                return thdcp.cp_attention(q, k, v, b.cu_seqlens, b.cu_seqlens_padded, comm=comm)

        def rotate(x):
            return thdcp.rope(x, b.cu_seqlens, b.cu_seqlens_padded, cp_size=cp, cp_rank=rank)

        logits = model(tokens, attend, rotate)
        loss = F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="sum") * inv_count[0]
        loss.backward()
        return loss.detach()

    bank = thdcp.GraphBank(step)
    bank.add_capacity(args.tokens, plan.max_seqs, cp=cp)

    fallback_seqs = thdcp.default_capacity(args.tokens, cp)[1]

    def run(i, lengths, graphed=True):
        # The layout of the capacity that runs it (the bank's choice: too many documents for
        # the graph's capacity run eagerly on the zero-fallback one).
        fits = len(lengths) < plan.max_seqs
        max_seqs = plan.max_seqs if fits else fallback_seqs
        tokens, labels, cu, cu_padded, count = batch_tensors(lengths, cp, args.tokens, max_seqs, i)

        def fill(b):
            b.buffer("tokens", (b.local_rows,), torch.long).copy_(thdcp.cp_split(tokens, cu_padded, cp, rank))
            b.buffer("labels", (b.local_rows,), torch.long).copy_(thdcp.cp_split(labels, cu_padded, cp, rank))
            b.buffer("inv_count", (1,), torch.float32).fill_(1.0 / count)

        if graphed:
            loss = bank.run(lengths, fill, cp=cp).clone()
        else:
            batch = eager_batch if fits else fallback_batch
            batch.set_layout(lengths)
            fill(batch)
            loss = step(batch)
        if cp > 1:
            dist.all_reduce(loss)
            for p in model.parameters():
                dist.all_reduce(p.grad)
        return loss, (tokens, labels, cu, cu_padded, count)

    eager_batch = thdcp.StaticBatch(cp, args.tokens, plan.max_seqs, device)
    fallback_batch = thdcp.StaticBatch(cp, args.tokens, fallback_seqs, device)
    failures = 0
    for i in range(args.check_steps):
        lengths = batches[i % len(batches)]
        optimizer.zero_grad(set_to_none=False)
        loss, (tokens, labels, cu, cu_padded, count) = run(i, lengths)
        with torch.no_grad():  # the same weights in plain PyTorch, whole batch on one device
            cu_d, cu_padded_d = cu.to(device), cu_padded.to(device)

            def ref_attend(q, k, v):
                return reference_attention(q, k, v, cu, cu_padded)

            def ref_rotate(x):
                return reference_rope(x, cu_padded_d)

            logits = model(tokens.to(device), ref_attend, ref_rotate)
            ref = F.cross_entropy(logits.float(), labels.to(device), ignore_index=-100, reduction="sum") / count
        rel = abs(loss.item() - ref.item()) / abs(ref.item())
        ok = rel < 2e-3
        failures += not ok
        say("step %d: %d documents, loss %.5f, plain PyTorch %.5f, relative difference %.1e %s"
            % (i, len(lengths), loss.item(), ref.item(), rel, "ok" if ok else "MISMATCH"))
        optimizer.step()

    def timed(graphed, first, count):
        torch.cuda.synchronize()
        start = time.perf_counter()
        valid = 0
        for i in range(first, first + count):
            lengths = batches[i % len(batches)]
            optimizer.zero_grad(set_to_none=False)
            loss, _ = run(i, lengths, graphed)
            optimizer.step()
            valid += sum(lengths)
        torch.cuda.synchronize()
        return valid / (time.perf_counter() - start), loss.item()

    n = max(1, (args.steps - args.check_steps) // 2)
    eager_tps, _ = timed(False, args.check_steps, n)
    replay_tps, last_loss = timed(True, args.check_steps + n, n)
    c = bank.counters()[(cp, args.tokens, plan.max_seqs)]
    say("after %d steps: loss %.4f; graph bank: %d warm-up, %d capture, %d replays, %d fallbacks"
        % (args.check_steps + 2 * n, last_loss, c.warmups, c.captures, c.replays, c.fallbacks))
    say("tokens/s (valid tokens, all ranks, including the host's packing work): eager %.0f, replay %.0f (%.2fx)"
        % (eager_tps * 1, replay_tps, replay_tps / eager_tps))
    say("result: %s" % ("PASS (the first %d losses match plain PyTorch)" % args.check_steps if failures == 0
                        else "FAIL (%d of %d losses differ)" % (failures, args.check_steps)))
    if comm is not None:
        del bank
        comm.close()
    if distributed:
        dist.destroy_process_group()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
