#include "head_exchange_cuda.h"

#include <algorithm>

#include "head_views.h"
#include "thdcp/core/error.h"
#include "thdcp/cuda/check.h"
#include "thdcp/cuda/reorder.h"

namespace thdcp::cp::detail {

namespace {

// The dual-chunk layout's member-major rows need a reorder to and from the group's order; the
// contiguous layout's pieces are in it already.
bool needs_reorder(const Problem& p) { return p.layout == CpLayout::kDualChunk; }

// The group's rows: rank g's of the layout at cp / members.
int64_t group_rows(const Problem& p, int members) { return p.capacity.max_tokens / (p.cp / members); }

// `view` (any strides) <-> dense rows [tokens, heads, head_dim] at `rows`, by 2-D copies: one
// where a row's heads are adjacent, else one per head.
void copy_view(const ConstThdTensor& view, void* rows, bool into_rows, cudaStream_t stream) {
  if (view.numel() == 0) return;
  const size_t element = dtype_size(view.dtype);
  const size_t head_bytes = static_cast<size_t>(view.head_dim) * element;
  const size_t row_bytes = static_cast<size_t>(view.heads) * head_bytes;
  const size_t pitch = view.tokens > 1 ? static_cast<size_t>(view.row_step()) * element : row_bytes;
  const bool adjacent = view.heads == 1 || view.head_step() == view.head_dim;
  const int64_t copies = adjacent ? 1 : view.heads;
  const size_t width = adjacent ? row_bytes : head_bytes;
  for (int64_t h = 0; h < copies; ++h) {
    auto* strided = static_cast<unsigned char*>(const_cast<void*>(view.data)) +
                    static_cast<size_t>(h * view.head_step()) * element;
    unsigned char* dense = static_cast<unsigned char*>(rows) + static_cast<size_t>(h) * head_bytes;
    if (into_rows) {
      THDCP_CHECK_CUDA(cudaMemcpy2DAsync(dense, row_bytes, strided, pitch, width, static_cast<size_t>(view.tokens),
                                         cudaMemcpyDeviceToDevice, stream));
    } else {
      THDCP_CHECK_CUDA(cudaMemcpy2DAsync(strided, pitch, dense, row_bytes, width, static_cast<size_t>(view.tokens),
                                         cudaMemcpyDeviceToDevice, stream));
    }
  }
}

}  // namespace

ExchangeParts carve_exchange(WorkspaceCarver& carver, const Problem& p, int members) {
  ExchangeParts w;
  const size_t rows = static_cast<size_t>(group_rows(p, members));
  const size_t hq = static_cast<size_t>(p.q_heads / members), hk = static_cast<size_t>(p.kv_heads / members);
  const size_t dqk = static_cast<size_t>(p.head_dim), dv = static_cast<size_t>(p.value_head_dim());
  const size_t element = dtype_size(p.dtype);
  const size_t widest = std::max({hq * dqk, hq * dv, hk * dqk, hk * dv});  // elements of a head-sharded row
  w.send = carver.take<unsigned char>(rows * widest * sizeof(float));
  w.recv = carver.take<unsigned char>(rows * widest * sizeof(float));
  w.q = carver.take<unsigned char>(rows * hq * dqk * element);
  w.k = carver.take<unsigned char>(rows * hk * dqk * element);
  w.v = carver.take<unsigned char>(rows * hk * dv * element);
  w.out = carver.take<unsigned char>(rows * hq * dv * element);
  w.dout = carver.take<unsigned char>(rows * hq * dv * element);
  w.lse = carver.take_array<float>(hq * rows);
  w.lse_ranked = carver.take_array<float>(needs_reorder(p) ? hq * rows : 0);
  w.dq = carver.take_array<float>(rows * hq * dqk);
  w.dk = carver.take_array<float>(rows * hk * dqk);
  w.dv = carver.take_array<float>(rows * hk * dv);
  w.max_logit = carver.take_array<float>(hq);
  w.dsinks = carver.take_array<float>(hq);
  return w;
}

CudaHeadExchange::CudaHeadExchange(DeviceCommunicator& comm, const Problem& p, int group, const ExchangeParts& parts,
                                   int slices)
    : comm_(comm),
      p_(p),
      w_(parts),
      members_(comm.size()),
      group_(group),
      slices_(slices),
      reorder_(needs_reorder(p)),
      local_rows_(p.local_rows()),
      rows_(group_rows(p, comm.size())),
      q_heads_(p.q_heads / comm.size()),
      kv_heads_(p.kv_heads / comm.size()),
      q_slice_(q_heads_ / slices),
      kv_slice_(kv_heads_ / slices) {
  THDCP_CHECK(slices >= 1 && q_heads_ % slices == 0 && kv_heads_ % slices == 0,
              "internal: " << slices << " head slices of " << q_heads_ << " and " << kv_heads_ << " heads");
}

void CudaHeadExchange::start(const DeviceLayout& layout, cudaStream_t stream) {
  layout_ = layout;
  stream_ = stream;
}

ThdTensor CudaHeadExchange::dense(void* data, DType dtype, int64_t heads, int64_t head_dim) const {
  return ThdTensor{data, dtype, rows_, heads, head_dim};
}

// all_to_all (one group of cp members) takes the gathered <-> sequence reorder it was
// measured with; a2a+ag the general one.
void CudaHeadExchange::to_group_order(const void* members_rows, void* group_rows, size_t row_bytes, int64_t planes) {
  if (members_ == p_.cp) {
    cuda::reorder_rows(members_rows, group_rows, row_bytes, planes, cuda::RowOrder::kSequence, layout_, p_.cp, stream_);
  } else {
    cuda::regroup_rows(members_rows, group_rows, row_bytes, planes, cuda::GroupOrder::kGroup, layout_, p_.cp, members_,
                       group_, stream_);
  }
}

void CudaHeadExchange::to_member_order(const void* group_rows, void* members_rows, size_t row_bytes, int64_t planes) {
  if (members_ == p_.cp) {
    cuda::reorder_rows(group_rows, members_rows, row_bytes, planes, cuda::RowOrder::kGathered, layout_, p_.cp, stream_);
  } else {
    cuda::regroup_rows(group_rows, members_rows, row_bytes, planes, cuda::GroupOrder::kMembers, layout_, p_.cp,
                       members_, group_, stream_);
  }
}

unsigned char* CudaHeadExchange::slice_of(void* part, int s, int64_t heads_per_slice, int64_t head_dim,
                                          size_t element) const {
  return static_cast<unsigned char*>(part) + static_cast<size_t>(s * rows_ * heads_per_slice * head_dim) * element;
}

ConstThdTensor CudaHeadExchange::to_heads(const ConstThdTensor& local, unsigned char* rows, int64_t first,
                                          int64_t count) {
  const int64_t share = local.heads / members_;
  const size_t row_bytes = static_cast<size_t>(count * local.head_dim) * dtype_size(local.dtype);
  const size_t block = static_cast<size_t>(local_rows_) * row_bytes;
  for (int j = 0; j < members_; ++j) {
    const ConstThdTensor part = heads_of(local, j * share + first, count);
    copy_view(part, w_.send + static_cast<size_t>(j) * block, true, stream_);
  }
  comm_.all_to_all(w_.send, reorder_ ? w_.recv : rows, block, stream_);
  if (reorder_) to_group_order(w_.recv, rows, row_bytes, 1);
  return ConstThdTensor(rows, local.dtype, rows_, count, local.head_dim);
}

void CudaHeadExchange::to_rows(const ConstThdTensor& heads, ThdTensor local, int64_t first) {
  // fp32 heads bound for a 16-bit tensor are rounded before the exchange, not after: the
  // exchange only moves values (each head is whole on the member that holds it), so the bits
  // are the same and half the bytes move.
  ConstThdTensor moved = heads;
  if (heads.dtype != local.dtype) {
    THDCP_CHECK(heads.dtype == DType::kFloat32, "to_rows: heads of " << dtype_name(heads.dtype) << " into "
                                                                     << dtype_name(local.dtype) << " rows");
    unsigned char* rounded = reorder_ ? w_.recv : w_.send;  // w_.send stays free for the reorder
    cuda::convert_from_fp32(reinterpret_cast<const float*>(heads.data), rounded, local.dtype, heads.numel(), stream_);
    moved = ConstThdTensor(rounded, local.dtype, heads.tokens, heads.heads, heads.head_dim);
  }
  const int64_t share = local.heads / members_;
  const size_t row_bytes = static_cast<size_t>(moved.heads * moved.head_dim) * dtype_size(moved.dtype);
  const size_t block = static_cast<size_t>(local_rows_) * row_bytes;
  const void* ranked = moved.data;
  if (reorder_) {
    to_member_order(moved.data, w_.send, row_bytes, 1);
    ranked = w_.send;
  }
  comm_.all_to_all(ranked, w_.recv, block, stream_);
  for (int i = 0; i < members_; ++i) {
    const ThdTensor part = heads_of(local, i * share + first, moved.heads);
    copy_view(ConstThdTensor(part), w_.recv + static_cast<size_t>(i) * block, false, stream_);
  }
}

void CudaHeadExchange::lse_to_rows(const float* heads, float* local, int64_t first, int64_t count) {
  const float* ranked = heads;
  if (reorder_) {
    to_member_order(heads, w_.lse_ranked, sizeof(float), count);
    ranked = w_.lse_ranked;
  }
  // Block j: rows [j T/cp, (j+1) T/cp) of each of the `count` planes; what member j receives
  // as the planes [m Hq/members + first, ... + count) of its lse.
  const size_t row = static_cast<size_t>(local_rows_) * sizeof(float);
  const size_t block = static_cast<size_t>(count) * row;
  for (int j = 0; j < members_; ++j) {
    THDCP_CHECK_CUDA(cudaMemcpy2DAsync(w_.send + static_cast<size_t>(j) * block, row, ranked + j * local_rows_,
                                       static_cast<size_t>(rows_) * sizeof(float), row, static_cast<size_t>(count),
                                       cudaMemcpyDeviceToDevice, stream_));
  }
  if (count == q_heads_) {  // every plane: member m's block is its part of `local` as it lies
    comm_.all_to_all(w_.send, local, block, stream_);
    return;
  }
  comm_.all_to_all(w_.send, w_.recv, block, stream_);
  for (int m = 0; m < members_; ++m) {
    THDCP_CHECK_CUDA(cudaMemcpyAsync(local + (m * q_heads_ + first) * local_rows_,
                                     w_.recv + static_cast<size_t>(m) * block, block, cudaMemcpyDeviceToDevice,
                                     stream_));
  }
}

void CudaHeadExchange::lse_to_heads(const float* local, float* heads, int64_t first, int64_t count) {
  const size_t row = static_cast<size_t>(local_rows_) * sizeof(float);
  const size_t block = static_cast<size_t>(count) * row;
  const void* blocks = local;  // block j: the planes of member j's slice
  if (count != q_heads_) {
    for (int j = 0; j < members_; ++j) {
      THDCP_CHECK_CUDA(cudaMemcpyAsync(w_.send + static_cast<size_t>(j) * block,
                                       local + (j * q_heads_ + first) * local_rows_, block,
                                       cudaMemcpyDeviceToDevice, stream_));
    }
    blocks = w_.send;
  }
  comm_.all_to_all(blocks, w_.recv, block, stream_);  // block i: member i's rows of these planes
  float* ranked = reorder_ ? w_.lse_ranked : heads;
  for (int i = 0; i < members_; ++i) {
    THDCP_CHECK_CUDA(cudaMemcpy2DAsync(ranked + i * local_rows_, static_cast<size_t>(rows_) * sizeof(float),
                                       w_.recv + static_cast<size_t>(i) * block, row, row,
                                       static_cast<size_t>(count), cudaMemcpyDeviceToDevice, stream_));
  }
  if (reorder_) to_group_order(w_.lse_ranked, heads, sizeof(float), count);
}

ForwardTensors CudaHeadExchange::forward_to_heads(const ForwardTensors& t, int s) {
  const size_t element = dtype_size(p_.dtype);
  const int64_t dqk = p_.head_dim, dv = p_.value_head_dim();
  const int64_t q0 = s * q_slice_, k0 = s * kv_slice_;  // the slice's first heads
  ForwardTensors h{to_heads(t.q, slice_of(w_.q, s, q_slice_, dqk, element), q0, q_slice_),
                   to_heads(t.k, slice_of(w_.k, s, kv_slice_, dqk, element), k0, kv_slice_),
                   to_heads(t.v, slice_of(w_.v, s, kv_slice_, dv, element), k0, kv_slice_),
                   dense(slice_of(w_.out, s, q_slice_, dv, element), p_.dtype, q_slice_, dv),
                   w_.lse + q0 * rows_,
                   t.max_logit ? w_.max_logit + q0 : nullptr,
                   t.sinks ? t.sinks + member() * q_heads_ + q0 : nullptr};
  return h;
}

void CudaHeadExchange::forward_to_rows(const ForwardTensors& heads, const ForwardTensors& t, int s) {
  to_rows(heads.out, t.out, s * q_slice_);
  lse_to_rows(heads.lse, t.lse, s * q_slice_, q_slice_);
}

void CudaHeadExchange::gather_max_logit(const ForwardTensors& t) {
  if (t.max_logit) comm_.all_gather(w_.max_logit, t.max_logit, static_cast<size_t>(q_heads_) * sizeof(float), stream_);
}

BackwardTensors CudaHeadExchange::backward_to_heads(const BackwardTensors& t, DType dq_dtype, bool kept, int s) {
  const size_t element = dtype_size(p_.dtype);
  const int64_t dqk = p_.head_dim, dv = p_.value_head_dim();
  const int64_t q0 = s * q_slice_, k0 = s * kv_slice_;
  unsigned char* q = slice_of(w_.q, s, q_slice_, dqk, element);
  unsigned char* k = slice_of(w_.k, s, kv_slice_, dqk, element);
  unsigned char* v = slice_of(w_.v, s, kv_slice_, dv, element);
  unsigned char* out = slice_of(w_.out, s, q_slice_, dv, element);
  float* lse = w_.lse + q0 * rows_;
  // Kept: the forward's exchanged q, k, v, its out and lse are still in the parts (nothing
  // after the forward's attention writes them); only dout moves.
  BackwardTensors h{kept ? dense(q, p_.dtype, q_slice_, dqk) : to_heads(t.q, q, q0, q_slice_),
                    kept ? dense(k, p_.dtype, kv_slice_, dqk) : to_heads(t.k, k, k0, kv_slice_),
                    kept ? dense(v, p_.dtype, kv_slice_, dv) : to_heads(t.v, v, k0, kv_slice_),
                    kept ? dense(out, p_.dtype, q_slice_, dv) : to_heads(t.out, out, q0, q_slice_),
                    to_heads(t.dout, slice_of(w_.dout, s, q_slice_, dv, element), q0, q_slice_),
                    lse,
                    dense(slice_of(w_.dq, s, q_slice_, dqk, dtype_size(dq_dtype)), dq_dtype, q_slice_, dqk),
                    dense(slice_of(w_.dk, s, kv_slice_, dqk, sizeof(float)), DType::kFloat32, kv_slice_, dqk),
                    dense(slice_of(w_.dv, s, kv_slice_, dv, sizeof(float)), DType::kFloat32, kv_slice_, dv)};
  if (!kept) lse_to_heads(t.lse, lse, q0, q_slice_);
  h.sinks = t.sinks ? t.sinks + member() * q_heads_ + q0 : nullptr;
  h.dsinks = t.dsinks ? w_.dsinks + q0 : nullptr;
  return h;
}

void CudaHeadExchange::backward_to_rows(const BackwardTensors& heads, const BackwardTensors& t, int s) {
  to_rows(heads.dq, t.dq, s * q_slice_);
  to_rows(heads.dk, t.dk, s * kv_slice_);
  to_rows(heads.dv, t.dv, s * kv_slice_);
}

void CudaHeadExchange::gather_dsinks(const BackwardTensors& t) {
  if (t.dsinks) comm_.all_gather(w_.dsinks, t.dsinks, static_cast<size_t>(q_heads_) * sizeof(float), stream_);
}

}  // namespace thdcp::cp::detail
