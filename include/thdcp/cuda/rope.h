// Rotary position embedding on the GPU (DESIGN.md section 6): the CUDA counterpart of
// thdcp::cpu::rope_forward / rope_backward, as a plan object.
//
// Plan, then run. A RopePlan is made once for a RopeShape (cp, rank, capacity, heads, head
// dim, dtype, config, an optional cos/sin table): it validates all of it on the host, checks
// the table and status pointers (pointer queries: plan time only) and computes the inverse
// frequencies once. forward()/backward() then only check their arguments with host
// arithmetic and enqueue one kernel on `stream`: no allocation, no synchronisation, no
// pointer query, no read-back. The grid is sized by the capacity (max_tokens / cp rows), and
// the positions are computed on the device from cu_seqlens / cu_seqlens_padded, so a step
// can be captured in a CUDA graph and replayed for any batch of the same capacity.
//
// One call rotates q and k together (one launch; they share the rows' positions and cos/sin):
// q has q_heads heads, k has kv_heads (0: q only, pass an empty k). Both are rotated in place
// over the rank's whole local buffer, max_tokens / cp rows: padding rows of real sequences
// by their computed position, rows of empty (placeholder) sequences by 0, which leaves them
// unchanged; no row depends on another, so placeholder or padding rows never change real
// ones, and finite inputs give finite outputs everywhere.
//
// Arithmetic (thdcp/plan/rope.h): fp32; inverse frequencies computed on the host exactly as
// the CPU reference does; angle = fp32 position * inv_freq; cos/sin by fp32 sincosf (full
// range argument reduction, a few fp32 ulp from the host's cosf/sinf) or read from the
// caller's table; rotation with fmaf; one rounding to bf16/fp16 (nearest even). Against the
// CPU reference: identical bits with a table; from theta, at most one storage ulp apart,
// where the few-ulp cos/sin difference moves a value across a rounding boundary
// (|gpu - cpu| <= 2u |ref| + 2^-16 max|ref| is what the tests allow; u the unit roundoff).
//
// Tensors may be any strided views (row_stride, head_stride in elements; head_dim
// contiguous), e.g. the q and k views of a packed QKV buffer [T, Hq + 2 Hkv, D] or head-major
// [H, T, D] memory: no two elements of one view may share an address, and q and k must not
// overlap each other (thdcp/core/overlap.h). With 16-byte-aligned data, strides that are
// multiples of 8 elements and rotary_dim a multiple of 8 (kInterleaved) or 16 (kHalfSplit),
// the kernel moves 16-byte words; otherwise it moves single elements.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "thdcp/core/tensor.h"
#include "thdcp/plan/attention_shape.h"
#include "thdcp/plan/layout.h"
#include "thdcp/plan/rope.h"

namespace thdcp::cuda {

// Bits the kernel ORs into RopeShape::status.
constexpr int kRopeStatusPositionOutsideTable = 1;  // a position fell outside [0, table.rows)

// Largest head dim (and so rotary dim) the kernel takes.
constexpr int64_t kRopeMaxHeadDim = 256;

// The heads (HeadShape): q_heads >= 1 of q, kv_heads >= 0 of k (0: rotate q only), head_dim
// in [2, 256]; and the following.
struct RopeShape : HeadShape {
  int cp = 1;     // CP size
  int rank = 0;   // this rank, in [0, cp)
  // Which global rows the rank's rows are (thdcp/plan/contiguous.h): its dual-chunk chunks,
  // or its contiguous piece. The positions follow the layout.
  CpLayout cp_layout = CpLayout::kDualChunk;
  // Global capacity (DESIGN.md section 1): the metadata arrays have max_seqs + 1 entries; the
  // rank's tensors have max_tokens / cp rows (max_tokens a multiple of 2*cp when cp > 1 under
  // the dual-chunk layout, of cp under the contiguous one).
  Capacity capacity;
  DType dtype = DType::kBFloat16;  // q and k: bf16 or fp16
  RopeConfig config;
  // Optional device cos/sin table (thdcp/plan/rope.h: fp32 [rows][rotary_dim / 2] each),
  // kept by the plan (it must outlive it). Null: cos/sin from config.theta.
  RopeTable table;
  // Whether forward()/backward() will get per-sequence start offsets. Without offsets every position is
  // below max_tokens, so a table must have rows >= max_tokens (checked here). With offsets
  // the positions depend on device data the plan never reads: the caller's contract is
  // 0 <= position < table.rows for every row (padding rows included); a position outside is
  // clamped to the nearest table row (never read out of bounds) and reported in `status`.
  bool with_start_offsets = false;
  // Optional device int: the kernel ORs kRopeStatus* bits into it when something was clamped
  // (it never clears it: zero it before the steps you want to check). Null: not reported.
  int* status = nullptr;
};

class RopePlan {
 public:
  // Validates `shape` (throws thdcp::Error naming the argument and what to change); with a
  // table or a status word, checks they are device memory of the current device, which
  // becomes the plan's device.
  explicit RopePlan(const RopeShape& shape);

  // Everything forward()/backward() check, plus pointer queries that q and k are device
  // memory of the plan's device. Plan time only (e.g. once for a graph's static buffers).
  void check_tensors(const ThdTensor& q, const ThdTensor& k) const;

  // Rotates q and k in place by the angles of their rows' positions, enqueued on `stream`.
  //   layout         the *global* layout in capacity form (layout.capacity == shape.capacity:
  //                  cu_seqlens_padded[max_seqs] == max_tokens, every P_b a multiple of 2*cp),
  //                  as the CP plans take it
  //   start_offsets  device int32 [max_seqs] added to each sequence's positions, or null
  //                  (must be null unless shape.with_start_offsets)
  //   q              [max_tokens / cp, q_heads, head_dim], shape.dtype
  //   k              [max_tokens / cp, kv_heads, head_dim], shape.dtype; an empty ThdTensor{}
  //                  when kv_heads == 0
  // Throws thdcp::Error before enqueueing anything when an argument does not match the plan.
  void forward(const DeviceLayout& layout, const int32_t* start_offsets, ThdTensor q, ThdTensor k,
               cudaStream_t stream) const;

  // The backward: rotation by the negative angles (the transpose), in place on the gradients
  // dq, dk with respect to the forward's outputs. Same arguments as forward().
  void backward(const DeviceLayout& layout, const int32_t* start_offsets, ThdTensor dq, ThdTensor dk,
                cudaStream_t stream) const;

  const RopeShape& shape() const { return shape_; }
  int64_t local_rows() const { return local_rows_; }
  int64_t rotary_dim() const { return rotary_dim_; }
  int device() const { return device_; }

 private:
  void check_run(const DeviceLayout& layout, const int32_t* start_offsets, const ThdTensor& q,
                 const ThdTensor& k) const;
  void run(const DeviceLayout& layout, const int32_t* start_offsets, ThdTensor q, ThdTensor k, float sin_sign,
           cudaStream_t stream) const;

  RopeShape shape_;
  int64_t local_rows_ = 0;
  int64_t rotary_dim_ = 0;
  int device_ = 0;
  float inv_freq_[kRopeMaxHeadDim / 2] = {};
};

}  // namespace thdcp::cuda
