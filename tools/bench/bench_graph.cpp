// `thdcp bench --graph`: what CUDA graphs save on a step of many small launches. A step is
// L layers of RoPE + AllGather-CP attention forward, then backward (step/graph_step.h), on
// small packs of short documents, with ranks sharing the GPU. Per (tokens per rank, cp):
//   eager ms    one step enqueued directly, host wall clock from enqueue to completion;
//   replay ms   one step replayed from the GraphBank, the same way;
//   kernel ms   the device time of one eager step whose launches were all queued before the
//               device started it (the stream held by a host callback meanwhile): the step
//               with no launch gaps, what a replay can at best reach;
// and the device memory the bank holds for the size (static buffers, graph). The replay is
// checked against eager, bit for bit, before anything is timed.
#include "bench/bench_graph.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench/harness.h"
#include "io/args.h"
#include "step/cuda_handles.h"
#include "step/graph_step.h"
#include "thdcp/comm_device/shared_gpu.h"
#include "thdcp/core/cuda_check.h"
#include "thdcp/graph/graph_bank.h"
#include "thdcp/comm/thread_barrier.h"
#include "thdcp/testing/workload.h"

namespace thdcp::tools {

namespace {

const char* kHelp =
    "usage: thdcp bench --graph [options]\n"
    "\n"
    "What CUDA graphs save on a step of many small launches: L layers of RoPE + AllGather CP\n"
    "attention forward, then backward (Hq 32, Hkv 8, D 128, bf16, causal), on packs of short\n"
    "lognormal documents, the ranks sharing GPU 0. Per (rows per rank, cp): eager and replay\n"
    "ms (host wall clock of one step), kernel ms (one eager step queued whole before it\n"
    "starts), and the bank's memory. Each replay is checked against eager, bit for bit, first.\n"
    "\n"
    "  --layers L          attention layers per step (8)\n"
    "  --tokens T[,T...]   rows per rank (4096,16384)\n"
    "  --cp N[,N...]       CP sizes (1,2)\n"
    "  --median N          median document length (200; longest 2048)\n"
    "  --seed N            seed of lengths and data (1)\n"
    "  --iters N           timed steps; the median is reported (10)\n";

// Seconds a rank waits for its stream (the shared-GPU communicator's synchronize).
constexpr double kSyncTimeout = 300;

struct GraphTiming {
  bool equal = false;
  double eager_ms = 0, replay_ms = 0, kernel_ms = 0, enqueue_ms = 0, hold_ms = 0;
  size_t static_bytes = 0, graph_bytes = 0;
  int64_t documents = 0;
};

void CUDART_CB hold_stream(void* milliseconds) {
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(*static_cast<double*>(milliseconds)));
}

// What the ranks of one configuration share.
struct Shared {
  explicit Shared(int cp) : barrier(cp) {
    for (int r = 0; r < cp; ++r) stops.push_back(std::make_unique<Event>());
  }
  ThreadBarrier barrier;
  std::mutex mutex;
  Event held;                                  // where rank 0's held stream is released
  std::vector<std::unique_ptr<Event>> stops;   // where each rank's eager step ends
  double hold_ms = 0;
};

// One rank's step: its bank with the configuration's capacity, the graph step on its buffers,
// and metadata of its own for the eager runs.
struct RankStep {
  DeviceCommunicator& comm;
  cudaStream_t stream;
  graph::GraphBank& bank;
  GraphStep& step;
  graph::StaticBatch& eager;
  const std::vector<int64_t>& lengths;

