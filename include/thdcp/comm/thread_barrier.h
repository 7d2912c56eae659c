// A reusable barrier for threads that stand for ranks (C++17 has no std::barrier), which can
// be aborted: the in-process communicator's collectives meet on one, and tests and tools line
// their rank threads up on one around a CUDA graph capture.
#pragma once

#include <condition_variable>
#include <mutex>

namespace thdcp {

class ThreadBarrier {
 public:
  explicit ThreadBarrier(int count) : count_(count) {}

  // Blocks until `count` threads have called wait() in this round and returns true; returns
  // false (at once, or when woken) once abort() has been called before the round completed.
  bool wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (aborted_) return false;
    const long generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return true;
    }
    cv_.wait(lock, [&] { return generation_ != generation || aborted_; });
    return generation_ != generation;
  }

  // Wakes every waiter; every later wait() returns false.
  void abort() {
    std::lock_guard<std::mutex> lock(mutex_);
    aborted_ = true;
    cv_.notify_all();
  }

  bool aborted() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return aborted_;
  }

 private:
  int count_;
  int arrived_ = 0;
  long generation_ = 0;
  bool aborted_ = false;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
};

}  // namespace thdcp
