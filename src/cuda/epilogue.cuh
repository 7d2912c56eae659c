// The attention kernels' epilogues, from the mma.sync m16n8 accumulator layout: the forward's
// out rows (O scaled by its normaliser, rounded to the storage dtype) and lse, which both
// kernel families share, and the portable dK/dV pass's additions into its fp32 accumulators.
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

// The portable dK/dV pass's results: this warp's 32 key rows (from key_row0 of the block's
// keys, which start at key n0 of the segment's, valid_k of them valid) x the columns of dk
// (kDkColumns of them from dk_col0) and dv (kDvColumns from dv_col0), added
// into the fp32 accumulators p.dk_accum ([rows, kv_heads, kDqk], row stride dk_stride;
// scaled by the softmax scale, applied once here) and p.dv_accum ([rows, kv_heads, kDv]), at
// the row p.dkv_rows maps each key to (or the key's own row). One fp32 addition per
// (segment, element): with at most two segments reaching a key row and the accumulators
// starting at zero, the result does not depend on their order.
template <int kDqk, int kDv, int kDkColumns, int kDvColumns>
__device__ __forceinline__ void add_dkv_rows(const BackwardParams& p, const Segment& seg, int kv_head, int n0,
                                             int key_row0, int valid_k, int dk_col0, int dv_col0, int64_t dk_stride,
                                             int64_t dv_stride, const float (&dk)[2][kDkColumns / 8][4],
                                             const float (&dv)[2][kDvColumns / 8][4]) {
  const int lane = threadIdx.x % 32;
  const int group_row = lane >> 2;
  const int pair_col = (lane & 3) * 2;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int key_local = key_row0 + 16 * mi + group_row + half * 8;
      if (key_local >= valid_k) continue;
      const int64_t key = static_cast<int64_t>(seg.k_row) + n0 + key_local;
      const int64_t row = p.dkv_rows ? p.dkv_rows[key] : key;
      const int64_t dk_offset = row * dk_stride + static_cast<int64_t>(kv_head) * kDqk + dk_col0 + pair_col;
      const int64_t dv_offset = row * dv_stride + static_cast<int64_t>(kv_head) * kDv + dv_col0 + pair_col;
#pragma unroll
      for (int df = 0; df < (kDkColumns > kDvColumns ? kDkColumns : kDvColumns) / 8; ++df) {
        if (df < kDkColumns / 8) {
          atomicAdd(p.dk_accum + dk_offset + df * 8, dk[mi][df][2 * half] * p.scale);
          atomicAdd(p.dk_accum + dk_offset + df * 8 + 1, dk[mi][df][2 * half + 1] * p.scale);
        }
        if (df < kDvColumns / 8) {
          atomicAdd(p.dv_accum + dv_offset + df * 8, dv[mi][df][2 * half]);
          atomicAdd(p.dv_accum + dv_offset + df * 8 + 1, dv[mi][df][2 * half + 1]);
        }
      }
    }
  }
}

}  // namespace thdcp::cuda::detail
