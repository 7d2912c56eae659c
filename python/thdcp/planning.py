"""Capacities for CUDA graphs: the planner of `thdcp plan` and the capacity layouts."""
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import torch

from . import arguments
from .arguments import INT32_MAX, INT64_MAX

_ops = torch.ops.thdcp


def _max_tokens(op: str, value) -> int:
    return arguments.integer(op, "max_tokens", value, 1, INT64_MAX)


def _max_seqs(op: str, value) -> int:
    return arguments.integer(op, "max_seqs", value, 1, INT32_MAX)


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
    op = "plan_capacity"
    flat: List[int] = []
    sizes = []
    for b, batch in enumerate(batches):
        lengths = arguments.lengths(op, batch, "batches[%d]" % b)
        flat += lengths
        sizes.append(len(lengths))
    max_tokens = _max_tokens(op, max_tokens)
    cp = arguments.cp_size(op, cp)
    max_seqs, fallback, reason = _ops.plan_capacity(flat, sizes, max_tokens, cp, float(fallback_budget))
    return CapacityPlan(cp, max_tokens, int(max_seqs), float(fallback), str(reason))


def default_capacity(max_tokens: int, cp: int = 1) -> Tuple[int, int]:
    """(max_tokens, max_seqs) of the capacity no batch of max_tokens rows can exceed."""
    op = "default_capacity"
    tokens, seqs = _ops.default_capacity(_max_tokens(op, max_tokens), arguments.cp_size(op, cp))
    return int(tokens), int(seqs)


def fits(lengths: Sequence[int], cp: int, max_tokens: int, max_seqs: int) -> int:
    """0: fits; 1: too many documents; 2: too many tokens."""
    op = "fits"
    return int(_ops.check_fit(arguments.lengths(op, lengths), arguments.cp_size(op, cp), _max_tokens(op, max_tokens),
                              _max_seqs(op, max_seqs)))


def choose_capacity(lengths: Sequence[int], cp: int,
                    buckets: Sequence[Tuple[int, int]]) -> Tuple[Tuple[int, int], Tuple[int, int], bool]:
    """The graph bank's rule, from the C++ library (thdcp/plan/capacity.h): of the buckets
    (max_tokens, max_seqs) at CP size cp, the one the batch is counted against, the capacity
    it runs at, and whether that is the zero-fallback capacity (an eager run). Raises
    ValueError when the batch's rows fit no bucket."""
    op = "choose_capacity"
    tokens = [arguments.integer(op, "buckets[%d] max_tokens" % i, b[0], 1, INT64_MAX) for i, b in enumerate(buckets)]
    seqs = [arguments.integer(op, "buckets[%d] max_seqs" % i, b[1], 1, INT32_MAX) for i, b in enumerate(buckets)]
    b_tokens, b_seqs, r_tokens, r_seqs, fallback = _ops.choose_capacity(arguments.lengths(op, lengths),
                                                                        arguments.cp_size(op, cp), tokens, seqs)
    return (int(b_tokens), int(b_seqs)), (int(r_tokens), int(r_seqs)), bool(fallback)


def capacity_layout(lengths: Sequence[int], cp: int, max_tokens: int, max_seqs: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(cu_seqlens, cu_seqlens_padded), CPU int32 [max_seqs + 1], of `lengths` in the capacity
    (max_tokens, max_seqs) at CP size cp. Raises ValueError when they do not fit."""
    return _capacity_layout("capacity_layout", lengths, cp, max_tokens, max_seqs)


def _capacity_layout(op: str, lengths: Sequence[int], cp: int, max_tokens: int,
                     max_seqs: int, layout: str = "dual_chunk") -> Tuple[torch.Tensor, torch.Tensor]:
    max_seqs = _max_seqs(op, max_seqs)
    both = _ops.capacity_layout(arguments.lengths(op, lengths), arguments.cp_size(op, cp), _max_tokens(op, max_tokens),
                                max_seqs, layout)
    both = torch.tensor(both, dtype=torch.int32)
    return both[: max_seqs + 1].clone(), both[max_seqs + 1:].clone()


def choose_cp_size(lengths: Sequence[int], sizes: Sequence[int], rows_per_rank: int) -> int:
    """The smallest CP size of `sizes` whose ranks hold the batch in rows_per_rank rows each."""
    op = "choose_cp_size"
    return int(_ops.choose_cp_size(arguments.lengths(op, lengths), arguments.integers(op, "sizes", sizes, 1, INT32_MAX),
                                   arguments.integer(op, "rows_per_rank", rows_per_rank, 1, INT64_MAX)))
