// The parameters of the RoPE kernel (rope.cu) and its launcher: raw pointers and int64
// strides, passed by value. RopePlan (rope_plan.cpp) fills them after its checks.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "thdcp/plan/contiguous.h"

namespace thdcp::cuda::detail {

// Pairs of the largest head (head_dim 256): the size of the inverse-frequency array.
constexpr int kRopeMaxPairs = 128;

// One tensor rotated by the launch. heads == 0: none (k of a q-only call).
struct RopeTensorParams {
  void* data;           // bf16 or fp16 elements (raw 16-bit storage)
  int64_t row_stride;   // elements from one row to the next
  int64_t head_stride;  // elements from one head to the next
  int heads;
};

struct RopeParams {
  RopeTensorParams q;
  RopeTensorParams k;
  const int32_t* cu_seqlens;         // global layout, max_seqs + 1 entries
  const int32_t* cu_seqlens_padded;  // global layout, max_seqs + 1 entries
  const int32_t* start_offsets;      // max_seqs entries, or null
  const float* cos_table;            // [table_rows][pairs], or null: cos/sin from inv_freq
  const float* sin_table;
  int64_t table_rows;
  int* status;                       // kRopeStatus* bits are ORed in; may be null
  int64_t rows;                      // local rows: max_tokens / cp
  int max_seqs;
  int cp;
  int rank;
  CpLayout cp_layout;                // which global rows the rank's rows are
  int pairs;                         // rotary_dim / 2
  float sin_sign;                    // +1 forward, -1 backward
  float inv_freq[kRopeMaxPairs];     // computed on the host (rope_inv_freq); unused with a table
};

// Enqueues the kernel over every (row, group of pairs): `vectorized` moves 16-byte words (the
// caller checked alignment, strides and rotary_dim), else single elements. The grid depends
// on params.rows and params.pairs only.
void launch_rope(const RopeParams& params, bool bf16, bool interleaved, bool vectorized, cudaStream_t stream);

}  // namespace thdcp::cuda::detail
