// The plain parameter structs of the attention kernels (one per kernel family), filled by
// the host side (forward_plan.cpp, backward_plan.cpp) after validation and passed to the
// kernels by value.
//
// The tensors' strides travel in a second struct (ForwardStrides, BackwardStrides), not
// inside ForwardParams: NVVM (CUDA 13.0) reads a by-value kernel parameter larger than 128
// bytes through a pointer, and ForwardParams (112 bytes) with its 64 bytes of strides lost
// the forward's loop unswitching on the mask (a masked key tile cost about twice the
// instructions, seen in PTX and SASS). Each struct here stays at or below 128 bytes, except
// BackwardParams, which was above it already.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "thdcp/plan/segment.h"

namespace thdcp::cuda::detail {

// Element (row, head, d) of a THD tensor x is at x + row * row + head * head + d (elements;
// resolved on the host, never 0 here). Rows and heads come in either order (a head-major
// view has head > row). The host checks that each is a multiple of 16 bytes (cp.async rows),
// that row < kMaxRowStride and that a row's heads span at most 2^31 elements, so that
// offsets inside a row and steps of up to 32 rows fit in 32 bits (row_offset, pass_step in
// tensor_core.cuh): 64-bit multiplies per tile would cost the instruction-bound loops. The
// overlap rules (outputs apart from everything) are the call's (thdcp/core/overlap.h).
struct Strides {
  int64_t row;
  int64_t head;
};

constexpr int64_t kMaxRowStride = int64_t{1} << 26;

struct ForwardStrides {
  Strides q, k, v, out;
};

// A TMA map of one THD tensor (tensor_map.h) for the Hopper kernels, which take them as
// __grid_constant__ parameters. Coordinates are (column, head, row), innermost first, or
// (column, row, head) when heads_outer is 1 (head-major views: the driver gets the outer
// strides in increasing order).
struct ThdTensorMap {
  CUtensorMap map;
  int32_t heads_outer;
};

struct ForwardTensorMaps {
  ThdTensorMap q, k, v;
};

struct BackwardStrides {
  Strides q, k, v, out, dout, dq;  // out: read by the delta kernel only
};

struct ForwardParams {
  const void* q;  // [q_rows, q_heads, D]
  const void* k;  // [k_rows, kv_heads, D]
  const void* v;
  void* out;         // [q_rows, q_heads, D], q's dtype
  float* lse;        // [q_heads, q_rows]
  float* max_logit;  // [q_heads] or nullptr (set to -inf by the schedule kernel first)
  const float* sinks;  // [q_heads] fp32 logits or nullptr (thdcp/plan/attention_shape.h)
  const Segment* segments;
  int num_segments;
  const int* tile_start;  // num_segments + 1 prefix sums of query tiles per segment
  int* work_counter;      // the Hopper kernel's work items handed out (zeroed by the schedule kernel)
  int64_t q_rows;
  int q_heads;
  int kv_heads;
  float scale;       // softmax scale
  float scale_log2;  // scale * log2(e)
  int32_t window_left;
  int32_t window_right;
};

static_assert(sizeof(ForwardParams) <= 128, "ForwardParams must stay a by-value kernel parameter (see above)");

struct BackwardParams {
  const void* q;
  const void* k;
  const void* v;
  const void* out;
  const void* dout;
  const float* lse;  // [q_heads, q_rows]
  float* delta;      // [q_heads, q_rows] workspace: rowsum(dout * out)
  void* dq;          // [q_rows, q_heads, D], q's dtype or fp32 (dq_fp32)
  bool dq_fp32;
  // The fp32 accumulators are contiguous ([rows, heads, D]): in the workspace, or dk/dv
  // themselves when they are fp32 (the host requires those contiguous).
  // Non-null: dQ fused into the dK/dV pass. Portable: [q_rows, q_heads, D] fp32, zeroed.
  // Hopper (dkvq_kernel_sm90): 64-row tiles per (query tile of the dQ grid, query head),
  // dq_half_offset's layout, written by the first key tile of each (no zeroing).
  float* dq_accum;
  // Hopper's fused pass: [query tiles of the dQ grid, q_heads], zeroed: the key tiles that
  // have added into each query tile (they add in increasing order). Null otherwise.
  int* dq_order;
  float* dk_accum;  // [k_rows, kv_heads, D] fp32, zeroed before the dK/dV kernel
  float* dv_accum;
  const int32_t* dkv_rows;  // [k_rows] accumulator row of each key row, or null: the same row
  // Non-null (the Hopper dK/dV kernels only): dk and dv themselves, contiguous, in q's dtype,
  // zeroed by the host, for a table that reaches every key row from one segment and no
  // dkv_rows. The kernels then store their rows there, rounded once from fp32 (the bits that
  // adding into zeroed accumulators and casting gave), instead of adding into dk_accum and
  // dv_accum; rows no block writes stay 0.
  void* dk_out;
  void* dv_out;
  const Segment* segments;
  int num_segments;
  const int* q_tile_start;  // prefix sums of query tiles (dQ kernel)
  const int* k_tile_start;  // prefix sums of key tiles (dK/dV kernel)
  int64_t q_rows;
  int64_t k_rows;
  int q_heads;
  int kv_heads;
  float scale;
  float scale_log2;
  int32_t window_left;
  int32_t window_right;
};

}  // namespace thdcp::cuda::detail
