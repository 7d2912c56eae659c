// The host memory a command may take, and the one check `thdcp run` and `thdcp plan` make
// against it before they allocate (from shapes, headers and lengths, never by trying).
//
// Two budgets, both checked by check_memory_budget:
// - memory: --max-memory when given, else the machine's physical memory, against the
//   command's buffers at their peak;
// - address space, under a limit on it (ulimit -v, prlimit --as) and without --max-memory:
//   what the limit leaves beside what the process maps already, against the buffers plus what
//   each thread reserves beyond them (its stack, ulimit -s, and a malloc arena: glibc reserves
//   64 MiB of address space per arena, one per thread up to 8 per core).
// --max-memory replaces both: a budget the user gave is the one that counts.
#pragma once

#include <string>

namespace thdcp::tools {

struct MemoryNeed {
  double buffers = 0;  // bytes the command allocates at its peak (an upper estimate)
  int threads = 1;     // threads it runs at once, the main thread included
};

// Throws UsageError (exit 2) when `need` exceeds a budget, with both figures and what to do:
//   "<what> needs about 12.3 GiB of host memory, more than this machine's memory (7.6 GiB)
//    (<details>): <change>"
//   need        the estimate
//   max_memory  --max-memory in bytes; 0 when it was not given
//   what        who needs it: "this run", "thdcp plan"
//   details     the figures that set the estimate: "--tokens 65536, heads 8:2, ..."
//   change      what to change, e.g. "lower --tokens, --heads, --head-dim or --cp"
void check_memory_budget(const MemoryNeed& need, double max_memory, const std::string& what,
                         const std::string& details, const std::string& change);

// "1.5 GiB", "12.0 MiB": bytes as messages and reports print them.
std::string format_size(double bytes);

}  // namespace thdcp::tools
