// A thread per rank for the in-process and shared-GPU groups, started so that a refused
// thread (a process or address-space limit) is a thdcp::Error, not std::terminate or a hang,
// and the failure the group reports when ranks fail. Shared by comm and comm_device (not
// an API of its own: namespace detail).
#pragma once

#include <exception>
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

// After the ranks of a group have run: rethrows the failure that caused the abort, not the
// ones it set off on the other ranks (Errors whose message holds `knock_on`), and else the
// first of those. Returns if no rank failed.
inline void rethrow_root_failure(const std::vector<std::exception_ptr>& failures, const char* knock_on) {
  std::exception_ptr first_knock_on;
  for (const auto& f : failures) {
    if (!f) continue;
    try {
      std::rethrow_exception(f);
    } catch (const Error& e) {
      if (std::string(e.what()).find(knock_on) == std::string::npos) std::rethrow_exception(f);
      if (!first_knock_on) first_knock_on = f;
    } catch (...) {
      std::rethrow_exception(f);
    }
  }
  if (first_knock_on) std::rethrow_exception(first_knock_on);
}

}  // namespace thdcp::detail
