// The plain parameter structs of the attention kernels (one per kernel family), filled by
// the host side (attention.cpp) after validation and passed to the kernels by value.
#pragma once

#include <cstdint>

#include "thdcp/plan/segment.h"

namespace thdcp::cuda::detail {

struct ForwardParams {
  const void* q;  // [q_rows, q_heads, D]
  const void* k;  // [k_rows, kv_heads, D]
  const void* v;
  void* out;         // [q_rows, q_heads, D]
  float* lse;        // [q_heads, q_rows]
  float* max_logit;  // [q_heads] or nullptr (set to -inf by the schedule kernel first)
  const Segment* segments;
  int num_segments;
  const int* tile_start;  // num_segments + 1 prefix sums of query tiles per segment
  int64_t q_rows;
  int q_heads;
  int kv_heads;
  float scale;       // softmax scale
  float scale_log2;  // scale * log2(e)
  int32_t window_left;
  int32_t window_right;
};

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
  float* dq_accum;  // [q_rows, q_heads, D] fp32, zeroed; non-null: dQ fused into dkv_kernel
  float* dk_accum;  // [k_rows, kv_heads, D] fp32, zeroed before the dK/dV kernel
  float* dv_accum;
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
