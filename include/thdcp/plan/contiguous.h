// The CP layouts (how a batch's rows are split over the ranks) and the contiguous one's index
// math, next to the dual-chunk map (dual_chunk.h).
//
// Contiguous: the packed buffer of T rows is cut into cp equal pieces; rank r holds global
// rows [r T/cp, (r+1) T/cp) in order. T % cp == 0 is the only requirement: no document is
// padded for CP, tokens stay in order, and a document may start on one rank and end on
// another. A row keeps its global position within its document under either layout.
//
// Everything here compiles under nvcc and a plain C++17 compiler.
#pragma once

#include <cstdint>

#include "thdcp/core/host_device.h"
#include "thdcp/plan/dual_chunk.h"

namespace thdcp {

enum class CpLayout : int {
  kDualChunk = 0,   // DESIGN.md section 3: every P_b a multiple of 2*cp, chunks r and 2cp-1-r
  kContiguous = 1,  // cp equal pieces of the packed buffer; T % cp == 0
};

inline const char* cp_layout_name(CpLayout layout) {
  switch (layout) {
    case CpLayout::kDualChunk: return "dual_chunk";
    case CpLayout::kContiguous: return "contiguous";
  }
  return "?";
}

// Global row of local row `local_row` of `rank` under the contiguous layout of `total_rows`.
THDCP_HD int64_t contiguous_global_row(int64_t total_rows, int cp, int rank, int64_t local_row) {
  return static_cast<int64_t>(rank) * (total_rows / cp) + local_row;
}

// Rank and local row that hold global row `global_row` under the contiguous layout: the
// inverse of contiguous_global_row.
THDCP_HD DualChunkLocation contiguous_locate_row(int64_t total_rows, int cp, int64_t global_row) {
  const int64_t piece = total_rows / cp;
  const int64_t rank = global_row / piece;
  return DualChunkLocation{static_cast<int>(rank), global_row - rank * piece};
}

// The sequence and position (within it, from its first padded row) of local row `local_row`
// of `rank` under `layout`, from the global cu_seqlens_padded (num_seqs + 1 entries).
THDCP_HD DualChunkRow cp_layout_row(CpLayout layout, const int32_t* cu_seqlens_padded, int num_seqs, int cp,
                                    int rank, int64_t local_row) {
  if (layout == CpLayout::kDualChunk) return dual_chunk_row(cu_seqlens_padded, num_seqs, cp, rank, local_row);
  const int64_t global_row = contiguous_global_row(cu_seqlens_padded[num_seqs], cp, rank, local_row);
  const int b = sequence_of_row(cu_seqlens_padded, num_seqs, global_row, 1);
  return DualChunkRow{b, global_row - cu_seqlens_padded[b]};
}

}  // namespace thdcp
