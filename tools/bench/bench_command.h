// thdcp bench: times the CUDA attention kernels on a packed batch (thdcp bench --help).
#pragma once

#include <string>
#include <vector>

namespace thdcp::tools {

// Returns the exit code: 0 success, 1 the verification against the CPU reference failed
// (nothing is timed then), 2 bad input (thrown as thdcp::Error / UsageError).
int bench_command(const std::vector<std::string>& args);

}  // namespace thdcp::tools
