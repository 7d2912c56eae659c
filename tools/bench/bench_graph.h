// thdcp bench --graph: eager vs graph replay of a step of RoPE + CP attention layers.
#pragma once

#include <string>
#include <vector>

namespace thdcp::tools {

int bench_graph_command(const std::vector<std::string>& argv);

}  // namespace thdcp::tools
