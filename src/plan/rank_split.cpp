#include "thdcp/plan/rank_split.h"

#include <cstring>

#include "thdcp/plan/dual_chunk.h"
#include "thdcp/core/error.h"

namespace thdcp {

void validate_cp_layout(const LayoutView& layout, int64_t total_rows, int cp, CpLayout cp_layout) {
  THDCP_CHECK(cp >= 1, "cp=" << cp << " must be >= 1");
  THDCP_CHECK(cp_layout == CpLayout::kDualChunk || cp_layout == CpLayout::kContiguous,
              "CpLayout " << static_cast<int>(cp_layout) << " is not a layout: use kDualChunk or kContiguous");
  if (cp_layout == CpLayout::kDualChunk) {
    validate_layout(layout, total_rows, cp);
    return;
  }
  validate_layout(layout, total_rows, 0);
  THDCP_CHECK(total_rows % cp == 0, "the batch has " << total_rows << " rows, not a multiple of cp=" << cp
                                                     << ": the contiguous layout cuts the rows into cp equal "
                                                        "pieces; pad the last sequence to a multiple of cp rows");
}

std::vector<int32_t> rank_row_map(const LayoutView& layout, int cp, int rank, CpLayout cp_layout) {
  THDCP_CHECK(cp >= 1, "cp=" << cp << " must be >= 1");
  THDCP_CHECK(rank >= 0 && rank < cp, "rank=" << rank << " must be in [0, cp=" << cp << ")");
  validate_cp_layout(layout, layout.total_rows(), cp, cp_layout);
  std::vector<int32_t> map(static_cast<size_t>(layout.total_rows() / cp));
  if (cp_layout == CpLayout::kContiguous) {
    for (size_t j = 0; j < map.size(); ++j) {
      map[j] = static_cast<int32_t>(contiguous_global_row(layout.total_rows(), cp, rank, static_cast<int64_t>(j)));
    }
    return map;
  }
  for (int b = 0; b < layout.num_seqs; ++b) {
    const int64_t start = layout.padded_start(b);
    const int64_t chunk_rows = dual_chunk_rows(layout.padded_length(b), cp);
    const int64_t local_start = start / cp;
    for (int64_t j = 0; j < 2 * chunk_rows; ++j) {
      map[local_start + j] = static_cast<int32_t>(start + dual_chunk_position(j, chunk_rows, cp, rank));
    }
  }
  return map;
}

void gather_rows(const void* src, void* dst, const std::vector<int32_t>& map, size_t row_bytes) {
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  for (size_t i = 0; i < map.size(); ++i) {
    std::memcpy(out + i * row_bytes, in + static_cast<size_t>(map[i]) * row_bytes, row_bytes);
  }
}

void scatter_rows(const void* src, void* dst, const std::vector<int32_t>& map, size_t row_bytes) {
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  for (size_t i = 0; i < map.size(); ++i) {
    std::memcpy(out + static_cast<size_t>(map[i]) * row_bytes, in + i * row_bytes, row_bytes);
  }
}

void split_for_rank(const void* global, void* local, size_t row_bytes, const LayoutView& layout, int cp,
                    int rank, CpLayout cp_layout) {
  gather_rows(global, local, rank_row_map(layout, cp, rank, cp_layout), row_bytes);
}

void merge_from_rank(const void* local, void* global, size_t row_bytes, const LayoutView& layout, int cp,
                     int rank, CpLayout cp_layout) {
  scatter_rows(local, global, rank_row_map(layout, cp, rank, cp_layout), row_bytes);
}

}  // namespace thdcp
