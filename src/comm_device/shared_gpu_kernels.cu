#include "shared_gpu_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "thdcp/core/cuda_check.h"

namespace thdcp::detail {

namespace {

constexpr int kThreads = 256;

__global__ void sum_over_ranks(RankPointers src, int ranks, size_t offset, float* __restrict__ dst, size_t count) {
  for (size_t i = blockIdx.x * size_t{kThreads} + threadIdx.x; i < count; i += size_t{gridDim.x} * kThreads) {
    // Starting from rank 0's value (not 0.0f) keeps a lone rank's -0.0 as it is.
    float sum = src.rank[0][offset + i];
    for (int r = 1; r < ranks; ++r) sum += src.rank[r][offset + i];
    dst[i] = sum;
  }
}

template <typename T>
__global__ void sum16_over_ranks(RankPointers src, int ranks, size_t offset, T* __restrict__ dst, size_t count) {
  for (size_t i = blockIdx.x * size_t{kThreads} + threadIdx.x; i < count; i += size_t{gridDim.x} * kThreads) {
    // Widened exactly, summed in fp32 in rank order, rounded once (to nearest even).
    float sum = static_cast<float>(reinterpret_cast<const T*>(src.rank[0])[offset + i]);
    for (int r = 1; r < ranks; ++r) sum += static_cast<float>(reinterpret_cast<const T*>(src.rank[r])[offset + i]);
    dst[i] = T(sum);
  }
}

__global__ void max_over_ranks(RankPointers src, int ranks, float* __restrict__ dst, size_t count) {
  for (size_t i = blockIdx.x * size_t{kThreads} + threadIdx.x; i < count; i += size_t{gridDim.x} * kThreads) {
    float result = src.rank[0][i];
    for (int r = 1; r < ranks; ++r) result = fmaxf(result, src.rank[r][i]);
    dst[i] = result;
  }
}

unsigned grid_for(size_t count) {
  const size_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 4096 ? blocks : 4096);
}

}  // namespace

void launch_sum_over_ranks(const RankPointers& src, int ranks, size_t offset, float* dst, size_t count,
                           cudaStream_t stream) {
  if (count == 0) return;
  sum_over_ranks<<<grid_for(count), kThreads, 0, stream>>>(src, ranks, offset, dst, count);
  THDCP_CHECK_CUDA(cudaGetLastError());
}

void launch_sum16_over_ranks(const RankPointers& src, int ranks, size_t offset, void* dst, size_t count, bool bf16,
                             cudaStream_t stream) {
  if (count == 0) return;
  if (bf16) {
    sum16_over_ranks<__nv_bfloat16>
        <<<grid_for(count), kThreads, 0, stream>>>(src, ranks, offset, static_cast<__nv_bfloat16*>(dst), count);
  } else {
    sum16_over_ranks<__half><<<grid_for(count), kThreads, 0, stream>>>(src, ranks, offset, static_cast<__half*>(dst), count);
  }
  THDCP_CHECK_CUDA(cudaGetLastError());
}

void launch_max_over_ranks(const RankPointers& src, int ranks, float* dst, size_t count, cudaStream_t stream) {
  if (count == 0) return;
  max_over_ranks<<<grid_for(count), kThreads, 0, stream>>>(src, ranks, dst, count);
  THDCP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace thdcp::detail
