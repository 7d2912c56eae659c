// The reductions of the shared-GPU communicator: each reads the same block of every rank's
// buffer (pointers gathered by the host rendezvous) and combines them in rank order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace thdcp::detail {

constexpr int kSharedGpuMaxRanks = 64;

struct RankPointers {
  const float* rank[kSharedGpuMaxRanks];
};

// dst[i] = sum over r < ranks of src.rank[r][offset + i], summed in rank order.
void launch_sum_over_ranks(const RankPointers& src, int ranks, size_t offset, float* dst, size_t count,
                           cudaStream_t stream);

// The same over 16-bit elements (bf16 if `bf16`, else fp16): summed in fp32 in rank order,
// rounded once into dst (to nearest even).
void launch_sum16_over_ranks(const RankPointers& src, int ranks, size_t offset, void* dst, size_t count, bool bf16,
                             cudaStream_t stream);

// dst[i] = max over r < ranks of src.rank[r][i].
void launch_max_over_ranks(const RankPointers& src, int ranks, float* dst, size_t count, cudaStream_t stream);

}  // namespace thdcp::detail
