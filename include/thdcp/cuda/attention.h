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
// Attention (below) puts a table plan and both plans over one workspace: the single-device
// call of every front door.
//
// Supported: bf16 and fp16 storage, the head dims of cuda_supports_head_dims (D_qk = D_v in
// {64, 96, 128, 192, 256}, MLA's D_qk 192 with D_v 128), Hq a multiple of Hkv (GQA/MQA),
// fp32 arithmetic on tensor cores (Hopper: wgmma for the forward and the deterministic
// backward, see kernel_family). All pointers are device pointers of the plan's device,
// 16-byte aligned.
//
// Tensors may be any strided views (ThdTensor::row_stride, head_stride, in elements; head_dim
// is always contiguous), read and written in place, never copied: q, k, v as views of one
// packed QKV buffer [T, Hq + 2 Hkv, D], padded rows or heads, head-major [H, T, D] memory
// (row_stride = D, head_stride = T * D or a longer cache's rows * D; heads before rows), on
// both kernel families, forward and backward (thdcp/core/tensor.h). The CUDA kernels need,
// for every tensor: each stride they apply (row_stride with more than one row, head_stride
// with more than one head) a multiple of 16 bytes (8 elements of bf16/fp16: cp.async rows
// and TMA strides), row_stride below 2^26 elements, (heads - 1) * head_stride + head_dim at
// most 2^31 elements, and a 16-byte-aligned data pointer; each refusal names the tensor, the
// value and the rule. Inputs (q, k, v, out and dout of the backward) may overlap; outputs
// (out, dq, dk, dv) must not overlap themselves or any other tensor of the call
// (thdcp/core/overlap.h). fp32 dk/dv are accumulated in place and must be contiguous.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "thdcp/core/tensor.h"
#include "thdcp/core/workspace.h"
#include "thdcp/cuda/table.h"
#include "thdcp/plan/attention_shape.h"

namespace thdcp::cuda {

// The (D_qk, D_v) pairs the CUDA kernels are compiled for (cuda_head_dims_text names them);
// v_head_dim 0 means D_v = head_dim, as in HeadShape.
bool cuda_supports_head_dims(int64_t head_dim, int64_t v_head_dim);
// cuda_supports_head_dims(head_dim, head_dim).
bool cuda_supports_head_dim(int64_t head_dim);
// The supported pairs in words, for error messages and usage text.
const char* cuda_head_dims_text();

// The kernels the current device runs: "sm90" (Hopper, compute capability 9.x: warpgroup
// MMA kernels for the forward and the deterministic backward) or "portable" (mma.sync
// kernels: on every other GPU, for AttentionOptions::deterministic = false, and everywhere when the
// environment variable THDCP_PORTABLE_KERNELS is 1). Host queries only; safe during stream
// capture.
const char* kernel_family();

// Everything about a call except the data: the heads (Hq, Hkv, D_qk, D_v), the table and
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

// Single-device attention over a batch's layout: the one object the C ABI, the PyTorch ops
// and the tools call (TransformerEngine's nvte_fused_attn_* plays this part for its bindings).
// It holds the table plan, the forward plan and the backward plan of one AttentionProblem
// over one caller workspace, and builds the batch's table on the stream at every call.
//
//   q, out, dout, dq   [max_tokens, Hq, D]   dtype (dq: dq_dtype)
//   k, v, dk, dv       [max_tokens, Hkv, D]  dtype (dk, dv: dkv_dtype)
//   lse                Hq * max_tokens floats, [Hq, max_tokens]: natural log of the softmax
//                      denominator of the scaled scores; -inf for padding rows and rows that
//                      see no key
//   max_logit          Hq floats or nullptr: max over allowed pairs of the scaled score; -inf
//                      if none
// Every row of out, lse, dq, dk and dv is written: padding rows and rows that see no key get
// 0 (and lse -inf); key rows no query saw get exactly 0. dk and dv are accumulated in fp32
// over every query head of the KV group and rounded once when stored in 16 bits. The problem
// (thdcp/plan/attention_shape.h) takes dtype bf16 or fp16 and the head dims of cuda_supports_head_dims here.
class Attention {
 public:
  // Bytes of device workspace: the segment table, the forward's and the backward's. Depends
  // only on the problem (and is the same for every AttentionOptions and kernel family).
  static size_t workspace_size(const AttentionProblem& problem, const AttentionOptions& options = {});

  // Validates the problem and options for the current device (which becomes the object's),
  // checks the workspace (workspace_size bytes of its device memory, 256-byte aligned; its
  // contents need not be kept between calls, but calls must not overlap in time) and sets
  // the kernels' attributes. Throws thdcp::Error naming what to change.
  Attention(const AttentionProblem& problem, const AttentionOptions& options, void* workspace,
            size_t workspace_bytes);

  // Plan-time check of the buffers the calls will take (e.g. once for a graph's static
  // buffers): what forward()/backward() check, and pointer queries that every pointer is
  // device memory of the object's device. Either tensor set may be null.
  void check(const DeviceLayout& layout, const ForwardTensors* forward, const BackwardTensors* backward) const;

  // Enqueue the table build and the attention on `stream` (a stream of the object's device,
  // which must be current). `layout` is the batch's, in capacity form. Checks with host
  // arithmetic only that the layout and tensors match the problem, and throws thdcp::Error
  // before enqueueing anything if not: capture-safe.
  void forward(const DeviceLayout& layout, const ForwardTensors& tensors, cudaStream_t stream) const;
  void backward(const DeviceLayout& layout, const BackwardTensors& tensors, cudaStream_t stream) const;

  const AttentionProblem& problem() const { return problem_; }
  int device() const { return forward_.device(); }
  const char* kernel_family() const { return forward_.kernel_family(); }

 private:
  struct Parts;
  Attention(const AttentionProblem& problem, const AttentionOptions& options, const TablePlan& table,
            WorkspaceCarver carver);
  Attention(const AttentionProblem& problem, const AttentionOptions& options, const TablePlan& table,
            const Parts& parts);

  AttentionProblem problem_;
  TablePlan table_;
  Segment* segments_;
  ForwardPlan forward_;
  BackwardPlan backward_;
};

}  // namespace thdcp::cuda
