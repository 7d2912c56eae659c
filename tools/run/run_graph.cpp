// `thdcp run --graph`: N steps of different random packings through RoPE + AllGather-CP
// attention forward and backward, each run through a GraphBank (warm-up, one capture per CP
// size and capacity, replays; eager fallback beyond max_seqs), a sample of steps checked
// against the same step run eagerly, bit for bit. With --dynamic-cp the CP size changes per
// batch: the world (ranks sharing GPU 0) is split once into groups of every size, and the
// world/c groups of the chosen size c run world/c micro-batches side by side.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "io/args.h"
#include "commands.h"
#include "run/cp_comm_args.h"
#include "step/cuda_head_dims.h"

#if defined(THDCP_CLI_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "io/progress.h"
#include "step/cuda_handles.h"
#include "step/graph_step.h"
#include "step/visible_gpus.h"
#include "thdcp/comm_device/shared_gpu.h"
#include "thdcp/core/cuda_check.h"
#include "thdcp/graph/cp_groups.h"
#include "thdcp/comm/thread_barrier.h"
#include "thdcp/testing/workload.h"
#endif

namespace thdcp::tools {

namespace {

const char* kRunGraphHelp =
    "usage: thdcp run --graph [options]\n"
    "\n"
    "Runs --steps batches of random packings (lognormal documents) through RoPE + CP attention\n"
    "forward and backward (AllGather, all-to-all or a2a+ag), captured as CUDA graphs: one graph\n"
    "per CP size and\n"
    "capacity, captured after a warm-up run and replayed for every later batch that fits;\n"
    "a batch with more documents than --max-seqs allows runs eagerly (a fallback). Every\n"
    "--check-every-th step (and the first replay of each CP size) is run again eagerly and\n"
    "must equal the graph's result bit for bit. Ranks are threads sharing GPU 0.\n"
    "\n"
    "  --steps N          batches (default 12)\n"
    "  --cp N             CP size (default 2)\n"
    "  --dynamic-cp LIST  CP sizes to choose from per batch, e.g. 1,2,4 or 1,2,3: the world is the\n"
    "                     largest; each batch gets the smallest size whose rows per rank fit --tokens /\n"
    "                     world; a size that does not divide the world leaves its last ranks idle\n"
    "  --tokens T         rows of the largest CP size's capacity (default 16384)\n"
    "  --cp-layout L      dual_chunk (default: documents padded to 2*cp, --tokens a multiple of\n"
    "                     2*world) or contiguous (documents unpadded, --tokens a multiple of world)\n"
    "  --cp-comm C        all_gather (default), all_to_all (HQ and HKV multiples of every CP size)\n"
    "                     or a2a+ag with --cp-a2a-size N (N dividing every CP size, HQ and HKV)\n"
    "  --cp-a2a-size N    a2a+ag's all-to-all group\n"
    "  --max-seqs M       documents + 1 of the capacity (default tokens/(2*cp)+1, contiguous\n"
    "                     tokens+1: never falls back)\n"
    "  --layers L         attention layers per step (default 2)\n"
    "  --median N         median document length (default 600)\n"
    "  --heads HQ:HKV     query and key/value heads (default 8:2)\n"
    "  --head-dim D       head dimension of q, k and v (default 64); the CUDA kernels take\n"
    "                     {cuda head dims}\n"
    "  --dtype T          bf16 (default) or fp16\n"
    "  --mask M           causal (default) or full; --window L,R for a sliding window\n"
    "  --rope R           neox (default), gptj or none\n"
    "  --check-every K    check every K-th step against eager (default 3; 1 checks all)\n"
    "  --seed S           seed of lengths and values (default 1)\n"
    "  --quiet            accepted as in thdcp run; this mode shows no progress line\n";

// Used by the CUDA build only (parse() below); a CPU-only build just refuses --graph.
[[maybe_unused]] std::vector<int> parse_sizes(const std::string& text) {
  std::vector<int> sizes;
  for (int64_t c : parse_int_list("dynamic-cp", text, 1, 64)) sizes.push_back(static_cast<int>(c));
  std::sort(sizes.begin(), sizes.end());
  if (std::adjacent_find(sizes.begin(), sizes.end()) != sizes.end()) {
    throw UsageError("--dynamic-cp " + quote_excerpt(text) + ": a size is given twice");
  }
  return sizes;
}

}  // namespace

#if !defined(THDCP_CLI_WITH_CUDA)

int run_graph_command(const std::vector<std::string>& argv) {
  for (const std::string& a : argv) {
    if (a == "--help") {
      std::fputs(usage_with_cuda_head_dims(kRunGraphHelp).c_str(), stdout);
      return 0;
    }
  }
  throw UsageError("--graph captures CUDA graphs: this thdcp was built without CUDA (build it with the CUDA toolkit)");
}

#else

namespace {

struct GraphRunConfig {
  int steps = 12;
  std::vector<int> sizes{2};
  bool dynamic = false;
  int64_t tokens = 16384;
  int max_seqs = 0;  // 0: the zero-fallback default per CP size
  int check_every = 3;
  double median = 600;
  uint64_t seed = 1;
  CpLayout layout = CpLayout::kDualChunk;
  CpCommArgs comm;
  GraphStepShape shape;
};

struct StepRecord {
  int cp = 0, groups = 0;
  int64_t documents = 0, rows = 0;
  graph::GraphBank::How how = graph::GraphBank::How::kWarmUp;
  bool checked = false, equal = true;
  double ms = 0;
};

struct SizeRecord {
  int cp = 0;
  Capacity capacity;
  graph::KeyCounters counters;
  size_t static_bytes = 0, graph_bytes = 0;
  double eager_ms = 0, replay_ms = 0;
};

GraphRunConfig parse(const Args& args) {
  GraphRunConfig c;
  c.steps = static_cast<int>(args.get_int("steps", c.steps, 1, 100000));
  if (args.has("dynamic-cp")) {
    if (args.has("cp")) throw UsageError("--cp and --dynamic-cp both set the CP size: give one of them");
    c.sizes = parse_sizes(args.get("dynamic-cp", ""));
    c.dynamic = true;
  } else {
    c.sizes = {static_cast<int>(args.get_int("cp", 2, 1, 64))};
  }
  c.tokens = args.get_int("tokens", c.tokens, 1, INT32_MAX);
  const std::string layout = args.get("cp-layout", "dual_chunk");
  if (layout == "contiguous") {
    c.layout = CpLayout::kContiguous;
  } else if (layout != "dual_chunk") {
    throw UsageError("--cp-layout " + quote_excerpt(layout) + ": use dual_chunk or contiguous");
  }
  const int world = c.sizes.back();
  if (c.layout == CpLayout::kDualChunk) {
    check_tokens_multiple(c.tokens, 2 * int64_t{world},
                          (c.dynamic ? "2*max(--dynamic-cp)=" : "2*cp=") + std::to_string(2 * world));
  } else {
    check_tokens_multiple(c.tokens, int64_t{world}, (c.dynamic ? "max(--dynamic-cp)=" : "cp=") + std::to_string(world),
                          "the contiguous layout gives every rank T/cp rows");
  }
  c.max_seqs = static_cast<int>(args.get_int("max-seqs", 0, 2, INT32_MAX));
  c.check_every = static_cast<int>(args.get_int("check-every", c.check_every, 1, 100000));
  c.median = static_cast<double>(args.get_int("median", 600, 1, 1 << 24));
  c.seed = args.get_seed("seed", c.seed);
  c.shape.layers = static_cast<int>(args.get_int("layers", 2, 1, 64));
  const auto [hq, hkv] = args.get_pair("heads", {8, 2}, ':');
  if (hq < 1 || hkv < 1 || hq % hkv != 0) {
    throw UsageError("--heads " + quote_excerpt(args.get("heads", "")) + ": both >= 1 and HQ a multiple of HKV");
  }
  c.shape.q_heads = hq;
  c.shape.kv_heads = hkv;
  c.comm = parse_cp_comm(args);
  for (int cp : c.sizes) check_cp_comm(c.comm, cp, hq, hkv);
  c.shape.cp_comm = c.comm.comm;
  c.shape.a2a_size = c.comm.a2a_size;
  c.shape.head_dim = args.get_int("head-dim", 64, 1, 1 << 16);
  require_cuda_head_dims(c.shape.head_dim, 0);
  c.shape.dtype = parse_dtype(args.get("dtype", "bf16"));
  if (c.shape.dtype == DType::kFloat32) throw UsageError("--dtype fp32: the CUDA kernels take bf16 or fp16");
  c.shape.mask = parse_mask_flags(args, Mask::causal());
  const std::string rope = args.get("rope", "neox");
  if (rope == "none") {
    c.shape.rope = false;
  } else if (rope == "neox" || rope == "gptj") {
    c.shape.rope_config.layout = rope == "neox" ? RopeLayout::kHalfSplit : RopeLayout::kInterleaved;
  } else {
    throw UsageError("--rope " + quote_excerpt(rope) + ": use neox, gptj or none");
  }
  return c;
}

// The capacity of CP size c: rows per rank tokens / world, so c * tokens / world rows.
Capacity capacity_of(const GraphRunConfig& c, int cp) {
  const int64_t max_tokens = c.tokens / c.sizes.back() * cp;
  Capacity capacity = default_capacity(max_tokens, cp, c.layout);
  if (c.max_seqs > 0) capacity.max_seqs = std::min(capacity.max_seqs, c.max_seqs);
  return capacity;
}

std::string mib(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", static_cast<double>(bytes) / (1 << 20));
  return text;
}

// The batches of every step, drawn up front on the host: each step's CP size (by the policy
// from a draw of documents for one group), then one micro-batch per group of that size.
struct Batches {
  std::vector<int> cp;                                   // per step
  std::vector<std::vector<std::vector<int64_t>>> micro;  // per step, per group: lengths
};

Batches draw_batches(const GraphRunConfig& c) {
  const int world = c.sizes.back();
  const int64_t rows_per_rank = c.tokens / world;
  Batches batches;
  batches.cp.resize(static_cast<size_t>(c.steps));
  batches.micro.resize(static_cast<size_t>(c.steps));
  LengthDistribution dist;
  dist.median = c.median;
  dist.max_length = c.tokens;
  for (int s = 0; s < c.steps; ++s) {
    Rng pick(c.seed * 7919u + static_cast<uint64_t>(s));
    const int drawn = c.sizes[static_cast<size_t>(pick.uniform_int(0, static_cast<int64_t>(c.sizes.size()) - 1))];
    std::vector<int64_t> first = sample_lengths(rows_per_rank * drawn, drawn, dist, c.seed * 104729u + s * 64u);
    const int cp = c.dynamic ? choose_cp_size(first, c.sizes, rows_per_rank, c.layout) : c.sizes[0];
    batches.cp[static_cast<size_t>(s)] = cp;
    // One micro-batch per group of size cp; the capacity's rows at this size.
    for (int g = 0; g < world / cp; ++g) {
      std::vector<int64_t> l = g == 0 && cp == drawn
                                   ? first
                                   : sample_lengths(rows_per_rank * cp, cp, dist, c.seed * 104729u + s * 64u + g + 1);
      batches.micro[static_cast<size_t>(s)].push_back(l);
    }
  }
  return batches;
}

// What the ranks share: a barrier and what they record for the tables.
struct Shared {
  Shared(int world, int step_count) : barrier(world), steps(static_cast<size_t>(step_count)) {}
  ThreadBarrier barrier;
  std::mutex mutex;
  std::vector<StepRecord> steps;
  std::vector<SizeRecord> sizes;
  // Per CP size (<= 64): captured, set by rank 0 before a barrier. One element per size, so
  // rank 0 setting the next size's never touches what a slower rank still reads.
  std::vector<char> captured = std::vector<char>(65, 0);
  // Rank 0's workspace arena: its size, and what a workspace per CP size and capacity would take.
  size_t arena_bytes = 0, separate_bytes = 0;
  int arena_users = 0;
};

// One rank of the world: its CP groups of every size, a graph step for each, and metadata of
// its own for the eager runs that the graph's results are compared with.
class GraphRank {
 public:
  GraphRank(DeviceCommunicator& comm, const GraphRunConfig& c, cudaStream_t stream)
      : comm_(comm), c_(c), stream_(stream), groups_(comm, c.sizes, stream, bank_options(c)) {
    for (int cp : c.sizes) {
      if (!groups_.has_group(cp)) continue;  // this rank sits steps of this size out
      const Capacity capacity = capacity_of(c, cp);
      groups_.bank(cp).add_capacity(capacity);
      step_of_[cp] = std::make_unique<GraphStep>(groups_.bank(cp), c.shape, capacity.max_tokens, &groups_.arena());
    }
  }

