"""GraphBank: a training step captured once per (CP size, capacity) as a CUDA graph and
replayed for every later batch that fits, whatever its packing.

    def step(batch: thdcp.StaticBatch):
        tokens = batch.buffer("tokens", (batch.local_rows,), torch.long)
        loss = model(tokens, batch.cu_seqlens, batch.cu_seqlens_padded)
        loss.backward()                 # into .grad tensors allocated before the first capture
        return loss.detach()

    bank = thdcp.GraphBank(step)
    bank.add_capacity(max_tokens=16384, max_seqs=64, cp=1)
    for lengths, tokens in batches:
        loss = bank.run(lengths, lambda b: b.buffer("tokens").copy_(tokens), cp=1)

The step reads everything that changes between batches from the StaticBatch: the layout
(cu_seqlens, cu_seqlens_padded: int32 [max_seqs + 1] on the device, at fixed addresses) and
the named buffers it asks for, which `fill` writes before each run. Each capacity is run
eagerly warmup_runs times (on a side stream, as torch.cuda.graph wants), then captured (the
capturing run's work is replayed at once), then replayed. A batch with more documents than
any capacity of its CP size holds runs eagerly on the zero-fallback capacity and is counted
as a fallback; a batch with more tokens than every capacity is refused. Which capacity runs a
batch is the C++ library's rule (thdcp/plan/capacity.h, choose_capacity), the one its own
graph::GraphBank follows.

Gradients: a parameter's .grad must exist before the first capture (zeros), and be zeroed in
place (optimizer.zero_grad(set_to_none=False)) between steps, so that every graph adds into
the same tensors.
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import arguments
from .arguments import INT32_MAX, INT64_MAX
from .planning import capacity_layout, choose_capacity, default_capacity, fits


@dataclass
class KeyCounters:
    warmups: int = 0
    captures: int = 0
    replays: int = 0
    fallbacks: int = 0


class StaticBatch:
    """The fixed-address inputs of one (cp, capacity): the layout and named buffers."""

    def __init__(self, cp: int, max_tokens: int, max_seqs: int, device: torch.device):
        self.cp = arguments.cp_size("StaticBatch", cp)
        self.max_tokens = arguments.integer("StaticBatch", "max_tokens", max_tokens, 1, INT64_MAX)
        self.max_seqs = arguments.integer("StaticBatch", "max_seqs", max_seqs, 1, INT32_MAX)
        cp, max_tokens, max_seqs = self.cp, self.max_tokens, self.max_seqs
        self.local_rows = max_tokens // cp
        self.device = device
        self.cu_seqlens = torch.zeros(max_seqs + 1, dtype=torch.int32, device=device)
        self.cu_seqlens_padded = torch.zeros(max_seqs + 1, dtype=torch.int32, device=device)
        self.lengths: List[int] = []
        self._staging = torch.zeros(2 * (max_seqs + 1), dtype=torch.int32, pin_memory=device.type == "cuda")
        self._buffers: Dict[str, torch.Tensor] = {}
        self._copied = torch.cuda.Event()
        self._copied.record()

    def buffer(self, name: str, shape: Optional[Sequence[int]] = None, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The named static buffer of this capacity, made (zeroed) on first use with shape and dtype."""
        existing = self._buffers.get(name)
        if existing is None:
            if shape is None or dtype is None:
                raise KeyError("thdcp.StaticBatch: no buffer %r yet; the step makes it with buffer(name, shape, dtype)"
                               % name)
            existing = torch.zeros(tuple(shape), dtype=dtype, device=self.device)
            self._buffers[name] = existing
        elif shape is not None and tuple(existing.shape) != tuple(shape):
            raise ValueError("thdcp.StaticBatch: buffer %r has shape %s, asked for %s"
                             % (name, tuple(existing.shape), tuple(shape)))
        return existing

    def set_layout(self, lengths: Sequence[int]) -> None:
        """Writes the layout of `lengths` into cu_seqlens / cu_seqlens_padded (stream-ordered)."""
        cu, cu_padded = capacity_layout(lengths, self.cp, self.max_tokens, self.max_seqs)
        # The pinned staging buffer is reused: wait for its previous copy (long done, normally).
        self._copied.synchronize()
        n = self.max_seqs + 1
        self._staging[:n].copy_(cu)
        self._staging[n:].copy_(cu_padded)
        self.cu_seqlens.copy_(self._staging[:n], non_blocking=True)
        self.cu_seqlens_padded.copy_(self._staging[n:], non_blocking=True)
        self._copied.record()
        self.lengths = list(lengths)


