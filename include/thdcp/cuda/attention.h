// Attention over a segment table on the GPU: the CUDA backend (same semantics as
// thdcp::cpu::attention_forward/backward, DESIGN.md sections 2 and 4).
//
// Plan, then run (CUTLASS's initialize / run). A ForwardPlan or BackwardPlan is made once
// for an AttentionShape (capacity, rows, mask, heads, head dim, dtypes) and its options: it
// validates them, checks the workspace and sets the kernels' attributes on the current
// device. Its run() then only checks with host arithmetic that the table and tensors match
// the plan and enqueues kernels and memsets on `stream`: no CUDA call other than those, no
// allocation, no synchronisation, no device-to-host read. Nothing depends on the lengths in
// the table, only on its capacity, so a whole step (table build, forward, backward) can be
// captured once in a CUDA graph and replayed for any batch of the same capacity.
// attention_forward / attention_backward are one-shot wrappers (plan, check_tensors, run).
//
// Supported: bf16 and fp16 storage, head_dim 64 and 128, Hq a multiple of Hkv (GQA/MQA),
// fp32 arithmetic on tensor cores (Hopper: wgmma for the forward and the deterministic
// backward, see kernel_family). All pointers are device pointers of the plan's device,
// 16-byte aligned.
//
// Tensors may be strided (ThdTensor::row_stride, head_stride, in elements; head_dim is
// always contiguous), e.g. q, k, v as views of one packed QKV buffer [T, Hq + 2 Hkv, D]
// (thdcp/core/tensor.h). The CUDA kernels need, for every tensor: row_stride and (with more
// than one head) head_stride multiples of 8 elements (16-byte rows for cp.async), no overlap
// (head_stride >= head_dim, row_stride >= (heads - 1) * head_stride + head_dim) and a
// 16-byte-aligned data pointer. fp32 dk/dv are accumulated in place and must be contiguous.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "thdcp/core/tensor.h"
#include "thdcp/core/workspace.h"
#include "thdcp/plan/attention_shape.h"
#include "thdcp/plan/mask.h"
#include "thdcp/plan/segment.h"

namespace thdcp::cuda {

// Which builder filled a device table. It bounds how many segments reach one key row
// (1 for a single-device table, 2 for an AllGather-CP table), which sizes the backward grid
// and keeps the fp32 dK/dV accumulation deterministic (see attention_backward).
enum class TableKind {
  kSingleDevice,
  kAllGatherCp,
};

// A segment table in device memory with a fixed capacity. Entries past the batch's real
// sequences are zero-length placeholders written by the builders, so the kernels see a
// fixed-size array and the table needs no host read-back.
struct DeviceSegmentTable {
  Segment* segments = nullptr;  // device array of `capacity` entries
  int capacity = 0;             // entries: max_seqs (single device) or 2 * max_seqs (CP)
  int64_t q_rows = 0;           // rows of the Q/O tensors the table addresses
  int64_t k_rows = 0;           // rows of the K/V tensors the table addresses
  Mask mask;                    // the mask applied by the kernels (and used by the builders)
  TableKind kind = TableKind::kSingleDevice;
};

// Entries a table needs for `max_seqs` sequences: max_seqs, or 2 * max_seqs for CP.
int segment_table_capacity(TableKind kind, int max_seqs);

// The description of a single-device table of `max_seqs` sequences over `total_rows` rows
// (what build_segment_table returns), with `segments` null: the table part of a plan's
// AttentionShape.
DeviceSegmentTable single_device_table(int max_seqs, int64_t total_rows, const Mask& mask);

// Enqueues the build of a single-device table (one segment per sequence, as
// thdcp::build_segment_table) from device metadata.
//   cu_seqlens, cu_seqlens_padded  device int32 arrays of max_seqs + 1 entries (DESIGN.md
//                                  section 1: unused trailing entries repeat the last value)
//   total_rows                     rows of the Q/K/V tensors (cu_seqlens_padded[max_seqs])
//   segments                       device array of segment_table_capacity(kSingleDevice,
//                                  max_seqs) entries, overwritten
// Uses single_device_segment() of thdcp/segment.h, the function the host builder uses.
// Checks the arguments on the host (not the device values: those are the caller's contract,
// as for thdcp::validate_layout on the host) and returns the table's description.
DeviceSegmentTable build_segment_table(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded, int max_seqs,
                                       int64_t total_rows, const Mask& mask, Segment* segments,
                                       cudaStream_t stream);

// Enqueues the build of the AllGather-CP table of `rank` of `cp` (two segments per sequence,
// as thdcp::build_cp_segment_table) with cp_segment() of thdcp/segment.h. The metadata is
// the *global* layout (every P_b a multiple of 2 * cp); q_rows = total_rows / cp,
// k_rows = total_rows. `segments` holds segment_table_capacity(kAllGatherCp, max_seqs).
DeviceSegmentTable build_cp_segment_table(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded,
                                          int max_seqs, int64_t total_rows, int cp, int rank, const Mask& mask,
                                          Segment* segments, cudaStream_t stream);

// The same launches with no argument or pointer checks, for callers that checked everything
// once (thdcp::cp::CudaPlan; the PyTorch ops, whose tensors are known to be on the device):
// only the launch, so it can run inside a captured step.
DeviceSegmentTable enqueue_segment_table(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded, int max_seqs,
                                         int64_t total_rows, const Mask& mask, Segment* segments,
                                         cudaStream_t stream);
DeviceSegmentTable enqueue_cp_segment_table(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded,
                                            int max_seqs, int64_t total_rows, int cp, int rank, const Mask& mask,
                                            Segment* segments, cudaStream_t stream);

// Head dims the CUDA kernels are compiled for: 64 and 128.
bool cuda_supports_head_dim(int64_t head_dim);

// The kernels the current device runs: "sm90" (Hopper, compute capability 9.x: warpgroup
// MMA kernels for the forward and the deterministic backward) or "portable" (mma.sync
// kernels: on every other GPU, for AttentionOptions::deterministic = false, and everywhere when the
// environment variable THDCP_PORTABLE_KERNELS is 1). Host queries only; safe during stream
// capture.
const char* kernel_family();

// The tensors of one forward call (shapes under attention_forward).
struct ForwardTensors {
  ConstThdTensor q, k, v;
  ThdTensor out;
  float* lse = nullptr;
  float* max_logit = nullptr;  // optional
};

// The tensors of one backward call (shapes under attention_backward).
struct BackwardTensors {
  ConstThdTensor q, k, v, out, dout;
  const float* lse = nullptr;
  ThdTensor dq, dk, dv;
  // Optional, device int32 [k_rows]: the row of dk/dv that key row i's gradient goes to (a
  // permutation of [0, k_rows)); null: row i. AllGather CP passes the map from sequence order
  // to the ranks' order, so the gradients need no reorder before the reduce-scatter.
  const int32_t* dkv_rows = nullptr;
};

// Everything about a call except the data: the heads (Hq, Hkv, D: 64 or 128), the table and
// the dtypes. `table` gives capacity, q_rows, k_rows, mask and kind; its `segments` pointer
// may be null at plan time (run() takes the table again).
struct AttentionShape : HeadShape {
  DeviceSegmentTable table;
  DType dtype = DType::kBFloat16;  // q, k, v, out, dout: bf16 or fp16
  DType dq_dtype = DType::kBFloat16;   // backward only: dtype or fp32
  DType dkv_dtype = DType::kBFloat16;  // backward only: dtype or fp32 (dk and dv)
};

// Every workspace a plan takes is kWorkspaceAlignment-byte aligned device memory
// (thdcp/core/workspace.h: a caller carving several from one allocation uses a
// WorkspaceCarver).

class ForwardPlan {
 public:
  // Bytes of device workspace the plan needs (tile schedule); depends only on the capacity.
  static size_t workspace_size(const AttentionShape& shape);

