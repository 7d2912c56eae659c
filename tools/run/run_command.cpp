// `thdcp run`: argument handling and the summary table.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "io/args.h"
#include "io/atomic_file.h"
#include "commands.h"
#include "io/json.h"
#include "io/progress.h"
#include "run/cp_comm_args.h"
#include "run/run_inputs.h"
#include "run/run_job.h"
#include "step/cuda_head_dims.h"
#include "thdcp/cpu/attention.h"
#include "thdcp/comm/mpi.h"

namespace thdcp::tools {

namespace {

const char* kRunHelp =
    "usage: thdcp run [options]\n"
    "\n"
    "Builds a packed batch (document lengths lognormal: median 1500, sigma 1, max 16384),\n"
    "splits it over --cp ranks (the dual-chunk partition by default), runs CP forward and\n"
    "backward, and checks out, lse, max_logit, dq, dk, dv (and dsinks) against the single-device\n"
    "reference. Exits 0 only when every check passes. The ranks are threads of this process\n"
    "(--cp), or a thread per GPU (--gpus), or under mpirun/srun one process each (cp = the\n"
    "process count; each process takes the GPU of its local rank).\n"
    "\n"
    "options:\n"
    "  --backend B       auto (default: cuda when a GPU is visible, else cpu), cpu or cuda\n"
    "  --cp N            context-parallel size (default 4; under mpirun: the process count)\n"
    "  --gpus N          CP over N GPUs of this machine, a thread per GPU, NCCL between them\n"
    "                    (cp = N; the CUDA backend; not under mpirun)\n"
    "  --gpu-comm C      with --gpus: nccl (default), nccl-ce (NCCL's copy-engine collectives:\n"
    "                    the workspace a symmetric window, all-gathers and all-to-alls on the copy\n"
    "                    engines; NCCL 2.28.3 or later) or peer (one process's peer-copy group:\n"
    "                    gathers as peer copies on the copy engines, no NCCL)\n"
    "  --tokens T        rows of the packed batch, a multiple of 2*cp (contiguous: of cp)\n"
    "                    (default 16384, or the largest such multiple below it)\n"
    "  --cp-layout L     how the rows are split over the ranks: dual_chunk (default: each\n"
    "                    document padded to a multiple of 2*cp, rank r holding its chunks r and\n"
    "                    2cp-1-r) or contiguous (cp equal pieces of the packed buffer, no\n"
    "                    per-document padding)\n"
    "  --cp-comm C       all_gather (default: K/V gathered, dK/dV reduce-scattered), all_to_all\n"
    "                    (Ulysses: heads sharded for attention; HQ and HKV multiples of cp) or\n"
    "                    a2a+ag (all-to-all in groups of --cp-a2a-size consecutive ranks,\n"
    "                    AllGather across the cp/N groups; HQ and HKV multiples of N).\n"
    "                    The CPU backend runs every layout and communication, the CUDA backend\n"
    "                    all_gather and all_to_all with either layout (for a2a+ag, auto runs the\n"
    "                    CPU backend)\n"
    "  --cp-a2a-size N   a2a+ag's all-to-all group: N ranks, N dividing cp (1 is all_gather, cp\n"
    "                    all_to_all)\n"
    "  --cp-kv-gather G  all_gather's (a2a+ag's across the groups) K/V rows: auto (default: the halo when it moves fewer\n"
    "                    bytes), whole (every rank's K/V to every rank) or halo (only the key\n"
    "                    rows a rank's queries reach, e.g. within a left window; the CPU\n"
    "                    backend). The summary gives the bytes each rank received\n"
    "  --cp-reduce-dtype T  the dtype dK/dV partial sums cross ranks in: fp32 (default, the\n"
    "                    tightest) or --dtype's (half the bytes of the reduce-scatter)\n"
    "  --seed S          seed of lengths and tensor values (default 1234)\n"
    "  --mask M          causal (default) or full\n"
    "  --window L,R      sliding window on absolute positions: keys in [i-L, i+R]; -1 = unbounded\n"
    "  --heads HQ:HKV    query and key/value heads (default 8:2)\n"
    "  --head-dim D      head dimension of q and k, D_qk (default 64)\n"
    "  --v-head-dim D    head dimension of v and out, D_v (default: --head-dim; e.g. MLA's 192/128\n"
    "                    as --head-dim 192 --v-head-dim 128). The CPU backend takes any multiple of\n"
    "                    8 in [8, 256] for each; the CUDA kernels take\n"
    "                    {cuda head dims}\n"
    "                    (for another pair auto runs the CPU backend, saying why, and --backend\n"
    "                    cuda is refused)\n"
    "  --sinks           random attention sinks (one logit per query head, gpt-oss), checked with\n"
    "                    their gradient dsinks (CPU and CUDA backends)\n"
    "  --dtype T         bf16 (default), fp16 or fp32\n"
    "  --threads N       CPU threads in all, at least cp: each rank has one (default: every core;\n"
    "                    under mpirun: per process)\n"
    "\n"
    "input and output:\n"
    "  --lengths FILE    document lengths, one per line ('#' comments allowed), packed in order\n"
    "                    into batches of --tokens rows (each padded to a multiple of 2*cp under\n"
    "                    the dual-chunk layout)\n"
    "  --batch K         which packed batch of --lengths to run (default 0)\n"
    "  --load DIR        q.npy, k.npy, v.npy, cu_seqlens.npy [, cu_seqlens_padded.npy, dout.npy]\n"
    "                    ([T, H, D]; float32, float16, or bfloat16 stored as uint16 with\n"
    "                    --dtype bf16); re-padded for the CP size when needed, outputs mapped back\n"
    "  --save DIR        write inputs and outputs (out, lse, max_logit, dq, dk, dv) as .npy in the\n"
    "                    input's layout (padding rows 0, lse -inf); only after a successful run\n"
    "  --json FILE       machine-readable summary\n"
    "  --check           always run the single-device reference (default: when it is cheap)\n"
    "  --no-check        never run it\n"
    "  --quiet           no progress line (it is only shown when stdout is a terminal)\n"
    "  --allow-nonfinite with --load: run on inputs with NaN, infinities or values whose\n"
    "                    products overflow fp32 (refused by default, naming the element)\n"
    "  --max-memory SIZE host memory the run may take (e.g. 8G, 512M; default: the machine's, and\n"
    "                    under ulimit -v what the limit leaves); a run estimated to need more is\n"
    "                    refused before it allocates\n"
    "  --graph           many batches through CUDA graphs (GraphBank, dynamic CP, RoPE):\n"
    "                    see thdcp run --graph --help\n";

RunConfig parse_run_config(const Args& args) {
  RunConfig c;
  c.cp = static_cast<int>(args.get_int("cp", c.cp, 1, 64));
  c.gpus = static_cast<int>(args.get_int("gpus", 0, 1, 64));
  const std::string gpu_comm = args.get("gpu-comm", "nccl");
  if (gpu_comm != "nccl" && gpu_comm != "nccl-ce" && gpu_comm != "peer") {
    throw UsageError("--gpu-comm " + quote_excerpt(gpu_comm) + ": use nccl, nccl-ce or peer");
  }
  if (args.has("gpu-comm") && c.gpus == 0) {
    throw UsageError("--gpu-comm is the communicator between the GPUs of --gpus N: add --gpus N, or drop --gpu-comm");
  }
  c.peer_copy = gpu_comm == "peer";
  c.copy_engine = gpu_comm == "nccl-ce";
  c.tokens = args.get_int("tokens", c.tokens, 1, INT32_MAX);
  c.seed = args.get_seed("seed", c.seed);
  c.mask = parse_mask_flags(args, Mask::causal());
  if (args.has("check") && args.has("no-check")) throw UsageError("--check and --no-check contradict each other");
  c.check = args.has("check") ? CheckMode::kAlways : args.has("no-check") ? CheckMode::kNever : CheckMode::kAuto;
  c.quiet = args.has("quiet");
  c.lengths_file = args.get("lengths", "");
  c.batch_index = args.get_int("batch", 0, 0, INT32_MAX);
  c.load_dir = args.get("load", "");
  c.save_dir = args.get("save", "");
  c.json_file = args.get("json", "");
  c.allow_nonfinite = args.has("allow-nonfinite");
  if (c.allow_nonfinite && c.load_dir.empty()) throw UsageError("--allow-nonfinite applies to --load: give --load too");
  if (args.has("max-memory")) c.max_memory = parse_bytes("max-memory", args.get("max-memory", ""));
  if (args.has("batch") && c.lengths_file.empty()) throw UsageError("--batch picks a batch of --lengths: give --lengths too");
  if (!c.load_dir.empty() && !c.lengths_file.empty()) {
    throw UsageError("--load and --lengths both give the batch: use one of them");
  }
  if (!c.load_dir.empty() && args.has("tokens")) {
    throw UsageError("--tokens has no meaning with --load: the loaded tensors fix the rows");
  }
  const auto [hq, hkv] = args.get_pair("heads", {c.q_heads, c.kv_heads}, ':');
  if (hq < 1 || hkv < 1) throw UsageError("--heads " + quote_excerpt(args.get("heads", "")) + ": both counts must be >= 1");
  if (hq % hkv != 0) {
    throw UsageError("--heads " + quote_excerpt(args.get("heads", "")) + ": HQ must be a multiple of HKV (GQA/MQA)");
  }
  c.q_heads = hq;
  c.kv_heads = hkv;
  c.head_dim = args.get_int("head-dim", c.head_dim, 1, 1 << 16);
  if (!cpu_supports_head_dim(c.head_dim)) {
    throw UsageError("--head-dim " + std::to_string(c.head_dim) + ": use a multiple of 8 in [8, 256]");
  }
  c.v_head_dim = args.get_int("v-head-dim", c.head_dim, 1, 1 << 16);
  if (!cpu_supports_head_dim(c.v_head_dim)) {
    throw UsageError("--v-head-dim " + std::to_string(c.v_head_dim) + ": use a multiple of 8 in [8, 256]");
  }
  if (c.v_head_dim == c.head_dim) c.v_head_dim = 0;  // the library's "D_v = D_qk"
  c.sinks = args.has("sinks");
  if (!c.load_dir.empty() && (c.v_head_dim != 0 || c.sinks)) {
    throw UsageError(std::string(c.sinks ? "--sinks" : "--v-head-dim") +
                     " with --load: the loaded tensors have one head dim and no sinks; drop it");
  }
  c.dtype = parse_dtype(args.get("dtype", "bf16"));
  const std::string backend = args.get("backend", "auto");
  if (backend == "auto") {
    c.backend = Backend::kAuto;
  } else if (backend == "cpu") {
    c.backend = Backend::kCpu;
  } else if (backend == "cuda") {
    c.backend = Backend::kCuda;
  } else {
    throw UsageError("--backend " + quote_excerpt(backend) + ": use auto, cpu or cuda");
  }
  c.threads = static_cast<int>(args.get_int("threads", 0, 0, 4096));
  const std::string layout = args.get("cp-layout", "dual_chunk");
  if (layout == "dual_chunk") {
    c.cp_layout = CpLayout::kDualChunk;
  } else if (layout == "contiguous") {
    c.cp_layout = CpLayout::kContiguous;
  } else {
    throw UsageError("--cp-layout " + quote_excerpt(layout) + ": use dual_chunk or contiguous");
  }
  const CpCommArgs comm = parse_cp_comm(args);
  c.cp_comm = comm.comm;
  c.a2a_size = comm.a2a_size;
  const std::string reduce = args.get("cp-reduce-dtype", "fp32");
  if (reduce != "fp32" && reduce != "bf16" && reduce != "fp16") {
    throw UsageError("--cp-reduce-dtype " + quote_excerpt(reduce) + ": use fp32, bf16 or fp16");
  }
  c.reduce_dtype = parse_dtype(reduce);
  if (c.reduce_dtype != DType::kFloat32 && c.reduce_dtype != c.dtype) {
    throw UsageError("--cp-reduce-dtype " + std::string(dtype_name(c.reduce_dtype)) + " with --dtype " +
                     dtype_name(c.dtype) + ": dK/dV partial sums cross ranks in fp32 or in --dtype's; use fp32 or " +
                     dtype_name(c.dtype));
  }
  const std::string kv_gather = args.get("cp-kv-gather", "auto");
  if (kv_gather == "auto") {
    c.kv_gather = cp::KvGather::kAuto;
  } else if (kv_gather == "whole") {
    c.kv_gather = cp::KvGather::kWhole;
  } else if (kv_gather == "halo") {
    c.kv_gather = cp::KvGather::kHalo;
  } else {
    throw UsageError("--cp-kv-gather " + quote_excerpt(kv_gather) + ": use auto, whole or halo");
  }
  if (c.kv_gather == cp::KvGather::kHalo && c.cp_comm == cp::CpComm::kAllToAll) {
    throw UsageError("--cp-kv-gather halo gathers K/V rows, which --cp-comm all_to_all does not (it moves heads): "
                     "use --cp-comm all_gather, or --cp-kv-gather auto or whole");
  }
  return c;
}

// Once cp is known (--cp, --gpus or the MPI process count).
void check_cp_comm(const RunConfig& c) {
  tools::check_cp_comm(CpCommArgs{c.cp_comm, c.a2a_size}, c.cp, c.q_heads, c.kv_heads);
}

std::string mask_name(const Mask& m) {
  if (m.window_left < 0 && m.window_right < 0) return "full";
  if (m.window_left < 0 && m.window_right == 0) return "causal";
  return "window(" + std::to_string(m.window_left) + "," + std::to_string(m.window_right) + ")";
}

const char* backend_name(Backend b) { return b == Backend::kCuda ? "CUDA" : "CPU"; }

void print_report(const RunReport& r, const GlobalBatch& batch, const std::string& device) {
  const RunConfig& c = r.config;
  const std::string mode = c.cp_comm == cp::CpComm::kAllToAll ? "all-to-all"
                           : c.cp_comm == cp::CpComm::kA2aAg
                               ? "a2a+ag (" + std::to_string(c.a2a_size) + " x " + std::to_string(c.cp / c.a2a_size) +
                                     ": all-to-all in groups of " + std::to_string(c.a2a_size) + ", AllGather across " +
                                     std::to_string(c.cp / c.a2a_size) + ")"
                               : "AllGather";
  std::printf("thdcp run: %s CP (%s layout), %s backend (%s), %s communicator\n", mode.c_str(),
              cp_layout_name(c.cp_layout), backend_name(c.backend), device.c_str(), r.communicator.c_str());
  std::printf("  cp=%d  mask=%s  heads=%lld:%lld  head_dim=%lld", c.cp, mask_name(c.mask).c_str(),
              static_cast<long long>(c.q_heads), static_cast<long long>(c.kv_heads), static_cast<long long>(c.head_dim));
  if (c.v_head_dim != 0) std::printf("  v_head_dim=%lld", static_cast<long long>(c.v_head_dim));
  if (c.sinks) std::printf("  sinks");
  std::printf("  dtype=%s  seed=%llu\n", dtype_name(c.dtype), static_cast<unsigned long long>(c.seed));
  const double padding = r.rows > 0 ? 100.0 * static_cast<double>(r.rows - r.valid_tokens) / r.rows : 0.0;
  std::printf("\nbatch: %s\n", batch.source.c_str());
  std::printf("  %-22s %lld\n", "rows (T)", static_cast<long long>(r.rows));
  std::printf("  %-22s %lld\n", "valid tokens", static_cast<long long>(r.valid_tokens));
  std::printf("  %-22s %lld (longest %lld)\n", "documents", static_cast<long long>(r.documents),
              static_cast<long long>(r.longest));
  if (c.cp_layout == CpLayout::kDualChunk) {
    std::printf("  %-22s %.2f%% (lengths padded to multiples of 2*cp=%d)\n", "padding overhead", padding, 2 * c.cp);
  } else {
    std::printf("  %-22s %.2f%% (the buffer padded to a multiple of cp=%d)\n", "padding overhead", padding, c.cp);
  }
  std::printf("  %-22s %lld\n", "(query,key) pairs", static_cast<long long>(r.total_pairs));

  std::printf("\nper rank      rows    valid tokens   (query,key) pairs   share\n");
  for (size_t rank = 0; rank < r.rank_pairs.size(); ++rank) {
    const double share = r.total_pairs > 0 ? 100.0 * r.rank_pairs[rank] / r.total_pairs : 0.0;
    std::printf("  rank %-4zu %7lld %15lld %19lld %6.1f%%\n", rank, static_cast<long long>(r.rows / c.cp),
                static_cast<long long>(r.rank_valid_tokens[rank]), static_cast<long long>(r.rank_pairs[rank]), share);
  }

  if (!r.kv_traffic.forward_bytes.empty()) {
    std::printf("\n%-18s %8s %12s   (%s gather, --cp-kv-gather %s)\n", "K/V bytes received", "forward",
                "backward", cp::kv_gather_name(r.kv_traffic.gather), cp::kv_gather_name(c.kv_gather));
    for (size_t rank = 0; rank < r.kv_traffic.forward_bytes.size(); ++rank) {
      std::printf("  rank %-4zu %15lld %12lld\n", rank, static_cast<long long>(r.kv_traffic.forward_bytes[rank]),
                  static_cast<long long>(r.kv_traffic.backward_bytes[rank]));
    }
  }

  std::printf("\ntime (s)              forward   backward\n");
  const cp::Timings& f = r.forward_phases;
  const cp::Timings& b = r.backward_phases;
  std::printf("  %-20s %8.3f %10.3f\n", "cp, whole step", r.cp_forward_s, r.cp_backward_s);
  {
    for (int i = 0; i < static_cast<int>(cp::Phase::kCount); ++i) {
      const cp::Phase phase = static_cast<cp::Phase>(i);
      std::printf("  %-20s %8.3f %10.3f\n", (std::string("  ") + cp::phase_name(phase)).c_str(), f[phase], b[phase]);
    }
  }
  if (r.checked) {
    std::printf("  %-20s %8.3f %10.3f\n", "single-device ref", r.reference_forward_s, r.reference_backward_s);
  }
  if (c.backend == Backend::kCuda) {
    std::printf("  (phases: the slowest rank's, from CUDA events%s; see thdcp bench --cp for timings)\n",
                r.communicator.rfind("shared-gpu", 0) == 0 ? "; the ranks share one GPU and overlap" : "");
  } else {
    std::printf("  (phases: the slowest rank's%s)\n",
                r.communicator == "in-process" ? "; in-process ranks share this machine's cores" : "");
  }

  std::printf("\nhost memory: peak %.1f MiB (estimated %.1f MiB before the run%s)\n", r.host_bytes_peak / (1 << 20),
              r.host_bytes_estimated / (1 << 20),
              c.backend == Backend::kCuda ? ": thdcp's buffers; the CUDA driver and NCCL add their own" : "");

  if (!r.checked) {
    std::printf("\n%s\n", r.check_note.c_str());
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

Json report_json(const RunReport& r, const GlobalBatch& batch) {
  const RunConfig& c = r.config;
  Json config = Json::object();
  config.set("cp", c.cp)
      .set("cp_layout", cp_layout_name(c.cp_layout))
      .set("cp_comm", cp::cp_comm_name(c.cp_comm))
      .set("cp_kv_gather", cp::kv_gather_name(c.kv_gather))
      .set("cp_a2a_size", c.a2a_size)
      .set("communicator", r.communicator)
      .set("backend", c.backend == Backend::kCuda ? "cuda" : "cpu")
      .set("window_left", c.mask.window_left)
      .set("window_right", c.mask.window_right)
      .set("mask", mask_name(c.mask))
      .set("q_heads", c.q_heads)
      .set("kv_heads", c.kv_heads)
      .set("head_dim", c.head_dim)
      .set("v_head_dim", c.step_shape().value_head_dim())
      .set("sinks", c.sinks)
      .set("dtype", dtype_name(c.dtype))
      .set("seed", c.seed)
      .set("source", batch.source);
  Json layout = Json::object();
  layout.set("rows", r.rows)
      .set("valid_tokens", r.valid_tokens)
      .set("documents", r.documents)
      .set("longest_document", r.longest)
      .set("padding_fraction", r.rows > 0 ? static_cast<double>(r.rows - r.valid_tokens) / r.rows : 0.0)
      .set("pairs", r.total_pairs)
      .set("rank_pairs", Json::array_of(r.rank_pairs))
      .set("rank_valid_tokens", Json::array_of(r.rank_valid_tokens));
  auto phases = [](const cp::Timings& t, double wall) {
    Json j = Json::object();
    j.set("total", wall);
    for (int i = 0; i < static_cast<int>(cp::Phase::kCount); ++i) {
      const cp::Phase phase = static_cast<cp::Phase>(i);
      j.set(cp::phase_name(phase), t[phase]);
    }
    return j;
  };
  Json times = Json::object();
  times.set("cp_forward", phases(r.forward_phases, r.cp_forward_s))
      .set("cp_backward", phases(r.backward_phases, r.cp_backward_s));
  if (r.checked) times.set("reference_forward", r.reference_forward_s).set("reference_backward", r.reference_backward_s);
  Json checks = Json::object();
  for (const TensorCheck& t : r.checks) {
    Json one = Json::object();
    one.set("max_abs_error", t.comparison.max_abs_error)
        .set("max_rel_error", t.comparison.max_rel_error)
        .set("mismatches", t.comparison.mismatches)
        .set("count", t.comparison.count)
        .set("passed", t.comparison.passed());
    checks.set(t.name, one);
  }
  Json root = Json::object();
  root.set("command", "run").set("config", config).set("layout", layout).set("seconds", times);
  root.set("host_memory_bytes", Json::object()
                                    .set("peak", static_cast<int64_t>(r.host_bytes_peak))
                                    .set("estimated", static_cast<int64_t>(r.host_bytes_estimated)));
  if (!r.kv_traffic.forward_bytes.empty()) {
    root.set("kv_bytes_received", Json::object()
                                      .set("gather", cp::kv_gather_name(r.kv_traffic.gather))
                                      .set("forward", Json::array_of(r.kv_traffic.forward_bytes))
                                      .set("backward", Json::array_of(r.kv_traffic.backward_bytes)));
  }
  root.set("checked", r.checked);
  if (!r.checked) root.set("check_note", r.check_note);
  root.set("checks", checks).set("passed", r.passed());
  return root;
}

}  // namespace

int run_command(const std::vector<std::string>& argv) {
  if (std::find(argv.begin(), argv.end(), "--graph") != argv.end()) return run_graph_command(argv);
  const Args args(argv,
                  {"backend", "cp", "gpus", "gpu-comm", "tokens", "seed", "mask", "window", "heads", "head-dim", "v-head-dim",
                   "dtype", "threads", "lengths", "batch", "load", "save", "json", "max-memory", "cp-layout", "cp-comm", "cp-a2a-size",
                   "cp-kv-gather", "cp-reduce-dtype"},
                  {"check", "no-check", "quiet", "help", "allow-nonfinite", "sinks"});
  if (args.has("help")) {
    std::fputs(usage_with_cuda_head_dims(kRunHelp).c_str(), stdout);
    return 0;
  }
  RunConfig config = parse_run_config(args);
  std::unique_ptr<Communicator> comm;
  if (mpi::launched_by_mpi() && mpi::built_with_mpi()) {
    comm = mpi::world();
    if (args.has("cp") && config.cp != comm->size()) {
      throw UsageError("--cp " + std::to_string(config.cp) + " but mpirun started " + std::to_string(comm->size()) +
                       " processes: under MPI cp is the number of processes (drop --cp or match -np)");
    }
    config.cp = comm->size();
  }
  if (config.gpus > 0) {
    if (comm) throw UsageError("--gpus " + std::to_string(config.gpus) + " drives several GPUs from one process: do not start it under mpirun");
    if (args.has("cp") && config.cp != config.gpus) {
      throw UsageError("--cp " + std::to_string(config.cp) + " but --gpus " + std::to_string(config.gpus) +
                       ": with --gpus, cp is the number of GPUs (drop --cp)");
    }
    config.cp = config.gpus;
  }
  check_cp_comm(config);
  if (config.load_dir.empty()) {
    // The default is the largest batch of at most 16384 rows that splits over cp; a --tokens
    // that does not split is refused, naming the nearest values that do.
    const int64_t multiple = config.row_multiple();
    if (!args.has("tokens")) config.tokens = std::max(config.tokens / multiple, int64_t{1}) * multiple;
    if (config.cp_layout == CpLayout::kDualChunk) {
      check_tokens_multiple(config.tokens, multiple, "2*cp=" + std::to_string(multiple));
    } else {
      check_tokens_multiple(config.tokens, multiple, "cp=" + std::to_string(multiple),
                            "the contiguous layout gives every rank T/cp rows");
    }
  }
  // Until the ranks agree (run_rank_job, before its first collective: run/rank_agreement.h),
  // an error on one rank (a file, rank 0's output checks) stops every rank without a
  // collective; after it, the rank that fails ends the job.
  const bool root = !comm || comm->rank() == 0;
  // Output paths are checked before any work: a wrong one costs nothing.
  if (!config.save_dir.empty() && !config.json_file.empty()) {
    check_distinct_outputs({{"save", config.save_dir}, {"json", config.json_file}});
  }
  if (root && !config.save_dir.empty()) check_output_dir("save", config.save_dir, saved_file_names());
  if (root && !config.json_file.empty()) check_output_file("json", config.json_file);
  Progress progress(config.quiet || !root);
  progress.phase("preparing the batch");
  GlobalBatch batch;
  RunSize size;
  std::string device;
  const bool process_per_rank = static_cast<bool>(comm);
  if (!config.load_dir.empty()) {
    // Headers first: they fix the dtype and head dim the backend must support, and every
    // size; nothing large is read before memory is checked against them.
    const LoadFiles files = read_load_headers(config, args.has("dtype"), args.has("heads"), args.has("head-dim"));
    config.backend = resolve_backend(config, &device);
    const std::string source = "--load " + quote_excerpt(config.load_dir, kPathExcerptChars);
    check_host_memory(config, load_size(files), process_per_rank, source);
    batch = load_layout(config, files);
    check_host_memory(config, load_size(files, batch), process_per_rank, source);
    load_tensors(config, files, batch);
    size = load_size(files, batch);
  } else {
    // Before anything is allocated: the batch has --tokens rows, and at most one document per
    // 2*cp of them (dual chunk; contiguous: per row).
    config.backend = resolve_backend(config, &device);
    size.rows = config.tokens;
    size.sequences = config.cp_layout == CpLayout::kDualChunk ? config.tokens / (2 * config.cp) + 1 : config.tokens + 1;
    check_host_memory(config, size, process_per_rank, "--tokens " + std::to_string(config.tokens));
    batch = config.lengths_file.empty() ? make_default_batch(config) : make_batch_from_lengths(config);
    size.rows = batch.layout.total_rows();
  }
  GlobalOutputs outputs;
  RunReport report = comm ? run_rank_job(*comm, config, batch, outputs, progress)
                          : run_in_process_job(config, batch, outputs, progress);
  report.host_bytes_estimated = estimate_host_bytes(config, size, process_per_rank);
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  report.host_bytes_peak = static_cast<double>(usage.ru_maxrss) * 1024;  // Linux: kilobytes
  bool passed = report.passed();
  if (comm) {
    // Rank 0 decides; every rank exits with its verdict.
    float failed = passed ? 0.0f : 1.0f;
    comm->all_reduce_max(&failed, 1);
    passed = failed == 0.0f;
  }
  if (!root) return passed ? 0 : 1;
  progress.done();
  {
    // All outputs or none: staged in temporaries, renamed into place together.
    OutputSet out;
    if (passed && !config.save_dir.empty()) {
      out.stage_dir(config.save_dir, [&](const std::string& tmp) { save_run(tmp, batch, outputs); });
    }
    if (!config.json_file.empty()) out.stage_file(config.json_file, report_json(report, batch).dump(2) + "\n");
    out.commit();
  }
  print_report(report, batch, device);
  const std::string save_dir = quote_excerpt(config.save_dir, kPathExcerptChars);
  if (!passed && !config.save_dir.empty()) std::printf("nothing saved to %s: the check failed\n", save_dir.c_str());
  if (passed && !config.save_dir.empty()) std::printf("saved inputs and outputs to %s\n", save_dir.c_str());
  return passed ? 0 : 1;
}

}  // namespace thdcp::tools
