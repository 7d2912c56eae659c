#include "io/memory_budget.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <thread>

#include "io/args.h"

namespace thdcp::tools {

namespace {

// glibc reserves this much address space for each malloc arena (HEAP_MAX_SIZE on 64-bit
// hosts) and makes at most 8 arenas per core (M_ARENA_MAX's default).
constexpr double kArenaBytes = 64.0 * (1 << 20);
constexpr int kArenasPerCore = 8;

double physical_memory() {
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
}

// The soft limit on address space, or 0 when there is none.
double address_space_limit() {
  struct rlimit limit {};
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 0;
  return static_cast<double>(limit.rlim_cur);
}

// The address space this process maps now (its VmSize), 0 if unknown.
double mapped_now() {
  std::ifstream statm("/proc/self/statm");
  double pages = 0;
  if (!(statm >> pages)) return 0;
  return pages * static_cast<double>(sysconf(_SC_PAGE_SIZE));
}

// Address space one thread reserves beyond what it allocates: its stack (ulimit -s; glibc
// takes 8 MiB when it is unlimited) and, up to the arena cap, a malloc arena.
double thread_reservation(int threads) {
  struct rlimit stack {};
  double stack_bytes = 8.0 * (1 << 20);
  if (getrlimit(RLIMIT_STACK, &stack) == 0 && stack.rlim_cur != RLIM_INFINITY) {
    stack_bytes = static_cast<double>(stack.rlim_cur);
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // The main thread uses the main arena and the process's own stack: already mapped.
  const int others = std::max(0, threads - 1);
  return others * stack_bytes + std::min(others, kArenasPerCore * cores) * kArenaBytes;
}

}  // namespace

std::string format_size(double bytes) {
  char text[32];
  if (bytes >= double(1 << 30)) {
    std::snprintf(text, sizeof(text), "%.1f GiB", bytes / double(1 << 30));
  } else {
    std::snprintf(text, sizeof(text), "%.1f MiB", bytes / double(1 << 20));
  }
  return text;
}

void check_memory_budget(const MemoryNeed& need, double max_memory, const std::string& what,
                         const std::string& details, const std::string& change) {
  const double budget = max_memory > 0 ? max_memory : physical_memory();
  if (need.buffers > budget) {
    throw UsageError(what + " needs about " + format_size(need.buffers) + " of host memory, more than " +
                     (max_memory > 0 ? "--max-memory" : "this machine's memory") + " (" + format_size(budget) +
                     ") (" + details + "): " + change + (max_memory > 0 ? " (or raise --max-memory)" : ""));
  }
  const double limit = address_space_limit();
  if (max_memory > 0 || limit <= 0) return;
  const double mapped = mapped_now();
  const double threads = thread_reservation(need.threads);
  if (need.buffers + threads <= limit - mapped) return;
  throw UsageError(what + " needs about " + format_size(need.buffers + threads) + " of address space (" +
                   format_size(need.buffers) + " of buffers" +
                   (need.threads > 1 ? ", " + format_size(threads) + " for the stacks and malloc arenas of " +
                                           std::to_string(need.threads - 1) + " more threads"
                                     : std::string()) +
                   "), more than the " + format_size(std::max(0.0, limit - mapped)) +
                   " the address-space limit (ulimit -v: " + format_size(limit) + ") leaves (" + details +
                   "): " + change + ", or raise the limit");
}

}  // namespace thdcp::tools
