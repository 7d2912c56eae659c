#include "thdcp/plan/segment_table.h"

#include <algorithm>

#include "thdcp/core/error.h"
#include "thdcp/plan/rank_split.h"

namespace thdcp {

void check_mask(const Mask& mask) {
  // Every negative value means "unbounded"; only -1 is documented, so reject the rest
  // rather than guess what the caller meant.
  THDCP_CHECK(mask.window_left >= -1, "window_left=" << mask.window_left << " must be >= 0, or -1 for unbounded");
  THDCP_CHECK(mask.window_right >= -1,
              "window_right=" << mask.window_right << " must be >= 0, or -1 for unbounded");
}

SegmentTable build_segment_table(const LayoutView& layout, const Mask& mask) {
  check_mask(mask);
  validate_layout(layout, layout.total_rows(), 0);
  SegmentTable table;
  table.mask = mask;
  table.q_rows = table.k_rows = layout.total_rows();
  table.segments.reserve(layout.num_seqs);
  for (int b = 0; b < layout.num_seqs; ++b) {
    table.segments.push_back(
        single_device_segment(layout.padded_start(b), layout.padded_length(b), layout.length(b)));
  }
  return table;
}

SegmentTable build_cp_segment_table(const LayoutView& layout, int cp, int rank, const Mask& mask,
                                    CpLayout cp_layout) {
  check_mask(mask);
  THDCP_CHECK(cp >= 1, "cp=" << cp << " must be >= 1");
  THDCP_CHECK(rank >= 0 && rank < cp, "rank=" << rank << " must be in [0, cp=" << cp << ")");
  validate_cp_layout(layout, layout.total_rows(), cp, cp_layout);
  SegmentTable table;
  table.mask = mask;
  table.q_rows = layout.total_rows() / cp;
  table.k_rows = layout.total_rows();
  if (cp_layout == CpLayout::kContiguous) {
    const int64_t rank_begin = contiguous_global_row(layout.total_rows(), cp, rank, 0);
    table.segments.reserve(static_cast<size_t>(layout.num_seqs));
    for (int b = 0; b < layout.num_seqs; ++b) {
      table.segments.push_back(contiguous_segment(layout.padded_start(b), layout.padded_length(b), layout.length(b),
                                                  rank_begin, rank_begin + table.q_rows, mask));
    }
    return table;
  }
  table.segments.reserve(2 * static_cast<size_t>(layout.num_seqs));
  for (int b = 0; b < layout.num_seqs; ++b) {
    for (int slot = 0; slot < 2; ++slot) {
      table.segments.push_back(cp_segment(layout.padded_start(b), layout.padded_length(b),
                                          layout.length(b), cp, rank, slot, mask));
    }
  }
  return table;
}

void validate_segment_table(const SegmentTable& table) {
  check_mask(table.mask);
  std::vector<std::pair<int64_t, int64_t>> q_blocks;
  q_blocks.reserve(table.segments.size());
  for (size_t i = 0; i < table.segments.size(); ++i) {
    const Segment& s = table.segments[i];
    THDCP_CHECK(s.q_len >= 0 && s.q_span >= s.q_len && s.q_row >= 0 &&
                    static_cast<int64_t>(s.q_row) + s.q_span <= table.q_rows,
                "segment " << i << ": query rows [" << s.q_row << ", " << s.q_row << "+" << s.q_span
                           << ") with q_len=" << s.q_len << " do not fit a Q tensor of " << table.q_rows
                           << " rows (need 0 <= q_len <= q_span)");
    THDCP_CHECK(s.k_len >= 0 && s.k_row >= 0 && static_cast<int64_t>(s.k_row) + s.k_len <= table.k_rows,
                "segment " << i << ": key rows [" << s.k_row << ", " << s.k_row << "+" << s.k_len
                           << ") do not fit a K/V tensor of " << table.k_rows << " rows");
    THDCP_CHECK(s.q_pos >= 0 && s.k_pos >= 0,
                "segment " << i << ": positions q_pos=" << s.q_pos << ", k_pos=" << s.k_pos << " must be >= 0");
    q_blocks.emplace_back(s.q_row, static_cast<int64_t>(s.q_row) + s.q_span);
  }
  std::sort(q_blocks.begin(), q_blocks.end());
  for (size_t i = 1; i < q_blocks.size(); ++i) {
    THDCP_CHECK(q_blocks[i].first >= q_blocks[i - 1].second,
                "segment query blocks [" << q_blocks[i - 1].first << ", " << q_blocks[i - 1].second << ") and ["
                                         << q_blocks[i].first << ", " << q_blocks[i].second
                                         << ") overlap: each query row belongs to one segment");
  }
}

int64_t table_pairs(const SegmentTable& table) {
  int64_t pairs = 0;
  for (const Segment& s : table.segments) pairs += segment_pairs(s, table.mask);
  return pairs;
}

}  // namespace thdcp
