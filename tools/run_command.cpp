// `thdcp run`: argument handling and the summary table.
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "args.h"
#include "commands.h"
#include "run_job.h"
#include "thdcp/attention.h"
#include "thdcp/mpi.h"

namespace thdcp::tools {

namespace {

const char* kRunHelp =
    "usage: thdcp run [options]\n"
    "\n"
    "Builds a packed batch (document lengths lognormal: median 1500, sigma 1, max 16384),\n"
    "splits it over --cp ranks with the dual-chunk partition, runs AllGather CP forward and\n"
    "backward, and checks out, lse, max_logit, dq, dk, dv against the single-device\n"
    "reference. Exits 0 only when every check passes. Under `mpirun -np N` each process is\n"
    "one rank (cp = N); otherwise the ranks are threads of this process.\n"
    "\n"
    "options:\n"
    "  --cp N            context-parallel size (default 4; under mpirun: the process count)\n"
    "  --tokens T        rows of the packed batch (default 16384)\n"
    "  --seed S          seed of lengths and tensor values (default 1234)\n"
    "  --mask M          causal (default) or full\n"
    "  --window L,R      sliding window on absolute positions: keys in [i-L, i+R]; -1 = unbounded\n"
    "  --heads HQ:HKV    query and key/value heads (default 8:2)\n"
    "  --head-dim D      head dimension (default 64)\n"
    "  --dtype T         bf16 (default), fp16 or fp32\n"
    "  --threads N       CPU threads in all (default: every core)\n"
    "  --no-check        skip the single-device reference\n";

RunConfig parse_run_config(const Args& args) {
  RunConfig c;
  c.cp = static_cast<int>(args.get_int("cp", c.cp, 1, 64));
  c.tokens = args.get_int("tokens", c.tokens, 1, INT32_MAX);
  c.seed = args.get_seed("seed", c.seed);
  const std::string mask = args.get("mask", "causal");
  if (mask == "causal") {
    c.mask = Mask::causal();
  } else if (mask == "full") {
    c.mask = Mask::full();
  } else {
    throw UsageError("--mask " + mask + ": use causal or full (or --window L,R)");
  }
  if (args.has("window")) {
    if (args.has("mask")) throw UsageError("--window and --mask both set the mask: give one of them");
    const auto [left, right] = args.get_pair("window", {-1, -1}, ',');
    c.mask = Mask::window(static_cast<int32_t>(left), static_cast<int32_t>(right));
  }
  const auto [hq, hkv] = args.get_pair("heads", {c.q_heads, c.kv_heads}, ':');
  if (hq < 1 || hkv < 1) throw UsageError("--heads " + args.get("heads", "") + ": both counts must be >= 1");
  if (hq % hkv != 0) {
    throw UsageError("--heads " + args.get("heads", "") + ": HQ must be a multiple of HKV (GQA/MQA)");
  }
  c.q_heads = hq;
  c.kv_heads = hkv;
  c.head_dim = args.get_int("head-dim", c.head_dim, 1, 1 << 16);
  if (!cpu_supports_head_dim(c.head_dim)) {
    throw UsageError("--head-dim " + std::to_string(c.head_dim) + ": use a multiple of 8 in [8, 256]");
  }
  c.dtype = parse_dtype(args.get("dtype", "bf16"));
  c.threads = static_cast<int>(args.get_int("threads", 0, 0, 4096));
  c.check = !args.has("no-check");
  if (c.tokens < 2 * c.cp) {
    throw UsageError("--tokens " + std::to_string(c.tokens) + ": a batch needs at least 2*cp=" +
                     std::to_string(2 * c.cp) + " rows");
  }
  return c;
}

std::string mask_name(const Mask& m) {
  if (m.window_left < 0 && m.window_right < 0) return "full";
  if (m.window_left < 0 && m.window_right == 0) return "causal";
  return "window(" + std::to_string(m.window_left) + "," + std::to_string(m.window_right) + ")";
}

void print_report(const RunReport& r) {
  const RunConfig& c = r.config;
  std::printf("thdcp run: AllGather CP, CPU backend, %s communicator\n", r.communicator.c_str());
  std::printf("  cp=%d  mask=%s  heads=%lld:%lld  head_dim=%lld  dtype=%s  seed=%llu\n", c.cp,
              mask_name(c.mask).c_str(), static_cast<long long>(c.q_heads), static_cast<long long>(c.kv_heads),
              static_cast<long long>(c.head_dim), dtype_name(c.dtype), static_cast<unsigned long long>(c.seed));
  const double padding = r.rows > 0 ? 100.0 * static_cast<double>(r.rows - r.valid_tokens) / r.rows : 0.0;
  std::printf("\nbatch\n");
  std::printf("  %-22s %lld\n", "rows (T)", static_cast<long long>(r.rows));
  std::printf("  %-22s %lld\n", "valid tokens", static_cast<long long>(r.valid_tokens));
  std::printf("  %-22s %lld (longest %lld)\n", "documents", static_cast<long long>(r.documents),
              static_cast<long long>(r.longest));
  std::printf("  %-22s %.2f%% (lengths padded to multiples of 2*cp=%d)\n", "padding overhead", padding, 2 * c.cp);
  std::printf("  %-22s %lld\n", "(query,key) pairs", static_cast<long long>(r.total_pairs));

  std::printf("\nper rank      rows    valid tokens   (query,key) pairs   share\n");
  for (size_t rank = 0; rank < r.rank_pairs.size(); ++rank) {
    const double share = r.total_pairs > 0 ? 100.0 * r.rank_pairs[rank] / r.total_pairs : 0.0;
    std::printf("  rank %-4zu %7lld %15lld %19lld %6.1f%%\n", rank, static_cast<long long>(r.rows / c.cp),
                static_cast<long long>(r.rank_valid_tokens[rank]), static_cast<long long>(r.rank_pairs[rank]), share);
  }

  std::printf("\ntime (s)              forward   backward\n");
  const cp::Timings& f = r.forward_phases;
  const cp::Timings& b = r.backward_phases;
  std::printf("  %-20s %8.3f %10.3f\n", "cp, whole step", r.cp_forward_s, r.cp_backward_s);
  std::printf("  %-20s %8.3f %10.3f\n", "  check", f.check, b.check);
  std::printf("  %-20s %8.3f %10.3f\n", "  all-gather K/V", f.gather, b.gather);
  std::printf("  %-20s %8.3f %10.3f\n", "  reorder", f.reorder, b.reorder);
  std::printf("  %-20s %8.3f %10.3f\n", "  attention", f.attention, b.attention);
  std::printf("  %-20s %8.3f %10.3f\n", "  reduce", f.reduce, b.reduce);
  if (r.checked) {
    std::printf("  %-20s %8.3f %10.3f\n", "single-device ref", r.reference_forward_s, r.reference_backward_s);
  }
  std::printf("  (phases: the slowest rank's%s)\n",
              r.communicator == "in-process" ? "; in-process ranks share this machine's cores" : "");

  if (!r.checked) {
    std::printf("\ncheck skipped (--no-check)\n");
    return;
  }
  std::printf("\ncheck against the single-device reference\n");
  std::printf("  %-10s %14s %14s %12s  %s\n", "tensor", "max abs err", "max rel err", "mismatches", "result");
  for (const TensorCheck& t : r.checks) {
    std::printf("  %-10s %14.3e %14.3e %12lld  %s\n", t.name.c_str(), t.comparison.max_abs_error,
                t.comparison.max_rel_error, static_cast<long long>(t.comparison.mismatches),
                t.comparison.passed() ? "ok" : "FAIL");
  }
  std::printf("\nresult: %s\n", r.passed() ? "PASS" : "FAIL");
}

}  // namespace

int run_command(const std::vector<std::string>& argv) {
  const Args args(argv,
                  {"cp", "tokens", "seed", "mask", "window", "heads", "head-dim", "dtype", "threads"},
                  {"no-check", "help"});
  if (args.has("help")) {
    std::fputs(kRunHelp, stdout);
    return 0;
  }
  RunConfig config = parse_run_config(args);
  if (mpi::launched_by_mpi() && mpi::built_with_mpi()) {
    auto comm = mpi::world();
    if (args.has("cp") && config.cp != comm->size()) {
      throw UsageError("--cp " + std::to_string(config.cp) + " but mpirun started " + std::to_string(comm->size()) +
                       " processes: under MPI cp is the number of processes (drop --cp or match -np)");
    }
    config.cp = comm->size();
    const GlobalBatch batch = make_default_batch(config);
    const RunReport report = run_rank_job(*comm, config, batch);
    // Rank 0 decides; every rank exits with its verdict.
    float failed = report.passed() ? 0.0f : 1.0f;
    comm->all_reduce_max(&failed, 1);
    if (comm->rank() == 0) print_report(report);
    return failed > 0 ? 1 : 0;
  }
  const GlobalBatch batch = make_default_batch(config);
  const RunReport report = run_in_process_job(config, batch);
  print_report(report);
  return report.passed() ? 0 : 1;
}

}  // namespace thdcp::tools