@dataclass
class _Entry:
    batch: StaticBatch
    fallback_only: bool = False  # a zero-fallback capacity made for fallbacks, not a bucket
    counters: KeyCounters = field(default_factory=KeyCounters)
    graph: Optional[torch.cuda.CUDAGraph] = None
    output: Any = None


class GraphBank:
    """One CUDA graph of `step` per (cp, max_tokens, max_seqs); see the module's text."""

    def __init__(self, step: Callable[[StaticBatch], Any], *, warmup_runs: int = 1,
                 device: Optional[torch.device] = None):
        # >= 1: plans are made eagerly
        self.warmup_runs = arguments.integer("GraphBank", "warmup_runs", warmup_runs, 1, INT64_MAX)
        self.step = step
        self.device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        self._entries: Dict[Tuple[int, int, int], _Entry] = {}
        self._side = torch.cuda.Stream(self.device)

    def add_capacity(self, max_tokens: int, max_seqs: Optional[int] = None, cp: int = 1) -> None:
        """A capacity of CP size cp (max_seqs None: the zero-fallback max_tokens / (2 cp) + 1)."""
        op = "GraphBank.add_capacity"
        cp = arguments.cp_size(op, cp)
        max_tokens = arguments.integer(op, "max_tokens", max_tokens, 1, INT64_MAX)
        if max_seqs is None:
            max_seqs = default_capacity(max_tokens, cp)[1]
        max_seqs = arguments.integer(op, "max_seqs", max_seqs, 1, INT32_MAX)
        key = (cp, max_tokens, max_seqs)
        if key not in self._entries:
            fits([], cp, max_tokens, max_seqs)  # validates the capacity (raises ValueError)
            self._entries[key] = _Entry(StaticBatch(key[0], key[1], key[2], self.device))

    def _choose(self, lengths: Sequence[int], cp: int) -> Tuple[Tuple[int, int, int], bool]:
        buckets = [(k[1], k[2]) for k in self._entries if k[0] == cp and not self._entries[k].fallback_only]
        if not buckets:
            raise ValueError("thdcp.GraphBank: no capacity for cp=%d; add one with add_capacity(..., cp=%d)" % (cp, cp))
        bucket, run, fallback = choose_capacity(lengths, cp, buckets)
        if not fallback:
            return (cp, run[0], run[1]), False
        key = (cp, run[0], run[1])
        if key not in self._entries:
            self._entries[key] = _Entry(StaticBatch(cp, run[0], run[1], self.device), fallback_only=True)
        self._entries[(cp, bucket[0], bucket[1])].counters.fallbacks += 1
        return key, True

    def run(self, lengths: Sequence[int], fill: Optional[Callable[[StaticBatch], None]] = None, cp: int = 1) -> Any:
        """Runs the step for a batch of documents of `lengths` (in packing order) at CP size cp:
        sets the layout, calls fill(batch) to write the named buffers, then warms up,
        captures or replays. Returns the step's output (graph-owned tensors after capture:
        read or copy them before the next run of the same capacity)."""
        lengths = arguments.lengths("GraphBank.run", lengths)
        key, fallback = self._choose(lengths, arguments.cp_size("GraphBank.run", cp))
        entry = self._entries[key]
        batch = entry.batch
        batch.set_layout(lengths)
        if fill is not None:
            fill(batch)
        if fallback:
            entry.output = self.step(batch)
            return entry.output
        counters = entry.counters
        if counters.warmups < self.warmup_runs:
            self._side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._side):
                entry.output = self.step(batch)
            torch.cuda.current_stream(self.device).wait_stream(self._side)
            counters.warmups += 1
            return entry.output
        if entry.graph is None:
            graph = torch.cuda.CUDAGraph()
            torch.cuda.current_stream(self.device).synchronize()
            with torch.cuda.graph(graph):
                entry.output = self.step(batch)
            entry.graph = graph
            counters.captures += 1
        else:
            counters.replays += 1
        entry.graph.replay()
        return entry.output

    def counters(self) -> Dict[Tuple[int, int, int], KeyCounters]:
        """Per (cp, max_tokens, max_seqs): warmups, captures, replays, fallbacks."""
        return {key: entry.counters for key, entry in sorted(self._entries.items())}