  // Step `s` through its size's bank, checked against eager when it is due; recorded.
  void run_step(int s, const Batches& batches, Shared& shared) {
    const int cp = batches.cp[static_cast<size_t>(s)];
    if (!groups_.has_group(cp)) {  // idle at this size: only the rendezvous of the step
      shared.barrier.wait();
      return;
    }
    const std::vector<int64_t>& lengths =
        batches.micro[static_cast<size_t>(s)][static_cast<size_t>(groups_.group_index(cp))];
    GraphStep& step = *step_of_[cp];
    step.load_inputs(c_.seed * 1000u + static_cast<uint64_t>(s) * 16u + static_cast<uint64_t>(comm_.rank()), stream_);
    shared.barrier.wait();  // every rank's inputs are in place
    const auto start = std::chrono::steady_clock::now();
    const graph::GraphBank::Outcome o = groups_.bank(cp).run(lengths, step.work(), stream_);
    THDCP_CHECK_CUDA(cudaStreamSynchronize(stream_));
    const double ms = milliseconds_since(start);
    if (o.how == graph::GraphBank::How::kReplayed || o.how == graph::GraphBank::How::kCaptured) {
      replayed_lengths_[cp] = lengths;
    }
    const bool first_replay = o.how == graph::GraphBank::How::kReplayed && !checked_replay_[cp];
    const bool check = o.how != graph::GraphBank::How::kWarmUp && (first_replay || s % c_.check_every == 0);
    bool equal = true;
    if (check) {
      checked_replay_[cp] = checked_replay_[cp] || o.how == graph::GraphBank::How::kReplayed;
      const std::vector<unsigned char> banked = step.download_outputs(stream_);
      step.reload_inputs(stream_);
      run_eager(cp, eager_batch(cp, o.capacity), lengths, "internal: the eager check's batch does not fit");
      equal = banked == step.download_outputs(stream_);
    }
    std::lock_guard<std::mutex> lock(shared.mutex);
    StepRecord& r = shared.steps[static_cast<size_t>(s)];
    if (comm_.rank() == 0) {
      r.cp = cp;
      r.groups = c_.sizes.back() / cp;
      r.how = o.how;
      r.checked = check;
      r.ms = ms;
    }
    if (groups_.group(cp).rank() == 0) {
      for (int64_t n : lengths) r.documents += n > 0 ? 1 : 0;
      r.rows += padded_rows(lengths, cp, c_.layout);
    }
    r.equal = r.equal && equal;
  }

