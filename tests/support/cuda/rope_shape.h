// The RopePlan shape of a test case.
#pragma once

#include "thdcp/cuda/rope.h"

namespace thdcp::test {

// Rank `rank` of `cp` at the global `capacity`, heads `heads` in `dtype`, RoPE `config`;
// no table, no start offsets, no status word (a case sets those it uses).
cuda::RopeShape rope_shape(int cp, int rank, const Capacity& capacity, const HeadShape& heads, DType dtype,
                           const RopeConfig& config);

}  // namespace thdcp::test
