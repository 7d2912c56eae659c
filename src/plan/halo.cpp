#include "thdcp/plan/halo.h"

#include <algorithm>

#include "thdcp/core/error.h"
#include "thdcp/plan/segment_table.h"

namespace thdcp {

namespace {

// Where global row `global_row` lives, and the global row where that holding ends: the end of
// its rank's piece (contiguous) or of its chunk (dual chunk). Rows up to there are held by the
// same rank in consecutive local rows.
struct Holding {
  DualChunkLocation where;
  int64_t end_row;
};

Holding holding_of(const LayoutView& layout, int cp, CpLayout cp_layout, int64_t global_row) {
  const int64_t total = layout.total_rows();
  if (cp_layout == CpLayout::kContiguous) {
    const DualChunkLocation where = contiguous_locate_row(total, cp, global_row);
    return Holding{where, global_row - where.local_row + total / cp};
  }
  const int b = sequence_of_row(layout.cu_seqlens_padded, layout.num_seqs, global_row, 1);
  const int64_t start = layout.padded_start(b);
  const int64_t chunk_rows = dual_chunk_rows(layout.padded_length(b), cp);
  const int64_t chunk = (global_row - start) / chunk_rows;
  return Holding{dual_chunk_locate_row(layout.cu_seqlens_padded, layout.num_seqs, cp, global_row),
                 start + (chunk + 1) * chunk_rows};
}

}  // namespace

std::vector<HaloRun> halo_rows(const LayoutView& layout, int cp, int rank, const Mask& mask, CpLayout cp_layout) {
  const SegmentTable table = build_cp_segment_table(layout, cp, rank, mask, cp_layout);

  // The key rows the table addresses, as sorted, merged ranges of global rows.
  std::vector<PositionRange> keys;
  for (const Segment& s : table.segments) {
    if (s.q_len > 0 && s.k_len > 0) keys.push_back(PositionRange{s.k_row, int64_t{s.k_row} + s.k_len});
  }
  std::sort(keys.begin(), keys.end(), [](const PositionRange& a, const PositionRange& b) { return a.begin < b.begin; });
  std::vector<PositionRange> merged;
  for (const PositionRange& k : keys) {
    if (!merged.empty() && k.begin <= merged.back().end) {
      merged.back().end = std::max(merged.back().end, k.end);
    } else {
      merged.push_back(k);
    }
  }

  // Each range cut where its holder changes; the rank's own rows left out.
  std::vector<HaloRun> runs;
  for (const PositionRange& range : merged) {
    for (int64_t row = range.begin; row < range.end;) {
      const Holding h = holding_of(layout, cp, cp_layout, row);
      const int64_t rows = std::min(range.end, h.end_row) - row;
      if (h.where.rank != rank) runs.push_back(HaloRun{h.where.rank, h.where.local_row, row, rows});
      row += rows;
    }
  }
  std::stable_sort(runs.begin(), runs.end(),
                   [](const HaloRun& a, const HaloRun& b) { return a.source_rank < b.source_rank; });

  // Runs of one source that follow each other in both its local rows and the global rows.
  std::vector<HaloRun> halo;
  for (const HaloRun& run : runs) {
    if (!halo.empty()) {
      HaloRun& last = halo.back();
      if (last.source_rank == run.source_rank && last.local_row + last.rows == run.local_row &&
          last.global_row + last.rows == run.global_row) {
        last.rows += run.rows;
        continue;
      }
    }
    halo.push_back(run);
  }
  return halo;
}

int64_t halo_row_count(const std::vector<HaloRun>& halo, int source_rank) {
  int64_t rows = 0;
  for (const HaloRun& run : halo) {
    if (source_rank < 0 || run.source_rank == source_rank) rows += run.rows;
  }
  return rows;
}

}  // namespace thdcp
