// Segment tables in device memory (DESIGN.md section 4): every attention call of the CUDA
// backend, single-device or AllGather CP, takes one. A TablePlan builds it on the device from
// a batch's DeviceLayout, with the __host__ __device__ functions the host builders use
// (single_device_segment, cp_segment of thdcp/plan/segment.h), so nothing needs the lengths
// on the host.
//
// Plan, then run: TablePlan's factories check the capacity, mask, cp and rank once (host
// arithmetic); check() makes the pointer queries of a plan-time check; run() checks the
// layout's capacity against the plan and enqueues one small kernel of a fixed grid
// (capacity-sized: blocks past the real sequences write zero-length placeholders), so a whole
// step can be captured in a CUDA graph and replayed for any batch of the same capacity.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "thdcp/plan/contiguous.h"
#include "thdcp/plan/layout.h"
#include "thdcp/plan/mask.h"
#include "thdcp/plan/segment.h"

namespace thdcp::cuda {

// Which builder filled a device table. It bounds how many segments reach one key row
// (1 for a single-device or a contiguous AllGather-CP table, 2 for a dual-chunk one), which
// sizes the backward grid and keeps the fp32 dK/dV accumulation deterministic
// (AttentionOptions::deterministic).
enum class TableKind {
  kSingleDevice,
  kAllGatherCp,            // dual-chunk layout: two segments per sequence
  kContiguousAllGatherCp,  // contiguous layout: one segment per sequence
};

// Segments of a table of `kind` that reach one key row at most: the backward's dK/dV grid
// bound and its determinism argument.
inline int segments_per_key_row(TableKind kind) { return kind == TableKind::kAllGatherCp ? 2 : 1; }

// The kind's name in messages.
inline const char* table_kind_name(TableKind kind) {
  switch (kind) {
    case TableKind::kSingleDevice: return "single device";
    case TableKind::kAllGatherCp: return "AllGather CP, dual chunk";
    case TableKind::kContiguousAllGatherCp: return "AllGather CP, contiguous";
  }
  return "unknown";
}

// A segment table in device memory with a fixed capacity. Entries past the batch's real
// sequences are zero-length placeholders written by the builders, so the kernels see a
// fixed-size array and the table needs no host read-back.
struct DeviceSegmentTable {
  Segment* segments = nullptr;  // device array of `capacity` entries
  int capacity = 0;             // entries: max_seqs (single device, contiguous CP) or 2 * max_seqs
                                // (dual-chunk CP)
  int64_t q_rows = 0;           // rows of the Q/O tensors the table addresses
  int64_t k_rows = 0;           // rows of the K/V tensors the table addresses
  Mask mask;                    // the mask applied by the kernels (and used by the builders)
  TableKind kind = TableKind::kSingleDevice;
};

class TablePlan {
 public:
  // One segment per sequence (as thdcp::build_segment_table): queries and keys both address
  // the capacity's max_tokens rows.
  static TablePlan single_device(const Capacity& capacity, const Mask& mask);

  // The AllGather-CP table of `rank` of `cp` (as thdcp::build_cp_segment_table), queries
  // addressing the rank's max_tokens / cp local rows, keys the gathered K/V in sequence order
  // (max_tokens rows). The layouts it reads are global. Dual chunk: two segments per
  // sequence, every padded length a multiple of 2 * cp. Contiguous: one segment per sequence
  // (its rows inside the rank's piece), max_tokens a multiple of cp.
  static TablePlan all_gather_cp(const Capacity& capacity, int cp, int rank, const Mask& mask,
                                 CpLayout layout = CpLayout::kDualChunk);

  // The contiguous AllGather-CP table of `rank` whose keys are not every row but the rank's
  // rows with `left` rows before and `right` rows after them (its edge halo, as
  // cp::CudaPlan's halo gather assembles it: keys row i is global row rank_begin - left + i,
  // k_rows = left + max_tokens / cp + right). Every key the rank's queries can reach must lie
  // there: left >= mask.window_left >= 0 and right >= mask.window_right >= 0 (checked).
  static TablePlan contiguous_halo_cp(const Capacity& capacity, int cp, int rank, const Mask& mask, int64_t left,
                                      int64_t right);

  // The table run() returns, with `segments` null: the table part of an AttentionShape.
  const DeviceSegmentTable& table() const { return table_; }
  const Capacity& capacity() const { return capacity_; }

  // Bytes of the segment array run() writes (256-byte aligned size).
  size_t workspace_size() const;

  // Plan-time check (pointer queries: not for a path that may be captured): the layout's
  // capacity is the plan's, and its arrays and `segments` are device memory of the current
  // device. Throws thdcp::Error.
  void check(const DeviceLayout& layout, const Segment* segments) const;

  // Enqueues the build into `segments` (workspace_size() bytes of device memory) on `stream`
  // and returns the table. Checks with host arithmetic only that the layout's capacity is
  // the plan's and the pointers are given (its device contents are the caller's contract,
  // as for thdcp::validate_layout on the host). Capture-safe.
  DeviceSegmentTable run(const DeviceLayout& layout, Segment* segments, cudaStream_t stream) const;

 private:
  TablePlan() = default;

  DeviceSegmentTable table_;
  Capacity capacity_;
  int cp_ = 1;
  int rank_ = 0;
  int64_t key_row_offset_ = 0;  // global row of key row 0 minus rank_begin (whole: -rank_begin; halo: -left)
};

}  // namespace thdcp::cuda
