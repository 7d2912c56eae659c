#include "thread_pool.h"

#include <atomic>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace thdcp::cpu {

int resolve_num_threads(int requested) {
  if (requested > 0) return requested;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

void parallel_for(int64_t count, int num_threads, const std::function<void(int64_t, int)>& body) {
  if (count <= 0) return;
  const int workers = static_cast<int>(std::min<int64_t>(num_threads < 1 ? 1 : num_threads, count));
  std::atomic<int64_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto work = [&](int worker) {
    for (;;) {
      const int64_t item = next.fetch_add(1);
      if (item >= count) return;
      try {
        body(item, worker);
      } catch (...) {
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
        next.store(count);
        return;
      }
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(workers - 1));
  for (int w = 1; w < workers; ++w) {
    // A refused thread (a process or address-space limit) only means fewer workers: the
    // items are shared dynamically, and this thread does the rest.
    try {
      threads.emplace_back(work, w);
    } catch (const std::system_error&) {
      break;
    }
  }
  work(0);
  for (auto& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace thdcp::cpu
