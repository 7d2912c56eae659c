// The attention forward's epilogue: a query tile's out rows (O scaled by its normaliser,
// rounded to the storage dtype) and lse, from the mma.sync m16n8 accumulator layout both
// kernel families keep O in.
#pragma once

#include "attention_params.h"
#include "softmax.cuh"
#include "tensor_core.cuh"
#include "thdcp/plan/segment.h"

namespace thdcp::cuda::detail {

// Writes out = o / denominator and lse for this thread's rows tile_row and tile_row + 8
// (below span_rows; padding rows get 0 and -inf, and so do rows that saw no key unless their
// head has a sink: lse = sink then), and folds their maximum logit (the sink excluded) into
// thread_max.
template <typename Storage, int kD>
__device__ __forceinline__ void store_forward_rows(const ForwardParams& p, const Strides& out_strides,
                                                   const Segment& seg, int head, int m0,
                                                   int tile_row, int span_rows, int pair_col,
                                                   const float (&o)[kD / 8][4], const float (&row_max)[2],
                                                   const float (&row_sum)[2], float& thread_max) {
  using Traits = StorageTraits<Storage>;
  using Element = typename Traits::Element;
  const float head_sink = p.sinks != nullptr ? p.sinks[head] : -INFINITY;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float sum = row_sum[half];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int r = tile_row + half * 8;
    const bool seen = sum > 0.0f;  // false for padding rows and rows that see no key
    if (seen) thread_max = fmaxf(thread_max, row_max[half] * p.scale);
    if (r < span_rows) {
      const int64_t row = static_cast<int64_t>(seg.q_row) + m0 + r;
      const int64_t lse_index = static_cast<int64_t>(head) * p.q_rows + row;
      const bool valid = m0 + r < seg.q_len;  // padding rows have no sink either
      const RowNormaliser n = row_normaliser(row_max[half] * p.scale, sum, valid ? head_sink : -INFINITY);
      const float lse = n.lse;
      const float weight = n.weight;
      const int64_t offset = row * out_strides.row + static_cast<int64_t>(head) * out_strides.head + pair_col;
#pragma unroll
      for (int df = 0; df < kD / 8; ++df) {
        *reinterpret_cast<uint32_t*>(static_cast<Element*>(p.out) + offset + df * 8) =
            Traits::pack(o[df][2 * half] * weight, o[df][2 * half + 1] * weight);
      }
      if ((threadIdx.x & 3) == 0) p.lse[lse_index] = lse;
    }
  }
}

}  // namespace thdcp::cuda::detail
