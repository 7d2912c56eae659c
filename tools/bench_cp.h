// thdcp bench --cp: AllGather CP with ranks sharing one GPU (bench_cp.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "thdcp/cp/cp.h"

namespace thdcp::tools {

// Runs one CP forward + backward with `cp` ranks sharing the GPU on a batch of `lengths`
// and compares out, dq, dk, dv with the CPU reference; prints one line per tensor.
bool verify_cp(int cp, const std::vector<int64_t>& lengths, const Mask& mask, const char* mask_name, int q_heads,
               int kv_heads, int head_dim, DType dtype, uint64_t seed);

struct CpTiming {
  int64_t rows = 0;             // global rows after padding every document to 2*cp
  double fwd_graph_ms = 0;      // median of the captured forward of every rank
  double fwd_bwd_graph_ms = 0;  // median of the captured forward + backward of every rank
  cp::Timings fwd_phases;       // seconds per phase, mean over steps, summed over ranks
  cp::Timings fwd_bwd_phases;
};

CpTiming time_cp(int cp, const std::vector<int64_t>& lengths, const Mask& mask, int q_heads, int kv_heads,
                 int head_dim, DType dtype, uint64_t seed, int warmup, int iters);

}  // namespace thdcp::tools
