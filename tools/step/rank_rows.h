// A global tensor's rows of one CP rank, and back: the split of thdcp/plan/rank_split.h
// (dual-chunk or contiguous) over host tensors, as the commands hand each rank its rows and
// collect its results.
#pragma once

#include <cstdint>
#include <vector>

#include "thdcp/core/tensor.h"
#include "thdcp/plan/contiguous.h"
#include "thdcp/plan/layout.h"

namespace thdcp::tools {

// The local tensor of `rank` (T/cp rows in the order of `cp_layout`) of a global [T, H, D]
// tensor.
HostTensor split_for_rank(const HostTensor& global, const LayoutView& layout, int cp, int rank,
                          CpLayout cp_layout = CpLayout::kDualChunk);
// Writes the local rows of `rank` into their rows of `global`.
void merge_from_rank(const HostTensor& local, HostTensor& global, const LayoutView& layout, int cp, int rank,
                     CpLayout cp_layout = CpLayout::kDualChunk);

// The same for lse, `heads` rows of T floats ([H, T]; locally [H, T/cp]).
std::vector<float> split_lse_for_rank(const std::vector<float>& global, int64_t heads, const LayoutView& layout,
                                      int cp, int rank, CpLayout cp_layout = CpLayout::kDualChunk);
void merge_lse_from_rank(const std::vector<float>& local, std::vector<float>& global, int64_t heads,
                         const LayoutView& layout, int cp, int rank, CpLayout cp_layout = CpLayout::kDualChunk);

}  // namespace thdcp::tools
