"""Train a small Llama-architecture model of Hugging Face transformers with attn_implementation="thdcp"
on packed documents: random init from a config (nothing is downloaded), the first losses checked
against the same weights with attn_implementation="sdpa".

    python examples/train_transformers.py                          # one GPU (the CPU without one)
    python examples/train_transformers.py --device cpu             # the CPU, float32 (what CI runs)
    torchrun --nproc-per-node 2 examples/train_transformers.py     # context parallelism over 2 GPUs

One process: batches packed without padding as DataCollatorWithFlattening packs them
(position_ids restart at each document), `model(**batch).loss`. Under torchrun (one GPU per
process): context parallelism over the processes. Each document is padded to a multiple of
2 * cp, the model's sequence dimension is split with thdcp's dual-chunk layout
(ContextParallel.split, i.e. thdcp.cp_split) and its attention runs thdcp.cp_attention (passed
as thdcp_cp=...); parameter gradients are summed over the ranks. GPU runs use bf16 autocast,
the CPU float32. The check: for the first --check-steps steps the loss is compared with the same
model, attn_implementation="sdpa", on the whole packed batch on one device.
"""
import argparse
import math
import os
import random
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

try:
    import transformers
    from transformers import DataCollatorWithFlattening, LlamaConfig, LlamaForCausalLM
except ImportError:
    sys.exit("train_transformers.py needs Hugging Face transformers (tested with 5.17): "
             "pip install transformers==5.17.0")

import thdcp
import thdcp.integrations.transformers as thdcp_hf  # registers attn_implementation="thdcp"

VOCAB = 1024


def model_config(device_type):
    # A Llama of 4 query and 2 KV heads of 64 (GQA); wider and deeper on a GPU.
    width, layers = (512, 4) if device_type == "cuda" else (256, 2)
    return LlamaConfig(vocab_size=VOCAB, hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                       num_attention_heads=width // 64, num_key_value_heads=2, head_dim=64,
                       max_position_embeddings=8192, attention_dropout=0.0,
                       # No KV cache while training: with one, transformers' SDPA path (the check) ignores
                       # the documents of a packed batch.
                       use_cache=False)


