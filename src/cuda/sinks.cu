// The gradient of attention sinks (thdcp/plan/attention_shape.h): a sink is a logit in every
// query row's softmax denominator that carries no value, so with P_sink = exp(sink - lse) of
// a row, d(loss)/d(sink) = -P_sink * (dO . O) summed over the rows, where dO . O is the row's
// delta of the backward. One block per head sums its rows in a fixed order (each thread a
// fixed set of rows in fp64, then the block's fixed tree), so the result is the same bits
// every run.
#include <cub/block/block_reduce.cuh>

#include "backward_support.h"
#include "grid.h"
#include "thdcp/cuda/check.h"
#include "thdcp/cuda/reorder.h"

namespace thdcp::cuda::detail {

namespace {

// 1024 threads per head, each summing every 1024th row with four independent fp64 partial
// sums (so that the loads of four rows are in flight at once), then the block's fixed tree.
constexpr int kSinkThreads = 1024;
constexpr int kSinkLanes = 4;

__device__ __forceinline__ double sink_term(float sink, float row_lse, float row_delta) {
  // Padding rows (lse -inf, out 0) have no sink; rows with a finite lse all do.
  return row_lse != -INFINITY ? static_cast<double>(expf(sink - row_lse)) * row_delta : 0.0;
}

__global__ void __launch_bounds__(kSinkThreads) sink_gradient_kernel(const float* sinks, const float* lse,
                                                                     const float* delta, int64_t rows, float* dsinks) {
  using Reduce = cub::BlockReduce<double, kSinkThreads>;
  __shared__ typename Reduce::TempStorage scratch;
  const int head = static_cast<int>(blockIdx.x);
  const float sink = sinks[head];
  const float* head_lse = lse + head * rows;
  const float* head_delta = delta + head * rows;
  double sum[kSinkLanes] = {};
  int64_t row = threadIdx.x;
  for (; row + (kSinkLanes - 1) * kSinkThreads < rows; row += kSinkLanes * kSinkThreads) {
#pragma unroll
    for (int i = 0; i < kSinkLanes; ++i) {
      sum[i] += sink_term(sink, head_lse[row + i * kSinkThreads], head_delta[row + i * kSinkThreads]);
    }
  }
  for (int i = 0; row < rows; row += kSinkThreads, ++i) sum[i] += sink_term(sink, head_lse[row], head_delta[row]);
  const double total = Reduce(scratch).Sum((sum[0] + sum[1]) + (sum[2] + sum[3]));
  if (threadIdx.x == 0) dsinks[head] = static_cast<float>(-total);
}

__global__ void sum_rank_parts_kernel(const float* parts, int ranks, int64_t count, float* sum) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  double total = 0.0;
  for (int r = 0; r < ranks; ++r) total += parts[r * count + i];
  sum[i] = static_cast<float>(total);
}

}  // namespace

void launch_sink_gradient(const float* sinks, const float* lse, const float* delta, int64_t rows, int heads,
                          float* dsinks, cudaStream_t stream) {
  if (heads == 0) return;
  sink_gradient_kernel<<<heads, kSinkThreads, 0, stream>>>(sinks, lse, delta, rows, dsinks);
  THDCP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace thdcp::cuda::detail

namespace thdcp::cuda {

void sum_rank_parts(const float* parts, int ranks, int64_t count, float* sum, cudaStream_t stream) {
  if (count == 0) return;
  constexpr int kThreads = 128;
  detail::sum_rank_parts_kernel<<<detail::blocks_for(count, kThreads), kThreads, 0, stream>>>(
      parts, ranks, count, sum);
  THDCP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace thdcp::cuda
