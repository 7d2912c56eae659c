// The online softmax of the attention forward kernels (FlashAttention's running row max and
// row sum, in the exp2 domain), for the mma.sync m16n8 accumulator layout both kernel
// families use in registers: a warp's 16 query rows, this thread's two of them ("halves"),
// four threads per row. Also each row's final normaliser (lse, the weight of its O
// accumulator, attention sinks) and the max_logit reduction.
#pragma once

#include <cmath>

#include "attention_params.h"
#include "tensor_core.cuh"

namespace thdcp::cuda::detail {

// The running maxima of this thread's two rows raised by the scores s of one key tile (the
// four threads of a row exchange their maxima).
template <int kN>
__device__ __forceinline__ void raised_row_max(const float (&s)[kN / 8][4], const float (&row_max)[2],
                                               float (&new_max)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float tile_max = -INFINITY;
#pragma unroll
    for (int nf = 0; nf < kN / 8; ++nf) tile_max = fmaxf(tile_max, fmaxf(s[nf][2 * half], s[nf][2 * half + 1]));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
    new_max[half] = fmaxf(row_max[half], tile_max);
  }
}

// s = P = exp2(s scale_log2 - offset) for this thread's two rows, added to its row sums.
template <int kN>
__device__ __forceinline__ void exponentiate_scores(float (&s)[kN / 8][4], const float (&offset)[2],
                                                    float scale_log2, float (&row_sum)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int nf = 0; nf < kN / 8; ++nf) {
#pragma unroll
      for (int e = 2 * half; e < 2 * half + 2; ++e) {
        const float prob = fast_exp2(fmaf(s[nf][e], scale_log2, -offset[half]));
        s[nf][e] = prob;
        row_sum[half] += prob;
      }
    }
  }
}

// One step of the online softmax for a warp's 16 rows (this thread: two rows, "halves")
// over kN keys of scores s (m16n8 layout, raw), with the output accumulator o (kD columns):
// raises the running row maxima, rescales o and the partial row sums when a maximum rose
// (a warp-uniform vote: a correction factor of exp2(0) would leave them unchanged anyway),
// and turns s into P = exp2(s scale_log2 - max scale_log2), adding it to row_sum (this
// thread's part of the denominator).
template <int kN, int kD>
__device__ __forceinline__ void online_softmax_step(float (&s)[kN / 8][4], float (&o)[kD / 8][4],
                                                    float (&row_max)[2], float (&row_sum)[2], float scale_log2) {
  float new_max[2];
  raised_row_max<kN>(s, row_max, new_max);
  const bool raised = new_max[0] != row_max[0] || new_max[1] != row_max[1];
  // A row that has seen only masked keys keeps max -inf; subtracting 0 then keeps
  // exp2(-inf) = 0 instead of NaN.
  float offset[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) offset[half] = (new_max[half] == -INFINITY ? 0.0f : new_max[half]) * scale_log2;
  if (__any_sync(0xffffffffu, raised)) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float correction = fast_exp2(row_max[half] * scale_log2 - offset[half]);
      row_sum[half] *= correction;
#pragma unroll
      for (int df = 0; df < kD / 8; ++df) {
        o[df][2 * half] *= correction;
        o[df][2 * half + 1] *= correction;
      }
    }
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) row_max[half] = new_max[half];
  exponentiate_scores<kN>(s, offset, scale_log2, row_sum);
}

// online_softmax_step without touching O, whose product with V may still be in flight: raises
// the row maxima, scales this thread's row sums by the correction exp2((old max - new max)
// scale_log2), writes that correction, and turns s into P (adding it to the row sums).
// Returns whether some row of the warp raised its maximum (warp-uniform); if not, every
// correction is 1.
template <int kN>
__device__ __forceinline__ bool online_softmax_scores(float (&s)[kN / 8][4], float (&row_max)[2],
                                                      float (&row_sum)[2], float scale_log2,
                                                      float (&correction)[2]) {
  float new_max[2];
  raised_row_max<kN>(s, row_max, new_max);
  const bool raised = __any_sync(0xffffffffu, new_max[0] != row_max[0] || new_max[1] != row_max[1]);
  float offset[2];  // 0 for a row that has seen only masked keys: exp2(-inf) = 0, not NaN
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    offset[half] = (new_max[half] == -INFINITY ? 0.0f : new_max[half]) * scale_log2;
    correction[half] = raised ? fast_exp2(row_max[half] * scale_log2 - offset[half]) : 1.0f;
    row_sum[half] *= correction[half];
    row_max[half] = new_max[half];
  }
  exponentiate_scores<kN>(s, offset, scale_log2, row_sum);
  return raised;
}

template <int kD>
__device__ __forceinline__ void rescale_rows(float (&o)[kD / 8][4], const float (&correction)[2]) {
#pragma unroll
  for (int df = 0; df < kD / 8; ++df) {
    o[df][0] *= correction[0];
    o[df][1] *= correction[0];
    o[df][2] *= correction[1];
    o[df][3] *= correction[1];
  }
}

// A row's softmax normaliser: lse and the weight 1 / denominator that scales its O
// accumulator. `max_logit` is the row's largest scaled score and `sum` = sum_j exp(s_j -
// max_logit) (0: the row saw no key). With a sink (an unscaled logit; -inf: none) the
// denominator gains exp(sink - max_logit), computed from max(max_logit, sink) so that neither
// exponential overflows: a sink far above every score leaves the row's out near 0.
struct RowNormaliser {
  float lse, weight;
};

__device__ __forceinline__ RowNormaliser row_normaliser(float max_logit, float sum, float sink) {
  const bool seen = sum > 0.0f;
  if (sink == -INFINITY) return {seen ? max_logit + logf(sum) : -INFINITY, seen ? 1.0f / sum : 0.0f};
  const float top = seen ? fmaxf(max_logit, sink) : sink;
  const float rows_share = seen ? sum * expf(max_logit - top) : 0.0f;
  const float denominator = rows_share + expf(sink - top);
  return {top + logf(denominator), seen ? expf(max_logit - top) / denominator : 0.0f};
}

// max_logit[head] = max over the warp's thread_max values (atomic across warps and blocks).
__device__ __forceinline__ void reduce_max_logit(const ForwardParams& p, int head, float thread_max) {
  if (p.max_logit == nullptr) return;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    thread_max = fmaxf(thread_max, __shfl_xor_sync(0xffffffffu, thread_max, offset));
  }
  if ((threadIdx.x & 31) == 0 && thread_max > -INFINITY) atomic_max_float(p.max_logit + head, thread_max);
}

}  // namespace thdcp::cuda::detail
