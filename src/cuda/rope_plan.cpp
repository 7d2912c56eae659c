// RopePlan: validation and inverse frequencies once, then runs that only check with host
// arithmetic and enqueue the kernel.
#include <cstdint>
#include <limits>

#include "rope_params.h"
#include "thdcp/core/error.h"
#include "thdcp/core/overlap.h"
#include "thdcp/cuda/check.h"
#include "thdcp/cuda/rope.h"

namespace thdcp::cuda {

namespace {

constexpr int kVectorElements = 8;  // 16 bytes of bf16/fp16

// run(): one of the call's tensors matches the plan (shape, dtype, strides >= 0, element
// alignment). Any strides: the kernel moves single elements unless word_aligned. Overlap is
// the call's check (rotated in place, q and k are outputs).
void check_view(const char* name, const ThdTensor& t, const ThdShape& shape, DType dtype) {
  check_thd_shape(name, t, shape);
  check_thd_dtype(name, t.dtype, dtype);
  check_thd_strides(name, t);
  if (t.numel() == 0) return;
  THDCP_CHECK(reinterpret_cast<uintptr_t>(t.data) % dtype_size(dtype) == 0,
              name << " data " << t.data << " is not aligned to its " << dtype_size(dtype) << "-byte elements");
}

// The rank's whole local buffer of q and of k.
ThdShape q_view(const RopeShape& shape, int64_t rows) {
  return ThdShape{rows, "max_tokens/cp", shape.q_heads, "q_heads", shape.head_dim};
}
ThdShape k_view(const RopeShape& shape, int64_t rows) {
  return ThdShape{rows, "max_tokens/cp", shape.kv_heads, "kv_heads", shape.head_dim};
}

// Whether the kernel can move 16-byte words of `t` (an empty tensor does not constrain it).
bool word_aligned(const ThdTensor& t) {
  if (t.numel() == 0) return true;
  return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && (t.tokens <= 1 || t.row_step() % kVectorElements == 0) &&
         (t.heads <= 1 || t.head_step() % kVectorElements == 0);
}

}  // namespace

RopePlan::RopePlan(const RopeShape& shape) : shape_(shape) {
  const int cp = shape.cp;
  THDCP_CHECK(cp >= 1, "RopeShape::cp=" << cp << " must be >= 1 (1 means no context parallelism)");
  THDCP_CHECK(shape.rank >= 0 && shape.rank < cp, "RopeShape::rank=" << shape.rank << " must be in [0, cp=" << cp
                                                                      << ")");
  const Capacity& capacity = shape.capacity;
  THDCP_CHECK(capacity.max_seqs >= 1, "RopeShape::capacity.max_seqs=" << capacity.max_seqs
                                                                      << " must be >= 1 (one placeholder is reserved)");
  THDCP_CHECK(capacity.max_tokens >= 0 && capacity.max_tokens <= std::numeric_limits<int32_t>::max(),
              "RopeShape::capacity.max_tokens=" << capacity.max_tokens << " must be in [0, 2^31-1]");
  THDCP_CHECK(shape.cp_layout == CpLayout::kDualChunk || shape.cp_layout == CpLayout::kContiguous,
              "RopeShape::cp_layout=" << static_cast<int>(shape.cp_layout)
                                      << " is not a CP layout: use kDualChunk or kContiguous");
  if (shape.cp_layout == CpLayout::kDualChunk) {
    THDCP_CHECK(cp == 1 || capacity.max_tokens % (2 * static_cast<int64_t>(cp)) == 0,
                "RopeShape::capacity.max_tokens=" << capacity.max_tokens << " is not a multiple of 2*cp="
                                                  << 2 * static_cast<int64_t>(cp)
                                                  << ": every padded length, and so the capacity, is one");
  } else {
    THDCP_CHECK(capacity.max_tokens % cp == 0,
                "RopeShape::capacity.max_tokens=" << capacity.max_tokens << " is not a multiple of cp=" << cp
                                                  << ": the contiguous layout cuts the rows into cp equal pieces");
  }
  THDCP_CHECK(shape.q_heads >= 1, "RopeShape::q_heads=" << shape.q_heads << " must be >= 1");
  THDCP_CHECK(shape.kv_heads >= 0, "RopeShape::kv_heads=" << shape.kv_heads << " must be >= 0 (0: q only)");
  THDCP_CHECK(shape.q_heads <= std::numeric_limits<int32_t>::max() &&
                  shape.kv_heads <= std::numeric_limits<int32_t>::max(),
              "RopeShape: q_heads=" << shape.q_heads << ", kv_heads=" << shape.kv_heads << " must fit int32");
  THDCP_CHECK(shape.head_dim >= 2 && shape.head_dim <= kRopeMaxHeadDim,
              "RopeShape::head_dim=" << shape.head_dim << " is not supported by the CUDA RoPE kernel: use [2, "
                                     << kRopeMaxHeadDim << "]");
  THDCP_CHECK(shape.dtype == DType::kBFloat16 || shape.dtype == DType::kFloat16,
              "RopeShape::dtype=" << dtype_name(shape.dtype) << ": the CUDA RoPE kernel takes bf16 or fp16");
  validate_rope_config(shape.config, shape.head_dim);
  validate_rope_table(shape.table);
  local_rows_ = capacity.max_tokens / cp;
  rotary_dim_ = rope_rotary_dim(shape.config, shape.head_dim);
  const int64_t pairs = rotary_dim_ / 2;
  if (shape.table.present() && !shape.with_start_offsets) {
    THDCP_CHECK(shape.table.rows >= capacity.max_tokens,
                "RopeShape::table.rows=" << shape.table.rows << " is less than capacity.max_tokens="
                                         << capacity.max_tokens
                                         << ", the bound of a position without start offsets: pass a table of "
                                         << capacity.max_tokens << " rows");
  }
  THDCP_CHECK(!shape.table.present() || shape.table.rows <= std::numeric_limits<int64_t>::max() / pairs,
              "RopeShape::table.rows=" << shape.table.rows << " is too large");
  // The grid: one thread per (row, group of at least one pair), 256 threads a block.
  THDCP_CHECK(local_rows_ * pairs <= static_cast<int64_t>(std::numeric_limits<int32_t>::max()) * 256,
              "max_tokens/cp=" << local_rows_ << " rows of " << pairs << " pairs are too many for one launch");
  if (!shape.table.present()) {
    for (int64_t i = 0; i < pairs; ++i) inv_freq_[i] = rope_inv_freq(i, rotary_dim_, shape.config.theta);
  }

  THDCP_CHECK_CUDA(cudaGetDevice(&device_));
  if (shape.table.present()) {
    check_device_pointer("RopeShape::table.cos", shape.table.cos, device_, alignof(float));
    check_device_pointer("RopeShape::table.sin", shape.table.sin, device_, alignof(float));
  }
  if (shape.status != nullptr) check_device_pointer("RopeShape::status", shape.status, device_, alignof(int));
}

void RopePlan::check_run(const DeviceLayout& layout, const int32_t* start_offsets, const ThdTensor& q,
                         const ThdTensor& k) const {
  THDCP_CHECK(layout.cu_seqlens != nullptr && layout.cu_seqlens_padded != nullptr,
              "layout.cu_seqlens and layout.cu_seqlens_padded must not be null (device arrays of max_seqs+1="
                  << shape_.capacity.max_seqs + 1 << " entries)");
  THDCP_CHECK(layout.capacity.max_seqs == shape_.capacity.max_seqs &&
                  layout.capacity.max_tokens == shape_.capacity.max_tokens,
              "layout.capacity (max_seqs=" << layout.capacity.max_seqs << ", max_tokens=" << layout.capacity.max_tokens
                                           << ") differs from the plan's (max_seqs=" << shape_.capacity.max_seqs
                                           << ", max_tokens=" << shape_.capacity.max_tokens
                                           << "): pass the global layout in the plan's capacity form");
  THDCP_CHECK(start_offsets == nullptr || shape_.with_start_offsets,
              "start_offsets is not null but the plan was made with RopeShape::with_start_offsets=false: make "
              "the plan with with_start_offsets=true (a table then need not cover max_tokens rows)");
  check_view("q", q, q_view(shape_, local_rows_), shape_.dtype);
  if (shape_.kv_heads == 0) {
    THDCP_CHECK(k.numel() == 0 && k.data == nullptr,
                "k has " << k.heads << " heads but the plan was made with kv_heads=0 (q only): pass ThdTensor{}");
    check_outputs_apart({{"q", q}}, {});
  } else {
    check_view("k", k, k_view(shape_, local_rows_), shape_.dtype);
    check_outputs_apart({{"q", q}, {"k", k}}, {});
  }
}

void RopePlan::check_tensors(const ThdTensor& q, const ThdTensor& k) const {
  check_view("q", q, q_view(shape_, local_rows_), shape_.dtype);
  if (q.numel() > 0) check_device_pointer("q", q.data, device_, dtype_size(shape_.dtype));
  if (shape_.kv_heads > 0) {
    check_view("k", k, k_view(shape_, local_rows_), shape_.dtype);
    if (k.numel() > 0) check_device_pointer("k", k.data, device_, dtype_size(shape_.dtype));
  }
}

void RopePlan::forward(const DeviceLayout& layout, const int32_t* start_offsets, ThdTensor q, ThdTensor k,
                       cudaStream_t stream) const {
  run(layout, start_offsets, q, k, 1.0f, stream);
}

void RopePlan::backward(const DeviceLayout& layout, const int32_t* start_offsets, ThdTensor dq, ThdTensor dk,
                        cudaStream_t stream) const {
  run(layout, start_offsets, dq, dk, -1.0f, stream);
}

void RopePlan::run(const DeviceLayout& layout, const int32_t* start_offsets, ThdTensor q, ThdTensor k,
                   float sin_sign, cudaStream_t stream) const {
  check_run(layout, start_offsets, q, k);
  const bool interleaved = shape_.config.layout == RopeLayout::kInterleaved;
  const int64_t pairs = rotary_dim_ / 2;
  // Interleaved: a 16-byte word holds 4 whole pairs; half-split: 8 first elements whose 8
  // partners sit pairs elements further, so both halves must start on a word.
  const bool rotary_fits_words = interleaved ? rotary_dim_ % kVectorElements == 0 : pairs % kVectorElements == 0;
  const bool vectorized = rotary_fits_words && word_aligned(q) && (shape_.kv_heads == 0 || word_aligned(k));

  detail::RopeParams params{};
  params.q = detail::RopeTensorParams{q.data, q.row_step(), q.head_step(), static_cast<int>(shape_.q_heads)};
  params.k = shape_.kv_heads == 0
                 ? detail::RopeTensorParams{nullptr, 0, 0, 0}
                 : detail::RopeTensorParams{k.data, k.row_step(), k.head_step(), static_cast<int>(shape_.kv_heads)};
  params.cu_seqlens = layout.cu_seqlens;
  params.cu_seqlens_padded = layout.cu_seqlens_padded;
  params.start_offsets = start_offsets;
  params.cos_table = shape_.table.cos;
  params.sin_table = shape_.table.sin;
  params.table_rows = shape_.table.rows;
  params.status = shape_.status;
  params.rows = local_rows_;
  params.max_seqs = shape_.capacity.max_seqs;
  params.cp = shape_.cp;
  params.rank = shape_.rank;
  params.cp_layout = shape_.cp_layout;
  params.pairs = static_cast<int>(pairs);
  params.sin_sign = sin_sign;
  for (int64_t i = 0; i < pairs; ++i) params.inv_freq[i] = inv_freq_[i];
  detail::launch_rope(params, shape_.dtype == DType::kBFloat16, interleaved, vectorized, stream);
}

}  // namespace thdcp::cuda