  // Time per step at size cp on its last batch that the graph took: eager (the work enqueued
  // directly) and replay, 12 runs each, median; recorded with the bank's report of the size.
  void time_size(int cp, Shared& shared) {
    const Capacity capacity = capacity_of(c_, cp);
    // Whether this size was captured, as rank 0 (in a group of every size) saw it: idle ranks
    // meet the timing rounds' barriers too.
    if (comm_.rank() == 0) shared.captured[static_cast<size_t>(cp)] = groups_.bank(cp).counters(capacity).captures > 0;
    shared.barrier.wait();
    const bool captured = shared.captured[static_cast<size_t>(cp)] != 0;
    if (!groups_.has_group(cp)) {
      for (int i = 0; captured && i < 12; ++i) {
        shared.barrier.wait();
        shared.barrier.wait();
      }
      return;
    }
    graph::GraphBank& bank = groups_.bank(cp);
    const std::vector<graph::KeyReport> report = bank.report();  // before the timing runs
    double eager_median = 0, replay_median = 0;                  // 0: never captured
    if (captured) {
      const std::vector<int64_t> lengths = replayed_lengths_[cp];
      graph::StaticBatch& batch = eager_batch(cp, capacity);
      std::vector<double> eager_ms, replay_ms;
      for (int i = 0; i < 12; ++i) {
        shared.barrier.wait();
        auto start = std::chrono::steady_clock::now();
        run_eager(cp, batch, lengths, "internal: the timed batch does not fit");
        eager_ms.push_back(milliseconds_since(start));
        shared.barrier.wait();
        start = std::chrono::steady_clock::now();
        bank.run(lengths, step_of_[cp]->work(), stream_);
        groups_.group(cp).synchronize(stream_, 300);
        replay_ms.push_back(milliseconds_since(start));
      }
      eager_median = median(eager_ms);
      replay_median = median(replay_ms);
    }
    if (comm_.rank() != 0) return;
    std::lock_guard<std::mutex> lock(shared.mutex);
    for (const graph::KeyReport& k : report) {
      shared.sizes.push_back(
          SizeRecord{cp, k.capacity, k.counters, k.static_bytes, k.graph_bytes, eager_median, replay_median});
    }
  }

