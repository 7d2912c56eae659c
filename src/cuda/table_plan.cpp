// TablePlan: the device segment tables of the single-device and AllGather-CP calls (either CP
// layout), checked
// once and built by one small kernel per call (segment_table.cu).
#include <limits>

#include "attention_checks.h"
#include "table_kernels.h"
#include "thdcp/core/error.h"
#include "thdcp/core/workspace.h"
#include "thdcp/cuda/table.h"

namespace thdcp::cuda {

namespace {

void check_capacity(const Capacity& capacity) {
  THDCP_CHECK(capacity.max_seqs >= 1,
              "capacity.max_seqs=" << capacity.max_seqs << " must be >= 1 (layouts have max_seqs + 1 entries)");
  THDCP_CHECK(capacity.max_tokens >= 0 && capacity.max_tokens <= std::numeric_limits<int32_t>::max(),
              "capacity.max_tokens=" << capacity.max_tokens << " must be in [0, 2^31): the rows of the tensors");
}

void check_layout_matches(const DeviceLayout& layout, const Capacity& planned) {
  THDCP_CHECK(layout.cu_seqlens != nullptr && layout.cu_seqlens_padded != nullptr,
              "layout.cu_seqlens and layout.cu_seqlens_padded must be device arrays of max_seqs + 1 = "
                  << planned.max_seqs + 1 << " int32 entries");
  THDCP_CHECK(layout.capacity.max_seqs == planned.max_seqs && layout.capacity.max_tokens == planned.max_tokens,
              "layout.capacity (max_seqs=" << layout.capacity.max_seqs << ", max_tokens="
                                           << layout.capacity.max_tokens << ") differs from the plan's (max_seqs="
                                           << planned.max_seqs << ", max_tokens=" << planned.max_tokens
                                           << "): pass the layout in the capacity form the plan was made for");
}

}  // namespace

TablePlan TablePlan::single_device(const Capacity& capacity, const Mask& mask) {
  check_capacity(capacity);
  check_mask(mask);
  TablePlan plan;
  plan.capacity_ = capacity;
  plan.table_.capacity = capacity.max_seqs;
  plan.table_.q_rows = plan.table_.k_rows = capacity.max_tokens;
  plan.table_.mask = mask;
  plan.table_.kind = TableKind::kSingleDevice;
  return plan;
}

TablePlan TablePlan::all_gather_cp(const Capacity& capacity, int cp, int rank, const Mask& mask, CpLayout layout) {
  check_capacity(capacity);
  check_mask(mask);
  THDCP_CHECK(cp >= 1, "cp=" << cp << " must be >= 1");
  THDCP_CHECK(rank >= 0 && rank < cp, "rank=" << rank << " must be in [0, cp=" << cp << ")");
  THDCP_CHECK(layout == CpLayout::kDualChunk || layout == CpLayout::kContiguous,
              "layout=" << static_cast<int>(layout) << " is not a CP layout: use kDualChunk or kContiguous");
  const bool dual_chunk = layout == CpLayout::kDualChunk;
  const int64_t rows_multiple = (dual_chunk ? 2 : 1) * static_cast<int64_t>(cp);
  THDCP_CHECK(capacity.max_tokens % rows_multiple == 0,
              "capacity.max_tokens=" << capacity.max_tokens << " is not a multiple of " << (dual_chunk ? "2*" : "")
                                     << "cp=" << rows_multiple << " (layout=" << cp_layout_name(layout) << ")");
  THDCP_CHECK(capacity.max_seqs <= std::numeric_limits<int32_t>::max() / 2,
              "capacity.max_seqs=" << capacity.max_seqs << " is too large for a CP table of 2 entries each");
  TablePlan plan;
  plan.capacity_ = capacity;
  plan.cp_ = cp;
  plan.rank_ = rank;
  plan.table_.capacity = (dual_chunk ? 2 : 1) * capacity.max_seqs;
  plan.table_.q_rows = capacity.max_tokens / cp;
  plan.table_.k_rows = capacity.max_tokens;
  plan.table_.mask = mask;
  plan.table_.kind = dual_chunk ? TableKind::kAllGatherCp : TableKind::kContiguousAllGatherCp;
  // The whole gather's key row 0 is global row 0 (contiguous_halo_cp overrides this).
  plan.key_row_offset_ = -plan.table_.q_rows * rank;
  return plan;
}

TablePlan TablePlan::contiguous_halo_cp(const Capacity& capacity, int cp, int rank, const Mask& mask, int64_t left,
                                        int64_t right) {
  TablePlan plan = all_gather_cp(capacity, cp, rank, mask, CpLayout::kContiguous);
  THDCP_CHECK(mask.window_left >= 0 && mask.window_right >= 0,
              "a halo table needs a window on both sides (window " << mask.window_left << ", " << mask.window_right
                                                                   << "): without one every key may be reached");
  THDCP_CHECK(left >= mask.window_left && right >= mask.window_right && left >= 0 && right >= 0,
              "halo rows (left " << left << ", right " << right << ") do not cover the window (" << mask.window_left
                                 << ", " << mask.window_right << ")");
  THDCP_CHECK(left + plan.table_.q_rows + right <= std::numeric_limits<int32_t>::max(),
              "halo table of " << left + plan.table_.q_rows + right << " key rows does not fit int32");
  plan.table_.k_rows = left + plan.table_.q_rows + right;
  plan.key_row_offset_ = -left;
  return plan;
}

size_t TablePlan::workspace_size() const {
  return align_workspace(sizeof(Segment) * static_cast<size_t>(table_.capacity));
}

void TablePlan::check(const DeviceLayout& layout, const Segment* segments) const {
  check_layout_matches(layout, capacity_);
  const int device = detail::current_device();
  detail::check_device_pointer("layout.cu_seqlens", layout.cu_seqlens, device, alignof(int32_t));
  detail::check_device_pointer("layout.cu_seqlens_padded", layout.cu_seqlens_padded, device, alignof(int32_t));
  detail::check_device_pointer("segments", segments, device, alignof(Segment));
}

DeviceSegmentTable TablePlan::run(const DeviceLayout& layout, Segment* segments, cudaStream_t stream) const {
  check_layout_matches(layout, capacity_);
  THDCP_CHECK(segments != nullptr, "segments is a null pointer: pass workspace_size() bytes of device memory");
  if (table_.kind == TableKind::kSingleDevice) {
    detail::launch_build_single_table(layout.cu_seqlens, layout.cu_seqlens_padded, capacity_.max_seqs, segments,
                                      stream);
  } else if (table_.kind == TableKind::kAllGatherCp) {
    detail::launch_build_cp_table(layout.cu_seqlens, layout.cu_seqlens_padded, capacity_.max_seqs, cp_, rank_,
                                  table_.mask, segments, stream);
  } else {
    detail::launch_build_contiguous_cp_table(layout.cu_seqlens, layout.cu_seqlens_padded, capacity_.max_seqs,
                                             table_.q_rows * rank_, table_.q_rows, key_row_offset_, table_.mask,
                                             segments, stream);
  }
  DeviceSegmentTable table = table_;
  table.segments = segments;
  return table;
}

}  // namespace thdcp::cuda
