// thdcp bench --cp: AllGather CP with ranks sharing one GPU (bench_cp.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "step/host_step.h"
#include "thdcp/cp/cp.h"

namespace thdcp::tools {

// Runs one CP forward + backward with `cp` ranks sharing the GPU on a batch of `lengths`
// and compares out, dq, dk, dv with the CPU reference; prints one line per tensor.
bool verify_cp(int cp, const std::vector<int64_t>& lengths, const Mask& mask, const char* mask_name,
               const StepShape& shape, uint64_t seed);

// Per pass (step/device_step.h's Pass): 0 forward, 1 forward + backward, 2 forward + backward on the
// forward's K/V (cp::KvSource::kFromForward).
struct CpTiming {
  int64_t rows = 0;          // global rows after padding every document to 2*cp
  double graph_ms[3] = {};   // median of the pass of every rank captured as one graph (overlapped)
  cp::Timings phases[3];     // seconds per phase, mean over steps, summed over ranks (serial steps)
};

CpTiming time_cp(int cp, const std::vector<int64_t>& lengths, const Mask& mask, const StepShape& shape, uint64_t seed,
                 int warmup, int iters);

}  // namespace thdcp::tools
