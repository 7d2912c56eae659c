// The rank split: a global THD tensor cut into the cp local tensors of a CP layout (the
// dual-chunk partition of DESIGN.md section 3, or the contiguous one of contiguous.h), and
// merged back. Dual-chunk layouts have every P_b a multiple of 2*cp; contiguous ones only
// T % cp == 0.
//
// Every function here works on rows of `row_bytes` bytes, so one implementation serves Q,
// K, V, O and their gradients of every dtype. lse ([H, T]) is H planes of T rows of 4 bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "thdcp/plan/contiguous.h"
#include "thdcp/plan/layout.h"

namespace thdcp {

// Global padded row of every local row of `rank` (T / cp entries, in local order).
std::vector<int32_t> rank_row_map(const LayoutView& layout, int cp, int rank,
                                  CpLayout cp_layout = CpLayout::kDualChunk);

// dst[i] = src[map[i]] for every i (rows of row_bytes bytes).
void gather_rows(const void* src, void* dst, const std::vector<int32_t>& map, size_t row_bytes);

// dst[map[i]] = src[i] for every i.
void scatter_rows(const void* src, void* dst, const std::vector<int32_t>& map, size_t row_bytes);

// The local tensor of `rank` from the global one ([T, ...] -> [T / cp, ...]).
void split_for_rank(const void* global, void* local, size_t row_bytes, const LayoutView& layout, int cp,
                    int rank, CpLayout cp_layout = CpLayout::kDualChunk);

// Writes the local tensor of `rank` into its rows of the global tensor.
void merge_from_rank(const void* local, void* global, size_t row_bytes, const LayoutView& layout, int cp,
                     int rank, CpLayout cp_layout = CpLayout::kDualChunk);

// Checks `layout` for `cp_layout` over `cp` ranks: validate_layout with every P_b a multiple
// of 2*cp (dual chunk), or any padding and total rows a multiple of cp (contiguous). Throws
// thdcp::Error naming the value and the rule.
void validate_cp_layout(const LayoutView& layout, int64_t total_rows, int cp, CpLayout cp_layout);

}  // namespace thdcp
