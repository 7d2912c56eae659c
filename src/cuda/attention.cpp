// Host side of the CUDA backend that is not a plan: the kernel family of a device, the
// device table builders, and the one-shot wrappers over the plans (forward_plan.cpp,
// backward_plan.cpp). Nothing here reads device memory or synchronises.
#include "thdcp/cuda/attention.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "attention_checks.h"
#include "launch.h"
#include "thdcp/core/error.h"
#include "thdcp/cuda/check.h"
#include "thdcp/plan/segment_table.h"

namespace thdcp::cuda {

namespace detail {

bool use_sm90_kernels() {
  static const bool portable = [] {
    const char* value = std::getenv("THDCP_PORTABLE_KERNELS");
    return value != nullptr && std::strcmp(value, "1") == 0;
  }();
  if (portable) return false;
  // Per device, looked up once (attribute queries do not touch a stream).
  constexpr int kMaxDevices = 64;
  static std::atomic<int> major[kMaxDevices];
  int device = 0;
  THDCP_CHECK_CUDA(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices) return false;
  if (major[device].load() == 0) {
    int value = 0;
    THDCP_CHECK_CUDA(cudaDeviceGetAttribute(&value, cudaDevAttrComputeCapabilityMajor, device));
    major[device].store(value);
  }
  return major[device].load() == 9;
}

}  // namespace detail

const char* kernel_family() { return detail::use_sm90_kernels() ? "sm90" : "portable"; }

bool cuda_supports_head_dim(int64_t head_dim) { return head_dim == 64 || head_dim == 128; }

int segment_table_capacity(TableKind kind, int max_seqs) {
  THDCP_CHECK(max_seqs >= 0, "max_seqs=" << max_seqs << " must be >= 0");
  return kind == TableKind::kAllGatherCp ? 2 * max_seqs : max_seqs;
}

DeviceSegmentTable build_segment_table(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded, int max_seqs,
                                       int64_t total_rows, const Mask& mask, Segment* segments,
                                       cudaStream_t stream) {
  check_mask(mask);
  THDCP_CHECK(max_seqs >= 1, "max_seqs=" << max_seqs << " must be >= 1");
  THDCP_CHECK(total_rows >= 0 && total_rows <= std::numeric_limits<int32_t>::max(),
              "total_rows=" << total_rows << " must be in [0, 2^31)");
  const int device = detail::current_device();
  detail::check_device_pointer("cu_seqlens", cu_seqlens, device, alignof(int32_t));
  detail::check_device_pointer("cu_seqlens_padded", cu_seqlens_padded, device, alignof(int32_t));
  detail::check_device_pointer("segments", segments, device, alignof(Segment));
  return enqueue_segment_table(cu_seqlens, cu_seqlens_padded, max_seqs, total_rows, mask, segments, stream);
}

DeviceSegmentTable enqueue_segment_table(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded, int max_seqs,
                                         int64_t total_rows, const Mask& mask, Segment* segments,
                                         cudaStream_t stream) {
  detail::launch_build_single_table(cu_seqlens, cu_seqlens_padded, max_seqs, segments, stream);
  DeviceSegmentTable table = single_device_table(max_seqs, total_rows, mask);
  table.segments = segments;
  return table;
}

DeviceSegmentTable single_device_table(int max_seqs, int64_t total_rows, const Mask& mask) {
  DeviceSegmentTable table;
  table.capacity = segment_table_capacity(TableKind::kSingleDevice, max_seqs);
  table.q_rows = table.k_rows = total_rows;
  table.mask = mask;
  table.kind = TableKind::kSingleDevice;
  return table;
}

DeviceSegmentTable build_cp_segment_table(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded,
                                          int max_seqs, int64_t total_rows, int cp, int rank, const Mask& mask,
                                          Segment* segments, cudaStream_t stream) {
  check_mask(mask);
  THDCP_CHECK(max_seqs >= 1, "max_seqs=" << max_seqs << " must be >= 1");
  THDCP_CHECK(cp >= 1, "cp=" << cp << " must be >= 1");
  THDCP_CHECK(rank >= 0 && rank < cp, "rank=" << rank << " must be in [0, cp=" << cp << ")");
  THDCP_CHECK(total_rows >= 0 && total_rows <= std::numeric_limits<int32_t>::max(),
              "total_rows=" << total_rows << " must be in [0, 2^31)");
  THDCP_CHECK(total_rows % (2 * static_cast<int64_t>(cp)) == 0,
              "total_rows=" << total_rows << " is not a multiple of 2*cp=" << 2 * cp);
  const int device = detail::current_device();
  detail::check_device_pointer("cu_seqlens", cu_seqlens, device, alignof(int32_t));
  detail::check_device_pointer("cu_seqlens_padded", cu_seqlens_padded, device, alignof(int32_t));
  detail::check_device_pointer("segments", segments, device, alignof(Segment));
  return enqueue_cp_segment_table(cu_seqlens, cu_seqlens_padded, max_seqs, total_rows, cp, rank, mask, segments,
                                  stream);
}

namespace {

// The description of an AllGather-CP table over `segments`.
DeviceSegmentTable cp_table(Segment* segments, int max_seqs, int64_t total_rows, int cp, const Mask& mask) {
  DeviceSegmentTable table;
  table.segments = segments;
  table.capacity = segment_table_capacity(TableKind::kAllGatherCp, max_seqs);
  table.q_rows = total_rows / cp;
  table.k_rows = total_rows;
  table.mask = mask;
  table.kind = TableKind::kAllGatherCp;
  return table;
}

}  // namespace

DeviceSegmentTable enqueue_cp_segment_table(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded,
                                            int max_seqs, int64_t total_rows, int cp, int rank, const Mask& mask,
                                            Segment* segments, cudaStream_t stream) {
  detail::launch_build_cp_table(cu_seqlens, cu_seqlens_padded, max_seqs, cp, rank, mask, segments, stream);
  return cp_table(segments, max_seqs, total_rows, cp, mask);
}

size_t forward_workspace_size(const DeviceSegmentTable& table) {
  AttentionShape shape;
  shape.table = table;
  return ForwardPlan::workspace_size(shape);
}

size_t backward_workspace_size(const DeviceSegmentTable& table, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                               DType dkv_dtype, const AttentionOptions& options) {
  AttentionShape shape;
  shape.table = table;
  shape.q_heads = q_heads;
  shape.kv_heads = kv_heads;
  shape.head_dim = head_dim;
  shape.dkv_dtype = dkv_dtype;
  return BackwardPlan::workspace_size(shape, options);
}

void attention_forward(const DeviceSegmentTable& table, ConstThdTensor q, ConstThdTensor k, ConstThdTensor v,
                       ThdTensor out, float* lse, float* max_logit, void* workspace, size_t workspace_bytes,
                       cudaStream_t stream, const AttentionOptions& options) {
  AttentionShape shape;
  shape.table = table;
  shape.q_heads = q.heads;
  shape.kv_heads = k.heads;
  shape.head_dim = q.head_dim;
  shape.dtype = q.dtype;
  const ForwardPlan plan(shape, options, workspace, workspace_bytes);
  // A plan takes the table's device array only at run(); a one-shot call checks it here.
  if (table.capacity > 0) {
    detail::check_device_pointer("table.segments", table.segments, plan.device(), alignof(Segment));
  }
  const ForwardTensors tensors{q, k, v, out, lse, max_logit};
  plan.check_tensors(tensors);
  plan.run(table, tensors, stream);
}

void attention_backward(const DeviceSegmentTable& table, ConstThdTensor q, ConstThdTensor k, ConstThdTensor v,
                        ConstThdTensor out, ConstThdTensor dout, const float* lse, ThdTensor dq, ThdTensor dk,
                        ThdTensor dv, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                        const AttentionOptions& options) {
  AttentionShape shape;
  shape.table = table;
  shape.q_heads = q.heads;
  shape.kv_heads = k.heads;
  shape.head_dim = q.head_dim;
  shape.dtype = q.dtype;
  shape.dq_dtype = dq.dtype;
  shape.dkv_dtype = dk.dtype;
  const BackwardPlan plan(shape, options, workspace, workspace_bytes);
  if (table.capacity > 0) {
    detail::check_device_pointer("table.segments", table.segments, plan.device(), alignof(Segment));
  }
  const BackwardTensors tensors{q, k, v, out, dout, lse, dq, dk, dv};
  plan.check_tensors(tensors);
  plan.run(table, tensors, stream);
}

}  // namespace thdcp::cuda
