// A fork-join loop over independent work items, for the CPU backend.
#pragma once

#include <cstdint>
#include <functional>

namespace thdcp::cpu {

int resolve_num_threads(int requested);

// Calls body(item, worker) for every item in [0, count) on `num_threads` workers; worker is
// in [0, num_threads) so bodies can keep per-worker scratch. Items are handed out in order
// from a shared counter. The first exception thrown by a body is rethrown here.
void parallel_for(int64_t count, int num_threads, const std::function<void(int64_t, int)>& body);

}  // namespace thdcp::cpu
