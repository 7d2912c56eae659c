// Host-side segment tables (DESIGN.md section 4). The CUDA backend builds the same tables
// on the device from the same per-segment formulas (thdcp/segment.h).
#pragma once

#include <cstdint>
#include <vector>

#include "thdcp/plan/contiguous.h"
#include "thdcp/plan/layout.h"
#include "thdcp/plan/mask.h"
#include "thdcp/plan/segment.h"

namespace thdcp {

struct SegmentTable {
  std::vector<Segment> segments;
  int64_t q_rows = 0;  // rows of the Q/O tensors the table addresses
  int64_t k_rows = 0;  // rows of the K/V tensors the table addresses
  Mask mask;           // the mask the key ranges were restricted for
};

// One segment per sequence; Q and K/V share the layout.
SegmentTable build_segment_table(const LayoutView& layout, const Mask& mask);

// AllGather CP, rank `rank` of `cp`. `layout` is the global layout (validate_cp_layout);
// queries address the rank's local tensor (T / cp rows), keys the gathered K/V in sequence
// order (T rows). Dual chunk: two segments per sequence, one per chunk; contiguous: one per
// sequence (empty for the sequences with no row on the rank).
SegmentTable build_cp_segment_table(const LayoutView& layout, int cp, int rank, const Mask& mask,
                                    CpLayout cp_layout = CpLayout::kDualChunk);

// Checks that every segment lies inside the tensors, that q_len <= q_span and that query
// blocks do not overlap (each output row has one writer). Throws thdcp::Error.
void validate_segment_table(const SegmentTable& table);

// Total (query, key) pairs the table allows under its mask.
int64_t table_pairs(const SegmentTable& table);

}  // namespace thdcp