  // Once every rank is done: the steps and eager batches go before the groups.
  void finish(Shared& shared) {
    if (comm_.rank() == 0) {
      std::lock_guard<std::mutex> lock(shared.mutex);
      shared.arena_bytes = groups_.arena().bytes();
      shared.separate_bytes = groups_.arena().separate_bytes();
      shared.arena_users = groups_.arena().users();
    }
    shared.barrier.wait();
    step_of_.clear();
    eager_batch_.clear();
    THDCP_CHECK_CUDA(cudaStreamSynchronize(stream_));
  }

 private:
  static graph::BankOptions bank_options(const GraphRunConfig& c) {
    graph::BankOptions options;
    // Groups of one process that capture side by side (world / cp > 1) must not forbid each
    // other's eager calls: thread-local capture then. One group keeps the global mode.
    if (c.sizes.back() > c.sizes.front()) options.capture_mode = cudaStreamCaptureModeThreadLocal;
    options.cp_layout = c.layout;
    return options;
  }

  // This rank's own metadata of size cp and `capacity`, for the eager runs.
  graph::StaticBatch& eager_batch(int cp, const Capacity& capacity) {
    auto& batch = eager_batch_[cp];
    if (!batch || !(batch->capacity() == capacity)) {
      batch = std::make_unique<graph::StaticBatch>(cp, capacity, c_.layout);
    }
    return *batch;
  }

