// A thread per rank for the in-process and shared-GPU groups, started so that a refused
// thread (a process or address-space limit) is a thdcp::Error, not std::terminate or a hang.
#pragma once

#include <functional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "thdcp/core/error.h"

namespace thdcp::detail {

// Runs rank_main(r) on a thread for every r in [0, size) and joins them. If a thread cannot
// be started, abort(reason) releases the ranks already running (their collectives throw),
// they are joined, and thdcp::Error names the rank, the cause and what to change.
inline void run_rank_threads(int size, const std::function<void(int)>& rank_main,
                             const std::function<void(const std::string&)>& abort, const char* group) {
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(size));
  std::string refused;
  for (int r = 0; r < size; ++r) {
    try {
      threads.emplace_back(rank_main, r);
    } catch (const std::system_error& e) {
      refused = "could not start the thread of rank " + std::to_string(r) + " of " + std::to_string(size) + " (" +
                e.what() + ")";
      abort(refused + "; collective abandoned");
      break;
    }
  }
  for (auto& t : threads) t.join();
  THDCP_CHECK(refused.empty(), group << ": " << refused
                                     << ": the process is at a limit on threads or address space (ulimit -u, -v, "
                                        "-s): use fewer ranks or raise the limit");
}

}  // namespace thdcp::detail
