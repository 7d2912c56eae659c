// Host timing of a CP step's phases (cp::Timings): the CPU step sets charge the time since
// the last phase() call to the phase it named.
#pragma once

#include <chrono>

#include "thdcp/cp/cp.h"

namespace thdcp::cp::detail {

class PhaseClock {
 public:
  explicit PhaseClock(Timings* timings) : timings_(timings) {}

  // Subsequent work belongs to `next`; Phase::kCount stops the clock.
  void phase(Phase next) {
    const Clock::time_point now = Clock::now();
    if (timings_ && current_ != Phase::kCount) (*timings_)[current_] += std::chrono::duration<double>(now - start_).count();
    current_ = next;
    start_ = now;
  }

 private:
  using Clock = std::chrono::steady_clock;
  Timings* timings_;
  Phase current_ = Phase::kCount;
  Clock::time_point start_;
};

}  // namespace thdcp::cp::detail
