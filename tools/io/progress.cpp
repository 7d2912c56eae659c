#include "io/progress.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <system_error>

namespace thdcp::tools {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

Progress::Progress(bool quiet) {
  enabled_ = !quiet && isatty(STDOUT_FILENO) && isatty(STDERR_FILENO);
  if (!enabled_) return;
  try {
    thread_ = std::thread([this] { loop(); });
  } catch (const std::system_error&) {
    enabled_ = false;  // no progress line rather than no run
  }
}

Progress::~Progress() {
  if (!enabled_) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  clear_line();
}

void Progress::phase(const std::string& name) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  name_ = name;
  started_ = now_seconds();
  done_units_ = 0;
  total_units_ = 0;
}

void Progress::set_total(int total) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  total_units_ = total;
}

void Progress::step() {
  if (enabled_) ++done_units_;
}

void Progress::done() {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  name_.clear();
  clear_line();
}

void Progress::clear_line() {
  if (drawn_) {
    std::fputs("\r\033[K", stderr);
    std::fflush(stderr);
    drawn_ = false;
  }
}

void Progress::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, std::chrono::milliseconds(250));
    if (stop_ || name_.empty()) continue;
    const double elapsed = now_seconds() - started_;
    if (elapsed < 1.0) continue;
    if (total_units_ > 0) {
      std::fprintf(stderr, "\r\033[K[thdcp] %s  %d/%d  %.1f s", name_.c_str(), done_units_.load(), total_units_,
                   elapsed);
    } else {
      std::fprintf(stderr, "\r\033[K[thdcp] %s  %.1f s", name_.c_str(), elapsed);
    }
    std::fflush(stderr);
    drawn_ = true;
  }
}

}  // namespace thdcp::tools
