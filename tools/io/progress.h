// A one-line progress display for long phases of the thdcp tool, and the wall-clock helpers
// the tool times with.
//
// Shown only when stdout is a terminal (so piped or redirected output holds nothing but the
// summary) and not turned off with --quiet; drawn on stderr, and only for a phase that has
// lasted more than a second, by a background thread that redraws it four times a second.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace thdcp::tools {

// Wall seconds (milliseconds) since `start` on the steady clock: how the tool times its phases.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
inline double milliseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// The median of timings (of an even count, the upper middle one); 0 when there are none.
double median(std::vector<double> values);

class Progress {
 public:
  explicit Progress(bool quiet);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Starts a new phase (ends the previous one).
  void phase(const std::string& name);
  // Counts one finished unit of the phase (a rank, a batch); shown as "k/total".
  void set_total(int total);
  void step();
  // Ends the phase and clears the line.
  void done();

  bool enabled() const { return enabled_; }

 private:
  void loop();
  void clear_line();

  bool enabled_ = false;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::thread thread_;
  bool stop_ = false;
  std::string name_;
  double started_ = 0;
  bool drawn_ = false;
  std::atomic<int> done_units_{0};
  int total_units_ = 0;
};

}  // namespace thdcp::tools
