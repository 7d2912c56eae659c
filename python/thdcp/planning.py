"""Capacities for CUDA graphs: the planner of `thdcp plan` and the capacity layouts."""
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import torch

_ops = torch.ops.thdcp


@dataclass(frozen=True)
class CapacityPlan:
    """A recommended capacity: graphs are captured for (max_tokens, max_seqs) per CP size."""

    cp: int
    max_tokens: int
    max_seqs: int
    fallback_fraction: float  # batches of the sample with more documents than max_seqs - 1
    reason: str


def plan_capacity(batches: Sequence[Sequence[int]], max_tokens: int, cp: int = 1,
                  fallback_budget: float = 0.01) -> CapacityPlan:
    """The capacity `thdcp plan` recommends for batches of document lengths (a sample of the
    training data): the smallest document count whose fallback fraction is within
    fallback_budget, or the zero-fallback max_tokens / (2 cp) + 1 when that costs little more."""
    flat: List[int] = [int(n) for batch in batches for n in batch]
    sizes = [len(batch) for batch in batches]
    max_seqs, fallback, reason = _ops.plan_capacity(flat, sizes, int(max_tokens), int(cp), float(fallback_budget))
    return CapacityPlan(int(cp), int(max_tokens), int(max_seqs), float(fallback), str(reason))


def default_capacity(max_tokens: int, cp: int = 1) -> Tuple[int, int]:
    """(max_tokens, max_seqs) of the capacity no batch of max_tokens rows can exceed."""
    tokens, seqs = _ops.default_capacity(int(max_tokens), int(cp))
    return int(tokens), int(seqs)


def fits(lengths: Sequence[int], cp: int, max_tokens: int, max_seqs: int) -> int:
    """0: fits; 1: too many documents; 2: too many tokens."""
    return int(_ops.check_fit([int(n) for n in lengths], int(cp), int(max_tokens), int(max_seqs)))


def choose_capacity(lengths: Sequence[int], cp: int,
                    buckets: Sequence[Tuple[int, int]]) -> Tuple[Tuple[int, int], Tuple[int, int], bool]:
    """The graph bank's rule, from the C++ library (thdcp/plan/capacity.h): of the buckets
    (max_tokens, max_seqs) at CP size cp, the one the batch is counted against, the capacity
    it runs at, and whether that is the zero-fallback capacity (an eager run). Raises
    ValueError when the batch's rows fit no bucket."""
    tokens = [int(b[0]) for b in buckets]
    seqs = [int(b[1]) for b in buckets]
    b_tokens, b_seqs, r_tokens, r_seqs, fallback = _ops.choose_capacity([int(n) for n in lengths], int(cp), tokens,
                                                                        seqs)
    return (int(b_tokens), int(b_seqs)), (int(r_tokens), int(r_seqs)), bool(fallback)


def capacity_layout(lengths: Sequence[int], cp: int, max_tokens: int, max_seqs: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(cu_seqlens, cu_seqlens_padded), CPU int32 [max_seqs + 1], of `lengths` in the capacity
    (max_tokens, max_seqs) at CP size cp. Raises ValueError when they do not fit."""
    both = _ops.capacity_layout([int(n) for n in lengths], int(cp), int(max_tokens), int(max_seqs))
    both = torch.tensor(both, dtype=torch.int32)
    return both[: max_seqs + 1].clone(), both[max_seqs + 1:].clone()


def choose_cp_size(lengths: Sequence[int], sizes: Sequence[int], rows_per_rank: int) -> int:
    """The smallest CP size of `sizes` whose ranks hold the batch in rows_per_rank rows each."""
    return int(_ops.choose_cp_size([int(n) for n in lengths], [int(s) for s in sizes], int(rows_per_rank)))