  // Validates everything that does not change per step (shape, mask, dtype, head dim, heads,
  // options, the kernel family of the current device), checks the workspace (device memory
  // of the current device, workspace_size bytes, 256-byte aligned; its contents need not
  // be kept between runs, but one plan's runs must not overlap in time) and sets the
  // kernels' attributes on the current device, which becomes the plan's device. Throws
  // thdcp::Error.
  ForwardPlan(const AttentionShape& shape, const AttentionOptions& options, void* workspace, size_t workspace_bytes);

  // Pointer checks (cudaPointerGetAttributes: device memory of the plan's device) of the
  // tensors run() will take, and everything run() checks. Plan time only (e.g. once for a
  // graph's static buffers): it calls the CUDA runtime.
  void check_tensors(const ForwardTensors& tensors) const;

  // Enqueues the tile schedule and the attention kernel on `stream` (a stream of the plan's
  // device, which must be current). Checks with host arithmetic only that `table` and
  // `tensors` match the plan (capacity, rows, mask, kind, shapes, dtypes, strides,
  // alignment, non-null) and throws thdcp::Error before enqueueing anything if not.
  void run(const DeviceSegmentTable& table, const ForwardTensors& tensors, cudaStream_t stream) const;

  int device() const { return device_; }
  const char* kernel_family() const { return sm90_ ? "sm90" : "portable"; }

 private:
  AttentionShape shape_;
  float scale_ = 0.0f;
  void* workspace_ = nullptr;
  int device_ = 0;
  bool sm90_ = false;
  void* tensor_map_encoder_ = nullptr;  // sm90: the driver's cuTensorMapEncodeTiled
  int sm_count_ = 0;                    // sm90: persistent blocks of the forward
};

class BackwardPlan {
 public:
  // Bytes of device workspace the plan needs: tile schedules, delta = rowsum(dO * O)
  // ([Hq, q_rows] fp32), fp32 accumulators for dk/dv when they are stored in 16 bits
  // ([k_rows, Hkv, D] each), an fp32 accumulator for dq (64-row tiles of the query tiles,
  // about [q_rows, Hq, D]) and its order counts. Depends only on the capacity and the shape
  // (the same for every AttentionOptions and kernel family).
  static size_t workspace_size(const AttentionShape& shape, const AttentionOptions& options = {});