  void run_eager() {
    eager.fill(lengths, stream);
    step.work()(eager, stream);
  }
  void synchronize() { comm.synchronize(stream, kSyncTimeout); }
};

// Warm-up, capture and a replay from the bank, then the same step eagerly on the same
// inputs: whether this rank's outputs are equal bit for bit.
bool replay_equals_eager(RankStep& r, uint64_t seed) {
  r.step.load_inputs(seed, r.stream);
  r.bank.run(r.lengths, r.step.work(), r.stream);  // warm-up
  r.step.reload_inputs(r.stream);
  r.bank.run(r.lengths, r.step.work(), r.stream);  // capture, and run
  r.synchronize();
  r.step.reload_inputs(r.stream);
  r.bank.run(r.lengths, r.step.work(), r.stream);  // replay
  r.synchronize();
  const std::vector<unsigned char> replayed = r.step.download_outputs(r.stream);
  r.step.reload_inputs(r.stream);
  r.run_eager();
  r.synchronize();
  return replayed == r.step.download_outputs(r.stream);
}

// Host wall clock of one step from enqueue to completion, every rank starting together.
double wall_ms(RankStep& r, Shared& shared, const std::function<void()>& enqueue) {
  shared.barrier.wait();
  const auto start = std::chrono::steady_clock::now();
  enqueue();
  r.synchronize();
  shared.barrier.wait();
  return milliseconds_since(start);
}

// Kernel time: rank 0's stream is held by a host callback long enough for every rank to
// enqueue a whole eager step behind it; the device time from its release to the last rank's
// end is the step without launch gaps. On rank 0: that time per step, and how long rank 0
// took to enqueue its step.
void kernel_times(RankStep& r, Shared& shared, int iters, std::vector<double>& kernel_ms,
                  std::vector<double>& enqueue_ms) {
  const int rank = r.comm.rank();
  for (int i = 0; i < iters; ++i) {
    shared.barrier.wait();
    r.eager.fill(r.lengths, r.stream);
    THDCP_CHECK_CUDA(cudaStreamSynchronize(r.stream));
    shared.barrier.wait();
    if (rank == 0) {
      THDCP_CHECK_CUDA(cudaLaunchHostFunc(r.stream, hold_stream, &shared.hold_ms));
      THDCP_CHECK_CUDA(cudaEventRecord(shared.held.get(), r.stream));
    }
    shared.barrier.wait();
    const auto start = std::chrono::steady_clock::now();
    THDCP_CHECK_CUDA(cudaStreamWaitEvent(r.stream, shared.held.get(), 0));
    r.step.work()(r.eager, r.stream);
    THDCP_CHECK_CUDA(cudaEventRecord(shared.stops[static_cast<size_t>(rank)]->get(), r.stream));
    const double enqueued = milliseconds_since(start);
    r.synchronize();
    shared.barrier.wait();
    if (rank == 0) {
      float longest = 0;
      for (const auto& stop : shared.stops) longest = std::max(longest, elapsed_ms(shared.held, *stop));
      kernel_ms.push_back(longest);
      enqueue_ms.push_back(enqueued);
    }
  }
}

GraphTiming time_graph(int cp, int64_t rows_per_rank, const GraphStepShape& shape, const LengthDistribution& dist,
                       uint64_t seed, int iters) {
  GraphTiming t;
  const Capacity capacity = default_capacity(rows_per_rank * cp, cp);
  const std::vector<int64_t> lengths = sample_lengths(capacity.max_tokens, cp, dist, seed);
  t.documents = static_cast<int64_t>(lengths.size());
  Shared shared(cp);
  run_shared_gpu(cp, [&](DeviceCommunicator& comm) {
    Stream stream;
    comm.warm_up(stream.get());
    graph::GraphBank bank(comm);
    bank.add_capacity(capacity);
    GraphStep step(bank, shape, capacity.max_tokens);
    graph::StaticBatch eager(cp, capacity);
    RankStep r{comm, stream.get(), bank, step, eager, lengths};
    const bool equal = replay_equals_eager(r, seed + 10 + static_cast<uint64_t>(comm.rank()));

    std::vector<double> eager_ms, replay_ms, kernel_ms, enqueue_ms;
    for (int i = 0; i < iters; ++i) {
      eager_ms.push_back(wall_ms(r, shared, [&] { r.run_eager(); }));
      replay_ms.push_back(wall_ms(r, shared, [&] { bank.run(lengths, step.work(), r.stream); }));
    }
    if (comm.rank() == 0) shared.hold_ms = std::max(20.0, 4 * median(eager_ms));
    shared.barrier.wait();
    kernel_times(r, shared, iters, kernel_ms, enqueue_ms);
    shared.barrier.wait();
    if (comm.rank() == 0) {
      std::lock_guard<std::mutex> lock(shared.mutex);
      t.equal = equal;
      t.eager_ms = median(eager_ms);
      t.replay_ms = median(replay_ms);
      t.kernel_ms = median(kernel_ms);
      t.hold_ms = shared.hold_ms;
      t.enqueue_ms = median(enqueue_ms);
      const graph::KeyReport report = bank.report().front();
      t.static_bytes = report.static_bytes;
      t.graph_bytes = report.graph_bytes;
    }
    shared.barrier.wait();
    if (!equal) {  // every rank's comparison counts
      std::lock_guard<std::mutex> lock(shared.mutex);
      t.equal = false;
    }
    shared.barrier.wait();
  });
  return t;
}

}  // namespace

