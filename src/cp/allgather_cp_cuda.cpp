// AllGather CP with the CUDA backend: host-side orchestration of device work.
#include <cstdint>

#include "thdcp/cuda/check.h"
#include "thdcp/cp/cuda.h"
#include "thdcp/cuda/reorder.h"
#include "thdcp/core/error.h"

namespace thdcp::cuda {

namespace {

constexpr size_t kAlignment = 256;
size_t align_up(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

// Workspace of a CP step, in order; the backward adds the fp32 gradient buffers.
struct CpWorkspace {
  size_t segments = 0, k_gathered = 0, v_gathered = 0, k_seq = 0, v_seq = 0;
  size_t dk_partial = 0, dv_partial = 0, rank_ordered = 0, reduced = 0;
  size_t attention = 0, attention_bytes = 0, total = 0;
};

DeviceSegmentTable table_shape(const DeviceLayout& layout, int cp, const Mask& mask, Segment* segments) {
  DeviceSegmentTable t;
  t.segments = segments;
  t.capacity = segment_table_capacity(TableKind::kAllGatherCp, layout.max_seqs);
  t.q_rows = layout.total_rows / cp;
  t.k_rows = layout.total_rows;
  t.mask = mask;
  t.kind = TableKind::kAllGatherCp;
  return t;
}

CpWorkspace workspace_layout(const DeviceLayout& layout, int cp, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                             DType dtype, bool backward, const Options& options) {
  THDCP_CHECK(cp >= 1, "cp=" << cp << " must be >= 1");
  THDCP_CHECK(layout.max_seqs >= 1, "layout.max_seqs=" << layout.max_seqs << " must be >= 1");
  THDCP_CHECK(layout.total_rows >= 0 && layout.total_rows % (2 * cp) == 0,
              "layout.total_rows=" << layout.total_rows << " must be a multiple of 2*cp=" << 2 * cp);
  CpWorkspace w;
  const DeviceSegmentTable table = table_shape(layout, cp, Mask::causal(), nullptr);
  const size_t kv_bytes = static_cast<size_t>(layout.total_rows * kv_heads * head_dim) * dtype_size(dtype);
  const size_t kv_fp32 = static_cast<size_t>(layout.total_rows * kv_heads * head_dim) * sizeof(float);
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t offset = at;
    at += align_up(bytes);
    return offset;
  };
  w.segments = take(sizeof(Segment) * static_cast<size_t>(table.capacity));
  w.k_gathered = take(kv_bytes);
  w.v_gathered = take(kv_bytes);
  w.k_seq = take(kv_bytes);
  w.v_seq = take(kv_bytes);
  if (backward) {
    w.dk_partial = take(kv_fp32);
    w.dv_partial = take(kv_fp32);
    w.rank_ordered = take(kv_fp32);
    w.reduced = take(kv_fp32 / cp);
    w.attention_bytes = backward_workspace_size(table, q_heads, kv_heads, head_dim, DType::kFloat32, options);
  } else {
    w.attention_bytes = forward_workspace_size(table);
  }
  w.attention = take(w.attention_bytes);
  w.total = at;
  return w;
}

void check_call(const Communicator& comm, const DeviceLayout& layout, const ConstThdTensor& q, const ConstThdTensor& k,
                size_t workspace_bytes, const CpWorkspace& w) {
  const int64_t local_rows = layout.total_rows / comm.size();
  THDCP_CHECK(layout.cu_seqlens != nullptr && layout.cu_seqlens_padded != nullptr,
              "layout.cu_seqlens and layout.cu_seqlens_padded must be device arrays of max_seqs + 1 entries");
  THDCP_CHECK(q.tokens == local_rows && k.tokens == local_rows,
              "q has " << q.tokens << " rows and k " << k.tokens << ", but this rank holds T/cp=" << local_rows
                       << " rows of the layout: pass the rank's local tensors");
  THDCP_CHECK(workspace_bytes >= w.total, "workspace of " << workspace_bytes << " bytes is too small: the CP step needs "
                                                          << w.total << " (cp_*_workspace_size)");
}

// All-gathers a local K or V and puts it in sequence order.
void gather_in_sequence_order(Communicator& comm, const DeviceLayout& layout, const ConstThdTensor& local,
                              unsigned char* gathered, unsigned char* ordered, cudaStream_t stream) {
  const size_t row_bytes = local.row_bytes();
  comm.all_gather(local.data, gathered, static_cast<size_t>(local.tokens) * row_bytes);
  gathered_to_sequence_order(gathered, ordered, row_bytes, layout.cu_seqlens_padded, layout.max_seqs,
                             layout.total_rows, comm.size(), stream);
}

// What forward and backward both start with: the rank's table, and K/V in sequence order.
struct StepInputs {
  DeviceSegmentTable table;
  ConstThdTensor k_seq, v_seq;
};

StepInputs prepare_step(Communicator& comm, const DeviceLayout& layout, const Mask& mask, const ConstThdTensor& k,
                        const ConstThdTensor& v, unsigned char* base, const CpWorkspace& w, cudaStream_t stream) {
  StepInputs in;
  in.table = build_cp_segment_table(layout.cu_seqlens, layout.cu_seqlens_padded, layout.max_seqs, layout.total_rows,
                                    comm.size(), comm.rank(), mask, reinterpret_cast<Segment*>(base + w.segments),
                                    stream);
  gather_in_sequence_order(comm, layout, k, base + w.k_gathered, base + w.k_seq, stream);
  gather_in_sequence_order(comm, layout, v, base + w.v_gathered, base + w.v_seq, stream);
  in.k_seq = ConstThdTensor(base + w.k_seq, k.dtype, layout.total_rows, k.heads, k.head_dim);
  in.v_seq = ConstThdTensor(base + w.v_seq, v.dtype, layout.total_rows, v.heads, v.head_dim);
  return in;
}

}  // namespace

size_t cp_forward_workspace_size(const DeviceLayout& layout, int cp, int64_t q_heads, int64_t kv_heads,
                                 int64_t head_dim, DType dtype) {
  return workspace_layout(layout, cp, q_heads, kv_heads, head_dim, dtype, false, Options{}).total;
}

size_t cp_backward_workspace_size(const DeviceLayout& layout, int cp, int64_t q_heads, int64_t kv_heads,
                                  int64_t head_dim, DType dtype, const Options& options) {
  return workspace_layout(layout, cp, q_heads, kv_heads, head_dim, dtype, true, options).total;
}

void cp_forward(Communicator& comm, const DeviceLayout& layout, const Mask& mask, ConstThdTensor q, ConstThdTensor k,
                ConstThdTensor v, ThdTensor out, float* lse, float* max_logit, void* workspace, size_t workspace_bytes,
                cudaStream_t stream, const Options& options) {
  const int cp = comm.size();
  const CpWorkspace w = workspace_layout(layout, cp, q.heads, k.heads, q.head_dim, q.dtype, false, options);
  check_call(comm, layout, q, k, workspace_bytes, w);
  auto* base = static_cast<unsigned char*>(workspace);
  const StepInputs in = prepare_step(comm, layout, mask, k, v, base, w, stream);
  attention_forward(in.table, q, in.k_seq, in.v_seq, out, lse, max_logit, base + w.attention, w.attention_bytes, stream, options);
  if (max_logit) comm.all_reduce_max(max_logit, static_cast<size_t>(q.heads));
}

void cp_backward(Communicator& comm, const DeviceLayout& layout, const Mask& mask, ConstThdTensor q,
                 ConstThdTensor k, ConstThdTensor v, ConstThdTensor out, ConstThdTensor dout, const float* lse,
                 ThdTensor dq, ThdTensor dk, ThdTensor dv, void* workspace, size_t workspace_bytes,
                 cudaStream_t stream, const Options& options) {
  const int cp = comm.size();
  const CpWorkspace w = workspace_layout(layout, cp, q.heads, k.heads, q.head_dim, q.dtype, true, options);
  check_call(comm, layout, q, k, workspace_bytes, w);
  const int64_t local_rows = layout.total_rows / cp;
  THDCP_CHECK(dk.tokens == local_rows && dv.tokens == local_rows && dk.heads == k.heads && dv.heads == k.heads &&
                  dk.head_dim == k.head_dim && dv.head_dim == k.head_dim,
              "dk/dv must have k's local shape [" << local_rows << ", " << k.heads << ", " << k.head_dim << "]");
  THDCP_CHECK((dk.dtype == k.dtype || dk.dtype == DType::kFloat32) && (dv.dtype == k.dtype || dv.dtype == DType::kFloat32),
              "dk/dv must have k's dtype (" << dtype_name(k.dtype) << ") or fp32");
  auto* base = static_cast<unsigned char*>(workspace);
  const StepInputs in = prepare_step(comm, layout, mask, k, v, base, w, stream);
  const int64_t rows = layout.total_rows;
  const ThdTensor dk_partial{base + w.dk_partial, DType::kFloat32, rows, k.heads, k.head_dim};
  const ThdTensor dv_partial{base + w.dv_partial, DType::kFloat32, rows, k.heads, k.head_dim};
  attention_backward(in.table, q, in.k_seq, in.v_seq, out, dout, lse, dq, dk_partial, dv_partial, base + w.attention,
                     w.attention_bytes, stream, options);
  auto* rank_ordered = reinterpret_cast<float*>(base + w.rank_ordered);
  auto* reduced = reinterpret_cast<float*>(base + w.reduced);
  const size_t local_count = static_cast<size_t>(local_rows * k.heads * k.head_dim);
  for (auto [partial, grad] : {std::make_pair(&dk_partial, &dk), std::make_pair(&dv_partial, &dv)}) {
    sequence_to_gathered_order(partial->data, rank_ordered, partial->row_bytes(), layout.cu_seqlens_padded,
                               layout.max_seqs, rows, cp, stream);
    comm.reduce_scatter_sum(rank_ordered, reduced, local_count);
    convert_from_fp32(reduced, grad->data, grad->dtype, static_cast<int64_t>(local_count), stream);
  }
}

}  // namespace thdcp::cuda
