// One-shot forms of the CUDA attention for tests, which call it on tables and tensors they
// build themselves: a checked table build (TablePlan::check, then run) and a forward or
// backward that makes its plan, checks every pointer and runs (ForwardPlan / BackwardPlan).
// The library's front door for a batch is cuda::Attention; these exist to test the plans
// under it on any table, a CP rank's included.
#pragma once

#include <cuda_runtime_api.h>

#include "thdcp/cuda/attention.h"
#include "support/cuda/device_step.h"
#include "thdcp/cuda/check.h"

namespace thdcp::test {

// Entries of a table for max_seqs sequences: one per sequence, two for an AllGather-CP rank.
inline int table_entries(cuda::TableKind kind, int max_seqs) {
  return kind == cuda::TableKind::kAllGatherCp ? 2 * max_seqs : max_seqs;
}

// Builds the table of `plan` from device metadata of `max_seqs + 1` entries each into
// `segments`, with every pointer checked first.
cuda::DeviceSegmentTable build_table(const cuda::TablePlan& plan, const int32_t* cu_seqlens,
                                     const int32_t* cu_seqlens_padded, Segment* segments, cudaStream_t stream);

// The single-device table of max_seqs sequences over total_rows rows.
cuda::DeviceSegmentTable build_segment_table(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded, int max_seqs,
                                             int64_t total_rows, const Mask& mask, Segment* segments,
                                             cudaStream_t stream);

// The AllGather-CP table of `rank` of `cp` over the global layout of total_rows rows.
cuda::DeviceSegmentTable build_cp_segment_table(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded,
                                                int max_seqs, int64_t total_rows, int cp, int rank, const Mask& mask,
                                                Segment* segments, cudaStream_t stream);

cuda::AttentionShape shape_of(const cuda::DeviceSegmentTable& table, const ConstThdTensor& q, const ConstThdTensor& k,
                              DType dq_dtype, DType dkv_dtype);

size_t forward_workspace_size(const cuda::DeviceSegmentTable& table);

size_t backward_workspace_size(const cuda::DeviceSegmentTable& table, int64_t q_heads, int64_t kv_heads,
                               int64_t head_dim, DType dkv_dtype, const AttentionOptions& options = {});

// ForwardPlan, check_tensors (and the table's array), run.
void attention_forward(const cuda::DeviceSegmentTable& table, ConstThdTensor q, ConstThdTensor k, ConstThdTensor v,
                       ThdTensor out, float* lse, float* max_logit, void* workspace, size_t workspace_bytes,
                       cudaStream_t stream, const AttentionOptions& options = {});

// BackwardPlan, check_tensors (and the table's array), run.
void attention_backward(const cuda::DeviceSegmentTable& table, ConstThdTensor q, ConstThdTensor k, ConstThdTensor v,
                        ConstThdTensor out, ConstThdTensor dout, const float* lse, ThdTensor dq, ThdTensor dk,
                        ThdTensor dv, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                        const AttentionOptions& options = {});

// attention_forward, then attention_backward, on the tensors of `step` with the workspaces
// `forward_ws` and `backward_ws`.
void attention_step(const cuda::DeviceSegmentTable& table, DeviceStep& step, const DeviceBuffer& forward_ws,
                    const DeviceBuffer& backward_ws, cudaStream_t stream, const AttentionOptions& options = {});

}  // namespace thdcp::test
