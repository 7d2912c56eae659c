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
#include "run/rank_agreement.h"
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

// How many processes the launcher started (1 without one).
int launcher_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}) {
    if (const char* value = std::getenv(name)) return std::atoi(value);
  }
  return 1;
}

// Processes of one launch that MPI cannot join would each run the whole job alone (srun
// whose MPI plugin is "none", the default of many Slurm installations; a thdcp built without
// MPI under mpirun). Empty when that is not the case.
std::string lone_processes_problem() {
  const int size = launcher_size();
  if (size <= 1) return "";
  if (!thdcp::mpi::launched_by_mpi()) {
    return "srun started " + std::to_string(size) + " tasks, but MPI did not reach them (no PMIX_RANK or PMI_SIZE "
           "in the environment), so each would run the whole job alone: give srun --mpi=pmix (srun --mpi=list shows "
           "what your Slurm offers), or start one task";
  }
  if (!thdcp::mpi::built_with_mpi()) {
    return "the launcher started " + std::to_string(size) + " processes, but this thdcp was built without MPI, so "
           "each would run the whole job alone: rebuild it with MPI (scripts/build.sh installs Open MPI), or start one "
           "process (thdcp run --cp N, or --gpus N)";
  }
  return "";
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

// A failed command: prints its message and returns the exit code. Under mpirun, before the
// first collective, every rank agrees first and one rank speaks for all (run/rank_agreement.h);
// after it, the failing rank says why and ends the job, since the others may be waiting in a
// collective it will never join. `text` + `more`: the message, printed without allocating.
int fail(thdcp::mpi::Session* session, int code, const char* kind, const char* text, const char* more = "") {
  if (thdcp::tools::rank_agreement_due()) return thdcp::tools::refuse_before_collectives(code, kind, text, more);
  if (session == nullptr) {
    std::fprintf(stderr, "thdcp: %s: %s%s\n", kind, text, more);
    return code;
  }
  std::fprintf(stderr, "thdcp: %s (rank %d): %s%s\n", kind, launcher_rank(), text, more);
  session->abort(code);
}

int run_command_line(const std::vector<std::string>& command_line) {
  std::vector<std::string> args = command_line;
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
}

}  // namespace

int main(int argc, char** argv) {
  // Under mpirun every process is one CP rank; MPI lives as long as main.
  std::unique_ptr<thdcp::mpi::Session> mpi_session;
  std::string command_name;
  int code = 0;
  try {
    if (const std::string problem = lone_processes_problem(); !problem.empty()) {
      // Every process refuses; the first says why, once.
      if (launcher_rank() == 0) std::fprintf(stderr, "thdcp: error: %s\n", problem.c_str());
      return 2;
    }
    if (thdcp::mpi::launched_by_mpi() && thdcp::mpi::built_with_mpi()) {
      mpi_session = std::make_unique<thdcp::mpi::Session>(&argc, &argv);
      thdcp::tools::enable_rank_agreement();
    }
    const std::vector<std::string> args(argv + 1, argv + argc);
    if (!args.empty()) command_name = args[0];
    code = run_command_line(args);
    // A command with no collective (plan, run --graph, --help) still tells the other ranks.
    thdcp::tools::agree_without_collectives();
  } catch (const thdcp::tools::RanksStopped& stopped) {
    return stopped.code();  // another rank failed before the run and said why
  } catch (const thdcp::Error& e) {
    // UsageError and every other thdcp::Error: bad input, exit 2.
    return fail(mpi_session.get(), 2, "error", e.what());
  } catch (const std::bad_alloc&) {
    // Bad input too (sizes beyond what this process may take), not a bug: exit 2, saying what
    // to change. Printed from constant strings: nothing more is allocated.
    return fail(mpi_session.get(), 2, "error", "out of memory: an allocation was refused: ",
                out_of_memory_advice(command_name));
  } catch (const std::exception& e) {
    return fail(mpi_session.get(), 3, "internal error", e.what());
  }
  return code;
}
