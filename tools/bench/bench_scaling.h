// thdcp bench --scaling --gpus N: AllGather CP across GPUs over NCCL against the same batch on
// one GPU (bench_scaling.cpp; thdcp bench --scaling --help).
#pragma once

#include <string>
#include <vector>

namespace thdcp::tools {

// Returns the exit code: 0 success (every configuration that ran verified; skipped ones
// included), 1 a CP result did not match the single-GPU result (that configuration was not
// timed), 2 bad input or fewer GPUs than asked for (thrown as UsageError / thdcp::Error).
int bench_scaling_command(const std::vector<std::string>& argv);

}  // namespace thdcp::tools
