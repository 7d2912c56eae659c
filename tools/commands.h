// Subcommands of the thdcp tool. Each returns the process exit code: 0 success, 1 a failed
// check, 2 bad input (thdcp::Error / UsageError are thrown for the caller to report).
#pragma once

#include <string>
#include <vector>

namespace thdcp::tools {

int run_command(const std::vector<std::string>& args);
// `thdcp run --graph` (run_graph.cpp)
int run_graph_command(const std::vector<std::string>& args);
int plan_command(const std::vector<std::string>& args);

}  // namespace thdcp::tools
