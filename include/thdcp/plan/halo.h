// The halo of AllGather CP: which key rows, held by other ranks, a rank's queries can reach.
//
// A rank's queries need the keys of their own documents that the mask lets them see. Under a
// left window (and any right one) these are a few runs of rows just before (and after) each
// of the rank's pieces: one halo per piece under the contiguous layout, one per chunk under
// the dual-chunk one. A halo gather moves only these rows (and, in the backward, returns only
// their dK/dV to the ranks that hold them) instead of every rank's K/V.
//
// The rows are exactly those the rank's AllGather segment table addresses
// (build_cp_segment_table: each segment's keys [k_row, k_row + k_len), global rows), less the
// rank's own: so an attention over the rank's rows plus its halo, placed at their global rows,
// reads what it would read after a whole gather. Host only; every rank computes every rank's
// halo from the global layout, so senders and receivers agree without exchanging sizes.
#pragma once

#include <cstdint>
#include <vector>

#include "thdcp/plan/contiguous.h"
#include "thdcp/plan/layout.h"
#include "thdcp/plan/mask.h"

namespace thdcp {

// Consecutive rows held by one rank that are consecutive in the global layout too.
struct HaloRun {
  int source_rank;     // the rank that holds the rows
  int64_t local_row;   // first of them in the source rank's local tensor
  int64_t global_row;  // first of them in the global layout (sequence order)
  int64_t rows;
};

// The halo of `rank` among `cp` ranks under `cp_layout` and `mask`: runs ordered by source
// rank, then by global row, never overlapping, never the rank's own rows; adjacent runs of a
// source are merged. `layout` is the batch's global layout (validate_cp_layout). Throws
// thdcp::Error on an invalid mask, cp, rank or layout.
std::vector<HaloRun> halo_rows(const LayoutView& layout, int cp, int rank, const Mask& mask,
                               CpLayout cp_layout = CpLayout::kDualChunk);

// Rows of a halo (all sources), or of its runs from `source_rank` only (-1: all).
int64_t halo_row_count(const std::vector<HaloRun>& halo, int source_rank = -1);

}  // namespace thdcp
