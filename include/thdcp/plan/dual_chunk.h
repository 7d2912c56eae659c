// The dual-chunk context-parallel partition (DESIGN.md section 3), in one place.
//
// Sequence b (padded length P_b, a multiple of 2*cp) is cut into 2*cp chunks of
// c_b = P_b / (2*cp) rows. Rank r holds chunk r followed by chunk 2*cp-1-r, so every rank
// gets one early and one late chunk and the causal work is balanced. The local tensor of
// a rank concatenates these two-chunk blocks sequence by sequence: the local padded offset
// of sequence b is cu_seqlens_padded[b] / cp.
//
// The planner, the CPU reference, the reorder kernels and RoPE all call these functions;
// no other file repeats this arithmetic. Everything here compiles under nvcc and a plain
// C++17 compiler.
#pragma once

#include <cstdint>

#include "thdcp/core/host_device.h"

namespace thdcp {

// Rows of one chunk of a sequence whose padded length is padded_len.
THDCP_HD int64_t dual_chunk_rows(int64_t padded_len, int cp) {
  return padded_len / (2 * static_cast<int64_t>(cp));
}

// Chunk index held by `rank` in `slot` (0: the early chunk, 1: the late one).
THDCP_HD int dual_chunk_index(int cp, int rank, int slot) {
  return slot == 0 ? rank : 2 * cp - 1 - rank;
}

// Valid (non-padding) rows of chunk `chunk`: clamp(L - chunk * c, 0, c).
THDCP_HD int64_t dual_chunk_valid_rows(int64_t length, int64_t chunk_rows, int chunk) {
  const int64_t rest = length - static_cast<int64_t>(chunk) * chunk_rows;
  return rest < 0 ? 0 : (rest > chunk_rows ? chunk_rows : rest);
}

// Position within its sequence of local row `local_row` (0 <= local_row < 2 * chunk_rows)
// of a sequence on `rank`.
THDCP_HD int64_t dual_chunk_position(int64_t local_row, int64_t chunk_rows, int cp, int rank) {
  return local_row < chunk_rows
             ? static_cast<int64_t>(rank) * chunk_rows + local_row
             : static_cast<int64_t>(2 * cp - 1 - rank) * chunk_rows + (local_row - chunk_rows);
}

// Where position `position` of a sequence lives: the rank and the local row within the
// sequence's two-chunk block on that rank. Inverse of dual_chunk_position.
struct DualChunkLocation {
  int rank;
  int64_t local_row;
};

THDCP_HD DualChunkLocation dual_chunk_locate(int64_t position, int64_t chunk_rows, int cp) {
  const int64_t chunk = position / chunk_rows;
  const int64_t offset = position - chunk * chunk_rows;
  if (chunk < cp) return {static_cast<int>(chunk), offset};
  return {static_cast<int>(2 * cp - 1 - chunk), chunk_rows + offset};
}

// Index b of the sequence that physical row `row` belongs to: the largest b < num_seqs
// with offsets[b] / divisor <= row. Zero-length sequences are skipped over because a
// later entry with the same offset wins. `offsets` is cu_seqlens_padded (num_seqs + 1
// entries); divisor 1 searches the global layout, divisor cp a rank's local layout.
THDCP_HD int sequence_of_row(const int32_t* offsets, int num_seqs, int64_t row, int divisor) {
  int lo = 0;
  int hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (offsets[mid] / divisor <= row) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// The sequence that local row `local_row` of `rank` belongs to, and the row's position
// within that sequence (counted from its first padded row, so padding rows get positions
// past the valid ones).
struct DualChunkRow {
  int sequence;
  int64_t position;
};

THDCP_HD DualChunkRow dual_chunk_row(const int32_t* cu_seqlens_padded, int num_seqs, int cp, int rank,
                                     int64_t local_row) {
  const int b = sequence_of_row(cu_seqlens_padded, num_seqs, local_row, cp);
  const int64_t global_start = cu_seqlens_padded[b];
  const int64_t chunk_rows = dual_chunk_rows(cu_seqlens_padded[b + 1] - global_start, cp);
  const int64_t j = local_row - global_start / cp;
  return DualChunkRow{b, dual_chunk_position(j, chunk_rows, cp, rank)};
}

// Global padded row of local row `local_row` on `rank`.
THDCP_HD int64_t dual_chunk_global_row(const int32_t* cu_seqlens_padded, int num_seqs, int cp,
                                       int rank, int64_t local_row) {
  const DualChunkRow row = dual_chunk_row(cu_seqlens_padded, num_seqs, cp, rank, local_row);
  return cu_seqlens_padded[row.sequence] + row.position;
}

// Rank and local row that hold global padded row `global_row`.
THDCP_HD DualChunkLocation dual_chunk_locate_row(const int32_t* cu_seqlens_padded, int num_seqs,
                                                 int cp, int64_t global_row) {
  const int b = sequence_of_row(cu_seqlens_padded, num_seqs, global_row, 1);
  const int64_t global_start = cu_seqlens_padded[b];
  const int64_t chunk_rows = dual_chunk_rows(cu_seqlens_padded[b + 1] - global_start, cp);
  DualChunkLocation where = dual_chunk_locate(global_row - global_start, chunk_rows, cp);
  where.local_row += global_start / cp;
  return where;
}

}  // namespace thdcp
