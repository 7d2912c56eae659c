// thdcp: attention over packed sequences with context parallelism.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "io/args.h"
#if defined(THDCP_CLI_WITH_CUDA)
#include "bench/bench_command.h"
#endif
#include "commands.h"
#include "thdcp/core/error.h"
#include "thdcp/comm/mpi.h"

namespace {

const char* kUsage =
    "usage: thdcp <command> [options]\n"
    "\n"
    "commands:\n"
    "  run    the main job: a packed batch through AllGather CP, forward and backward,\n"
    "         checked against the single-device reference (thdcp run --help)\n"
    "  plan   capacities (max_seqs) for CUDA graphs from document lengths (thdcp plan --help)\n"
    "  bench  verify, then time the CUDA attention kernels (thdcp bench --help; needs CUDA)\n"
    "\n"
    "Exit codes: 0 success, 1 a check failed, 2 bad input (the message says what to change),\n"
    "3 an internal error (a bug in thdcp: please report it with the command line).\n";

// This process's rank under mpirun/srun, from the launcher's environment (0 otherwise).
int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
    if (const char* value = std::getenv(name)) return std::atoi(value);
  }
  return 0;
}

// What to change when a command ran out of memory: its sizes, or the limit. The command's
// estimate (io/memory_budget.h) refuses most such runs before they allocate; this is for the
// rest (another limit, an estimate that fell short).
const char* out_of_memory_advice(const std::string& command) {
  if (command == "run") {
    return "lower --tokens, --cp, --heads, --head-dim or --threads, or raise the limit that refused it "
           "(ulimit -v; --max-memory does not give memory, it only checks the estimate)";
  }
  if (command == "plan") {
    return "make fewer batches (raise --tokens, use --long-docs truncate, or give fewer lengths), "
           "or raise the limit that refused it (ulimit -v)";
  }
  if (command == "bench") return "lower --tokens or the heads, or raise the limit that refused it (ulimit -v)";
  return "raise the limit that refused it (ulimit -v)";
}

}  // namespace

int main(int argc, char** argv) {
  // Under mpirun every process is one CP rank; MPI lives as long as main.
  std::unique_ptr<thdcp::mpi::Session> mpi_session;
  std::string command_name;
  try {
    if (thdcp::mpi::launched_by_mpi() && thdcp::mpi::built_with_mpi()) {
      mpi_session = std::make_unique<thdcp::mpi::Session>(&argc, &argv);
    }
    std::vector<std::string> args(argv + 1, argv + argc);
    if (!args.empty()) command_name = args[0];
    if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
      std::fputs(kUsage, args.empty() ? stderr : stdout);
      return args.empty() ? 2 : 0;
    }
    const std::string command = args[0];
    args.erase(args.begin());
    if (command == "run") return thdcp::tools::run_command(args);
    if (command == "plan") return thdcp::tools::plan_command(args);
    if (command == "bench") {
#if defined(THDCP_CLI_WITH_CUDA)
      return thdcp::tools::bench_command(args);
#else
      throw thdcp::tools::UsageError("thdcp bench times the CUDA kernels: this thdcp was built without CUDA");
#endif
    }
    throw thdcp::tools::UsageError("unknown command " + thdcp::quote_excerpt(command) +
                                   ": use run, plan or bench (see thdcp --help)");
  } catch (const thdcp::tools::UsageError& e) {
    if (!mpi_session || !thdcp::tools::collectives_started()) {
      // Every rank parses the same command line and refuses it the same way, before any
      // collective: rank 0 says why, and no rank needs to abort the others.
      if (launcher_rank() == 0) std::fprintf(stderr, "thdcp: error: %s\n", e.what());
      return 2;
    }
    std::fprintf(stderr, "thdcp: error (rank %d): %s\n", launcher_rank(), e.what());
    mpi_session->abort(2);
  } catch (const thdcp::Error& e) {
    if (mpi_session) {
      std::fprintf(stderr, "thdcp: error (rank %d): %s\n", launcher_rank(), e.what());
    } else {
      std::fprintf(stderr, "thdcp: error: %s\n", e.what());
    }
    // A rank that stops alone must not leave the others waiting in a collective.
    if (mpi_session) mpi_session->abort(2);
    return 2;
  } catch (const std::bad_alloc&) {
    // Bad input too (sizes beyond what this process may take), not a bug: exit 2, saying what
    // to change. Printed from constant strings: nothing more is allocated.
    const char* advice = out_of_memory_advice(command_name);
    if (mpi_session) {
      std::fprintf(stderr, "thdcp: error (rank %d): out of memory: an allocation was refused: %s\n", launcher_rank(),
                   advice);
      mpi_session->abort(2);
    }
    std::fprintf(stderr, "thdcp: error: out of memory: an allocation was refused: %s\n", advice);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "thdcp: internal error: %s\n", e.what());
    if (mpi_session) mpi_session->abort(3);
    return 3;
  }
}