  // As ForwardPlan's (also checks dq_dtype and dkv_dtype).
  BackwardPlan(const AttentionShape& shape, const AttentionOptions& options, void* workspace, size_t workspace_bytes);

  // As ForwardPlan::check_tensors.
  void check_tensors(const BackwardTensors& tensors) const;

  // Enqueues the memsets of the fp32 accumulators, the schedule, delta, dK/dV and dQ
  // kernels and the casts on `stream` (of the plan's device, current). Checks as
  // ForwardPlan::run.
  void run(const DeviceSegmentTable& table, const BackwardTensors& tensors, cudaStream_t stream) const;

  // run() in two halves, for callers that overlap other work with one of them (AllGather CP
  // reduce-scatters one head group's dK/dV while the next group's run): run_keys enqueues the
  // memsets, the schedule, delta, the dK/dV kernel and the dk/dv casts (and, where the plan
  // fuses dQ into the dK/dV pass, its accumulation); run_queries the dQ kernel (or the fused
  // dQ's cast). run_queries must follow run_keys of the same table and tensors, ordered after
  // it, with no other run of this plan in between (the schedule and delta stay in the
  // workspace). run_keys then run_queries enqueue exactly what run() does.
  void run_keys(const DeviceSegmentTable& table, const BackwardTensors& tensors, cudaStream_t stream) const;
  void run_queries(const DeviceSegmentTable& table, const BackwardTensors& tensors, cudaStream_t stream) const;

  int device() const { return device_; }
  const char* kernel_family() const { return sm90_ ? "sm90" : "portable"; }

 private:
  enum class Passes { kBoth, kKeys, kQueries };
  void enqueue(const DeviceSegmentTable& table, const BackwardTensors& tensors, cudaStream_t stream,
               Passes passes) const;

  AttentionShape shape_;
  AttentionOptions options_;
  float scale_ = 0.0f;
  void* workspace_ = nullptr;
  int device_ = 0;
  bool sm90_ = false;
  bool fused_dq_ = false;  // dQ accumulated by the dK/dV pass (Hopper; portable: deterministic = false)
};

// Bytes of device workspace attention_forward needs (tile schedule). Depends only on the
// table's capacity.
size_t forward_workspace_size(const DeviceSegmentTable& table);

// Bytes of device workspace attention_backward needs: tile schedules, delta = rowsum(dO * O)
// ([Hq, q_rows] fp32), fp32 accumulators for dk/dv when they are stored in 16 bits
// ([k_rows, Hkv, D] each) and, with options.deterministic == false, for dq ([q_rows, Hq, D]).
size_t backward_workspace_size(const DeviceSegmentTable& table, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                               DType dkv_dtype, const AttentionOptions& options = {});

// Forward attention over `table`, enqueued on `stream`: ForwardPlan, check_tensors, run.
//   q          [table.q_rows, Hq, D]   bf16 or fp16
//   k, v       [table.k_rows, Hkv, D]  q's dtype; Hq % Hkv == 0
//   out        [table.q_rows, Hq, D]   q's dtype. Every row of every segment's q_span is
//                                      written (tables from the builders cover every row);
//                                      padding rows and rows that see no key get 0
//   lse        Hq * q_rows floats, [Hq, q_rows]: natural log of the softmax denominator of the
//              scaled scores; -inf for padding rows and rows that see no key
//   max_logit  Hq floats or nullptr: max over allowed pairs of the scaled score; -inf if none
//   workspace  forward_workspace_size(table) bytes of device memory (contents need not be kept)
// Throws thdcp::Error before enqueueing anything when an argument is wrong (shape, dtype,
// head dim, Hq % Hkv, strides, pointer not on the current device or not 16-byte aligned,
// workspace too small).
void attention_forward(const DeviceSegmentTable& table, ConstThdTensor q, ConstThdTensor k, ConstThdTensor v,
                       ThdTensor out, float* lse, float* max_logit, void* workspace, size_t workspace_bytes,
                       cudaStream_t stream, const AttentionOptions& options = {});

// Backward attention over `table` from the forward's out and lse, enqueued on `stream`:
// BackwardPlan, check_tensors, run.
//   dout       [q_rows, Hq, D]   q's dtype
//   dq         [q_rows, Hq, D]   q's dtype or fp32; every row of every q_span is written
//   dk, dv     [k_rows, Hkv, D]  k's dtype or fp32 (then contiguous). Accumulated in fp32
//                                over every query head of the KV group and every segment
//                                that reaches the key row, rounded once when stored in 16
//                                bits. Rows no query saw are exactly 0.
//   workspace  backward_workspace_size(table, Hq, Hkv, D, dk.dtype, options) bytes
void attention_backward(const DeviceSegmentTable& table, ConstThdTensor q, ConstThdTensor k, ConstThdTensor v,
                        ConstThdTensor out, ConstThdTensor dout, const float* lse, ThdTensor dq, ThdTensor dk,
                        ThdTensor dv, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                        const AttentionOptions& options = {});

}  // namespace thdcp::cuda