int bench_graph_command(const std::vector<std::string>& argv) {
  const Args args(without(argv, "--graph"), {"layers", "tokens", "cp", "median", "seed", "iters"}, {"help"});
  if (args.has("help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  GraphStepShape shape;
  shape.layers = static_cast<int>(args.get_int("layers", 8, 1, 64));
  shape.q_heads = 32;
  shape.kv_heads = 8;
  shape.head_dim = 128;
  std::vector<int64_t> tokens{4096, 16384};
  std::vector<int> cps{1, 2};
  const auto list = [&](const char* flag, auto& out) {
    if (!args.has(flag)) return;
    out.clear();
    for (int64_t v : parse_int_list(flag, args.get(flag, ""), 1, 1 << 24)) out.push_back(static_cast<decltype(out[0] + 0)>(v));
  };
  list("tokens", tokens);
  list("cp", cps);
  LengthDistribution dist;
  dist.median = static_cast<double>(args.get_int("median", 200, 1, 1 << 24));
  dist.max_length = 2048;
  const uint64_t seed = args.get_seed("seed", 1);
  const int iters = static_cast<int>(args.get_int("iters", 10, 1, 1000));
  require_gpu("thdcp bench --graph");
  std::printf("device: %s; a step: %d layers of RoPE (neox) + AllGather CP attention fwd, then bwd; Hq=%lld "
              "Hkv=%lld D=%lld bf16 causal; lognormal documents, median %.0f, max %lld; ranks share the GPU\n",
              device_properties(0).name, shape.layers, static_cast<long long>(shape.q_heads),
              static_cast<long long>(shape.kv_heads), static_cast<long long>(shape.head_dim), dist.median,
              static_cast<long long>(dist.max_length));
  const Table table(Table::Style::kMarkdown,
                    {{"rows/rank"}, {"cp"}, {"documents"}, {"replay = eager", 0, true}, {"eager ms"}, {"replay ms"},
                     {"kernel ms"}, {"replay/kernel"}, {"eager/replay"}, {"static MiB"}, {"graph MiB"}});
  table.print_header();
  bool ok = true;
  for (int64_t rows : tokens) {
    for (int cp : cps) {
      const GraphTiming t = time_graph(cp, rows, shape, dist, seed + static_cast<uint64_t>(rows + cp), iters);
      ok = ok && t.equal;
      table.print_row({format("%lld", static_cast<long long>(rows)), format("%d", cp),
                       format("%lld", static_cast<long long>(t.documents)), t.equal ? "yes" : "NO",
                       format("%.3f", t.eager_ms), format("%.3f", t.replay_ms), format("%.3f", t.kernel_ms),
                       format("%.3f", t.replay_ms / t.kernel_ms), format("%.2f", t.eager_ms / t.replay_ms),
                       format("%.1f", static_cast<double>(t.static_bytes) / (1 << 20)),
                       format("%.1f", static_cast<double>(t.graph_bytes) / (1 << 20))});
      std::fflush(stdout);
    }
  }
  std::printf("(eager and replay: host wall clock of one step from enqueue to completion, median of %d; kernel: "
              "device time of an eager step queued whole before it started, median of %d)\n",
              iters, iters);
  if (!ok) std::printf("a replay differed from eager: the timings above do not count\n");
  return ok ? 0 : 1;
}

}  // namespace thdcp::tools