def documents(rng, count, longest):
    """Token lists of lognormal lengths; each repeats a short random motif (learnable)."""
    docs = []
    for _ in range(count):
        n = min(longest, max(8, int(rng.lognormvariate(math.log(longest) - 2.5, 0.8))))
        motif = [rng.randrange(VOCAB) for _ in range(8)]
        docs.append((motif * (n // 8 + 1))[:n])
    return docs


def pack(docs, rows, cp):
    """Batches of documents whose rows (each padded to a multiple of 2 * cp) fit `rows`."""
    batches, batch, used = [], [], 0
    for doc in docs:
        padded = -(-len(doc) // (2 * cp)) * 2 * cp
        if batch and used + padded > rows:
            batches.append(batch)
            batch, used = [], 0
        batch.append(doc)
        used += padded
    return batches


def cp_inputs(batch, cp_batch, device):
    """This rank's input_ids, position_ids and next-token labels of a CP batch, and the number of
    labelled tokens in the whole batch. Labels are shifted on the global rows, before the split."""
    rows = cp_batch.rows
    ids = torch.zeros(rows, dtype=torch.long)
    labels = torch.full((rows,), -100, dtype=torch.long)
    for b, doc in enumerate(batch):
        start = int(cp_batch.cu_seqlens_padded[b])
        tokens = torch.tensor(doc)
        ids[start:start + len(doc)] = tokens
        labels[start:start + len(doc) - 1] = tokens[1:]
    local = [cp_batch.split(t).to(device)[None] for t in (ids, cp_batch.position_ids(), labels)]
    return local, sum(len(doc) - 1 for doc in batch)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="auto: a GPU if one is visible, else the CPU")
    parser.add_argument("--tokens", type=int, default=None,
                        help="rows per batch, all ranks together (default 8192 on a GPU, 1024 on the CPU)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--check-steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    distributed = "RANK" in os.environ  # under torchrun: context parallelism over its processes
    if distributed or args.device == "cuda":
        local_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        visible = torch.cuda.device_count()
        if visible < local_size:
            what = ("context parallelism over %d processes needs one GPU per process" % local_size if distributed
                    else "--device cuda needs a GPU")
            if os.environ.get("RANK", "0") == "0":  # once, not once per process
                print("train_transformers.py: %s and %s visible (torch.cuda.device_count() = %d). Without a GPU "
                      "run it as one process on the CPU: python examples/train_transformers.py --device cpu"
                      % (what, "none is" if visible == 0 else "only %d are" % visible, visible), file=sys.stderr)
            sys.exit(2)
    if distributed:
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
        rank, cp = dist.get_rank(), dist.get_world_size()
        device = torch.device("cuda", local_rank)
        comm = thdcp.Communicator()
    else:
        rank, cp, comm = 0, 1, None
        use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
        device = torch.device("cuda") if use_cuda else torch.device("cpu")
    say = print if rank == 0 else (lambda *a, **k: None)
    tokens = args.tokens or (8192 if device.type == "cuda" else 1024)
    autocast_dtype = torch.bfloat16 if device.type == "cuda" else None
    tolerance = 2e-3 if autocast_dtype is not None else 1e-5

    torch.manual_seed(0)  # the same initial weights on every rank
    config = model_config(device.type)
    model = LlamaForCausalLM._from_config(config, attn_implementation="thdcp").to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    collator = DataCollatorWithFlattening()
    batches = pack(documents(random.Random(1), 40 * args.steps, min(tokens // 2, 2048)), tokens, cp)
    say("thdcp %s, transformers %s: Llama of %d layers, width %d, %d query and %d KV heads of 64, on %s%s; "
        "%d rows per batch"
        % (thdcp.__version__, transformers.__version__, config.num_hidden_layers, config.hidden_size,
           config.num_attention_heads, config.num_key_value_heads, device.type,
           " x %d ranks (context parallelism)" % cp if distributed else "", tokens))

    def autocast():
        return torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None)

    def sdpa_reference(batch):
        """Loss and logits [tokens, vocab] of the same weights with attn_implementation="sdpa" on
        the whole packed batch."""
        model.set_attn_implementation("sdpa")
        try:
            with torch.no_grad(), autocast():
                inputs = {k: v.to(device) for k, v in collator([{"input_ids": d} for d in batch]).items()}
                out = model(**inputs)
                return out.loss.float().item(), out.logits[0].float()
        finally:
            model.set_attn_implementation("thdcp")

    failures, valid_tokens, start = 0, 0, time.perf_counter()
    for step in range(args.steps):
        batch = batches[step % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            if distributed:
                cp_batch = thdcp_hf.ContextParallel([len(doc) for doc in batch], comm=comm)
                (ids, positions, labels), count = cp_inputs(batch, cp_batch, device)
                logits = model(input_ids=ids, position_ids=positions, thdcp_cp=cp_batch).logits
                loss = F.cross_entropy(logits[0].float(), labels[0], ignore_index=-100, reduction="sum") / count
            else:
                inputs = {k: v.to(device) for k, v in collator([{"input_ids": d} for d in batch]).items()}
                out = model(**inputs)
                loss, logits = out.loss, out.logits
        loss.backward()
        loss = loss.detach().float()
        if distributed:
            dist.all_reduce(loss)
            for p in model.parameters():
                dist.all_reduce(p.grad)
        if step < args.check_steps:
            reference, reference_logits = sdpa_reference(batch)
            if distributed:  # this rank's valid rows, and where they sit in the unpadded packed batch
                local, packed = cp_batch.packed_rows()
                ours = logits[0, local.to(device)].float()
                logits_difference = (ours - reference_logits[packed.to(device)]).abs().max()
                dist.all_reduce(logits_difference, op=dist.ReduceOp.MAX)
            else:
                logits_difference = (logits[0].float() - reference_logits).abs().max()
            difference = abs(loss.item() - reference) / abs(reference)
            ok = difference <= tolerance
            failures += not ok
            say("step %d: %d documents, %d tokens, loss %.6f, sdpa %.6f, relative difference %.1e (at most %.0e): "
                "%s; largest logit difference %.1e"
                % (step, len(batch), sum(len(d) for d in batch), loss.item(), reference, difference, tolerance,
                   "ok" if ok else "MISMATCH", logits_difference.item()))
        optimizer.step()
        valid_tokens += sum(len(d) for d in batch)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    say("after %d steps: loss %.4f; %.0f tokens/s (valid tokens, all ranks, the checks included)"
        % (args.steps, loss.item(), valid_tokens / seconds))
    say("result: %s" % ("PASS (the first %d losses match attn_implementation='sdpa')" % args.check_steps
                        if failures == 0 else "FAIL (%d of %d losses differ)" % (failures, args.check_steps)))
    if distributed:
        comm.close()
        dist.destroy_process_group()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
