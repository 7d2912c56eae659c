// A global tensor's rows of one CP rank, and back: the dual-chunk split of
// thdcp/plan/rank_split.h over host tensors, as the commands hand each rank its rows and
// collect its results.
#pragma once

#include <cstdint>
#include <vector>

#include "thdcp/core/tensor.h"
#include "thdcp/plan/layout.h"

namespace thdcp::tools {

// The local tensor of `rank` (T/cp rows in dual-chunk order) of a global [T, H, D] tensor.
HostTensor split_for_rank(const HostTensor& global, const LayoutView& layout, int cp, int rank);
// Writes the local rows of `rank` into their rows of `global`.
void merge_from_rank(const HostTensor& local, HostTensor& global, const LayoutView& layout, int cp, int rank);

// The same for lse, `heads` rows of T floats ([H, T]; locally [H, T/cp]).
std::vector<float> split_lse_for_rank(const std::vector<float>& global, int64_t heads, const LayoutView& layout,
                                      int cp, int rank);
void merge_lse_from_rank(const std::vector<float>& local, std::vector<float>& global, int64_t heads,
                         const LayoutView& layout, int cp, int rank);

}  // namespace thdcp::tools
