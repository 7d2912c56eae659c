#include "support/cuda/one_shot.h"

namespace thdcp::test {

cuda::DeviceSegmentTable build_table(const cuda::TablePlan& plan, const int32_t* cu_seqlens,
                                     const int32_t* cu_seqlens_padded, Segment* segments, cudaStream_t stream) {
  const DeviceLayout layout{cu_seqlens, cu_seqlens_padded, plan.capacity()};
  plan.check(layout, segments);
  return plan.run(layout, segments, stream);
}

cuda::DeviceSegmentTable build_segment_table(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded, int max_seqs,
                                             int64_t total_rows, const Mask& mask, Segment* segments,
                                             cudaStream_t stream) {
  return build_table(cuda::TablePlan::single_device(Capacity{max_seqs, total_rows}, mask), cu_seqlens,
                     cu_seqlens_padded, segments, stream);
}

cuda::DeviceSegmentTable build_cp_segment_table(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded,
                                                int max_seqs, int64_t total_rows, int cp, int rank, const Mask& mask,
                                                Segment* segments, cudaStream_t stream) {
  return build_table(cuda::TablePlan::all_gather_cp(Capacity{max_seqs, total_rows}, cp, rank, mask), cu_seqlens,
                     cu_seqlens_padded, segments, stream);
}

cuda::AttentionShape shape_of(const cuda::DeviceSegmentTable& table, const ConstThdTensor& q, const ConstThdTensor& k,
                              DType dq_dtype, DType dkv_dtype) {
  cuda::AttentionShape shape;
  shape.table = table;
  shape.q_heads = q.heads;
  shape.kv_heads = k.heads;
  shape.head_dim = q.head_dim;
  shape.dtype = q.dtype;
  shape.dq_dtype = dq_dtype;
  shape.dkv_dtype = dkv_dtype;
  return shape;
}

size_t forward_workspace_size(const cuda::DeviceSegmentTable& table) {
  cuda::AttentionShape shape;
  shape.table = table;
  return cuda::ForwardPlan::workspace_size(shape);
}

size_t backward_workspace_size(const cuda::DeviceSegmentTable& table, int64_t q_heads, int64_t kv_heads,
                               int64_t head_dim, DType dkv_dtype, const AttentionOptions& options) {
  cuda::AttentionShape shape;
  shape.table = table;
  shape.q_heads = q_heads;
  shape.kv_heads = kv_heads;
  shape.head_dim = head_dim;
  shape.dkv_dtype = dkv_dtype;
  return cuda::BackwardPlan::workspace_size(shape, options);
}

void attention_forward(const cuda::DeviceSegmentTable& table, ConstThdTensor q, ConstThdTensor k, ConstThdTensor v,
                       ThdTensor out, float* lse, float* max_logit, void* workspace, size_t workspace_bytes,
                       cudaStream_t stream, const AttentionOptions& options) {
  const cuda::ForwardPlan plan(shape_of(table, q, k, q.dtype, q.dtype), options, workspace, workspace_bytes);
  if (table.capacity > 0) cuda::check_device_pointer("table.segments", table.segments, plan.device(), 4);
  const ForwardTensors tensors{q, k, v, out, lse, max_logit};
  plan.check_tensors(tensors);
  plan.run(table, tensors, stream);
}

void attention_backward(const cuda::DeviceSegmentTable& table, ConstThdTensor q, ConstThdTensor k, ConstThdTensor v,
                        ConstThdTensor out, ConstThdTensor dout, const float* lse, ThdTensor dq, ThdTensor dk,
                        ThdTensor dv, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                        const AttentionOptions& options) {
  const cuda::BackwardPlan plan(shape_of(table, q, k, dq.dtype, dk.dtype), options, workspace, workspace_bytes);
  if (table.capacity > 0) cuda::check_device_pointer("table.segments", table.segments, plan.device(), 4);
  const BackwardTensors tensors{q, k, v, out, dout, lse, dq, dk, dv};
  plan.check_tensors(tensors);
  plan.run(table, tensors, stream);
}

void attention_step(const cuda::DeviceSegmentTable& table, DeviceStep& step, const DeviceBuffer& forward_ws,
                    const DeviceBuffer& backward_ws, cudaStream_t stream, const AttentionOptions& options) {
  const ForwardTensors f = step.forward_tensors();
  attention_forward(table, f.q, f.k, f.v, f.out, f.lse, f.max_logit, forward_ws.data(), forward_ws.bytes(), stream,
                    options);
  const BackwardTensors b = step.backward_tensors();
  attention_backward(table, b.q, b.k, b.v, b.out, b.dout, b.lse, b.dq, b.dk, b.dv, backward_ws.data(),
                     backward_ws.bytes(), stream, options);
}

}  // namespace thdcp::test
