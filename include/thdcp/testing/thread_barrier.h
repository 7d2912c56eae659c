// A reusable barrier for the threads of in-process ranks (C++17 has no std::barrier), for
// tests and tools that line the ranks up around a CUDA graph capture.
#pragma once

#include <condition_variable>
#include <mutex>

namespace thdcp {

class ThreadBarrier {
 public:
  explicit ThreadBarrier(int count) : count_(count) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const long generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation; });
  }

 private:
  int count_;
  int arrived_ = 0;
  long generation_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
};

}  // namespace thdcp
