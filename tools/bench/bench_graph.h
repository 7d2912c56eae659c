// thdcp bench --graph: eager vs graph replay of a step of RoPE + CP attention layers.
#pragma once

#include <string>
#include <vector>

namespace thdcp::tools {

int bench_graph_command(const std::vector<std::string>& argv);

// Throws UsageError (exit 2) when no CUDA device can be used, saying why (bench_command.cpp).
void require_gpu(const char* what);

}  // namespace thdcp::tools
