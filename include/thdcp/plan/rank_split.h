// The rank split: a global THD tensor cut into the cp local tensors of the dual-chunk
// partition (DESIGN.md section 3), and merged back.
//
// Every function here works on rows of `row_bytes` bytes, so one implementation serves Q,
// K, V, O and their gradients of every dtype. lse ([H, T]) is H planes of T rows of 4 bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "thdcp/plan/layout.h"

namespace thdcp {

// Global padded row of every local row of `rank` (T / cp entries, in local order).
std::vector<int32_t> rank_row_map(const LayoutView& layout, int cp, int rank);

// dst[i] = src[map[i]] for every i (rows of row_bytes bytes).
void gather_rows(const void* src, void* dst, const std::vector<int32_t>& map, size_t row_bytes);

// dst[map[i]] = src[i] for every i.
void scatter_rows(const void* src, void* dst, const std::vector<int32_t>& map, size_t row_bytes);

// The local tensor of `rank` from the global one ([T, ...] -> [T / cp, ...]).
void split_for_rank(const void* global, void* local, size_t row_bytes, const LayoutView& layout, int cp,
                    int rank);

// Writes the local tensor of `rank` into its rows of the global tensor.
void merge_from_rank(const void* local, void* global, size_t row_bytes, const LayoutView& layout, int cp,
                     int rank);

}  // namespace thdcp