  // The step of size cp on `lengths`, enqueued eagerly on `batch`, and waited for.
  void run_eager(int cp, graph::StaticBatch& batch, const std::vector<int64_t>& lengths, const char* no_fit) {
    THDCP_CHECK(batch.fill(lengths, stream_) == Fit::kFits, no_fit);
    step_of_[cp]->work()(batch, stream_);
    groups_.group(cp).synchronize(stream_, 300);
  }

  DeviceCommunicator& comm_;
  const GraphRunConfig& c_;
  cudaStream_t stream_;
  graph::CpGroups groups_;
  std::map<int, std::unique_ptr<GraphStep>> step_of_;
  std::map<int, std::unique_ptr<graph::StaticBatch>> eager_batch_;
  std::map<int, bool> checked_replay_;
  std::map<int, std::vector<int64_t>> replayed_lengths_;
};

void print_header(const GraphRunConfig& c, const char* device) {
  const std::string mode = c.comm.comm == cp::CpComm::kA2aAg
                               ? "a2a+ag (all-to-all groups of " + std::to_string(c.comm.a2a_size) + ")"
                               : c.comm.comm == cp::CpComm::kAllToAll ? "all-to-all" : "AllGather";
  std::printf("thdcp run --graph: CUDA graphs of RoPE + %s CP attention fwd/bwd, %s\n", mode.c_str(), device);
  std::printf("  world %d ranks sharing GPU 0 (shared-gpu communicator); CP sizes", c.sizes.back());
  for (int s : c.sizes) std::printf(" %d", s);
  std::printf("%s; %lld rows per rank; %s layout\n", c.dynamic ? " (chosen per batch)" : "",
              static_cast<long long>(c.tokens / c.sizes.back()), cp_layout_name(c.layout));
  std::printf("  %d layer(s) of RoPE(%s) + attention, heads %lld:%lld, head_dim %lld, %s, %d steps\n",
              c.shape.layers, c.shape.rope ? (c.shape.rope_config.layout == RopeLayout::kHalfSplit ? "neox" : "gptj")
                                           : "none",
              static_cast<long long>(c.shape.q_heads), static_cast<long long>(c.shape.kv_heads),
              static_cast<long long>(c.shape.head_dim), dtype_name(c.shape.dtype), c.steps);
  std::fflush(stdout);
}

// The tables and the verdict; returns the exit code.
int print_results(const Shared& shared) {
  std::printf("\n  step  cp  groups  documents    rows  ran        ms  check\n");
  int checked = 0, equal = 0;
  for (size_t s = 0; s < shared.steps.size(); ++s) {
    const StepRecord& r = shared.steps[s];
    std::printf("  %4zu  %2d  %6d  %9lld  %6lld  %-9s %6.2f  %s\n", s, r.cp, r.groups,
                static_cast<long long>(r.documents), static_cast<long long>(r.rows),
                graph::GraphBank::how_name(r.how), r.ms,
                r.checked ? (r.equal ? "= eager" : "DIFFERS from eager") : "-");
    checked += r.checked ? 1 : 0;
    equal += r.checked && r.equal ? 1 : 0;
  }
  std::printf("\n  cp  capacity (max_seqs, max_tokens)  warm-ups  captures  replays  fallbacks  static MiB  graph MiB"
              "  eager ms  replay ms\n");
  for (const SizeRecord& r : shared.sizes) {
    std::printf("  %2d  %12d %12lld     %8lld  %8lld  %7lld  %9lld  %10s  %9s  %8.2f  %9.2f\n", r.cp,
                r.capacity.max_seqs, static_cast<long long>(r.capacity.max_tokens),
                static_cast<long long>(r.counters.warmups), static_cast<long long>(r.counters.captures),
                static_cast<long long>(r.counters.replays), static_cast<long long>(r.counters.fallbacks),
                mib(r.static_bytes).c_str(), mib(r.graph_bytes).c_str(), r.eager_ms, r.replay_ms);
  }
  std::printf("  (per CP size, on rank 0: static = its StaticBatch and named buffers, not the plans'\n"
              "   workspaces (the arena below); graph = what instantiating and uploading its graph took\n"
              "   by cudaMemGetInfo, 0 below its 2 MiB resolution; eager and replay ms: one step,\n"
              "   median of 12, 0 if never captured)\n");
  std::printf("\n  workspace arena (rank 0): %s MiB for its %d CP plan workspace(s) of every CP size and capacity;\n"
              "  a workspace each would take %s MiB\n",
              mib(shared.arena_bytes).c_str(), shared.arena_users, mib(shared.separate_bytes).c_str());
  const bool passed = equal == checked;
  std::printf("\nresult: %s (%d of %d checked steps equal eager bit for bit)\n", passed ? "PASS" : "FAIL", equal,
              checked);
  return passed ? 0 : 1;
}

}  // namespace

int run_graph_command(const std::vector<std::string>& argv) {
  const Args args(without(argv, "--graph"),
                  {"steps", "cp", "dynamic-cp", "tokens", "cp-layout", "cp-comm", "cp-a2a-size", "max-seqs",
                   "check-every", "median", "seed", "layers",
                   "heads", "head-dim", "dtype", "mask", "window", "rope"},
                  {"quiet", "help"});
  if (args.has("help")) {
    std::fputs(usage_with_cuda_head_dims(kRunGraphHelp).c_str(), stdout);
    return 0;
  }
  const GraphRunConfig c = parse(args);
  std::string no_gpu;
  if (visible_gpus(&no_gpu) == 0) throw UsageError("--graph captures CUDA graphs and needs a GPU: " + no_gpu);
  cudaDeviceProp prop{};
  THDCP_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const Batches batches = draw_batches(c);
  Shared shared(c.sizes.back(), c.steps);
  print_header(c, prop.name);
  run_shared_gpu(c.sizes.back(), [&](DeviceCommunicator& comm) {
    Stream stream;
    comm.warm_up(stream.get());
    GraphRank rank(comm, c, stream.get());
    for (int s = 0; s < c.steps; ++s) rank.run_step(s, batches, shared);
    for (int cp : c.sizes) rank.time_size(cp, shared);
    rank.finish(shared);
  });
  return print_results(shared);
}

#endif

}  // namespace thdcp::tools
