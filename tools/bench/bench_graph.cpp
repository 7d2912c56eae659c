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
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include "io/args.h"
#include "bench/bench_graph.h"
#include "step/graph_step.h"
#include "thdcp/comm_device/shared_gpu.h"
#include "thdcp/core/cuda_check.h"
#include "thdcp/graph/graph_bank.h"
#include "thdcp/testing/thread_barrier.h"
#include "thdcp/testing/workload.h"

namespace thdcp::tools {

namespace {

struct GraphTiming {
  bool equal = false;
  double eager_ms = 0, replay_ms = 0, kernel_ms = 0, enqueue_ms = 0, hold_ms = 0;
  size_t static_bytes = 0, graph_bytes = 0;
  int64_t documents = 0;
};

void CUDART_CB hold_stream(void* milliseconds) {
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(*static_cast<double*>(milliseconds)));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

GraphTiming time_graph(int cp, int64_t rows_per_rank, const GraphStepShape& shape, const LengthDistribution& dist,
                       uint64_t seed, int iters) {
  GraphTiming t;
  const Capacity capacity = default_capacity(rows_per_rank * cp, cp);
  const std::vector<int64_t> lengths = sample_lengths(capacity.max_tokens, cp, dist, seed);
  t.documents = static_cast<int64_t>(lengths.size());
  ThreadBarrier barrier(cp);
  std::mutex mutex;
  cudaEvent_t held = nullptr;
  THDCP_CHECK_CUDA(cudaEventCreate(&held));
  std::vector<cudaEvent_t> stops(static_cast<size_t>(cp));
  for (cudaEvent_t& e : stops) THDCP_CHECK_CUDA(cudaEventCreate(&e));
  double hold_ms = 0;
  run_shared_gpu(cp, [&](DeviceCommunicator& comm) {
    cudaStream_t stream = nullptr;
    THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    comm.warm_up(stream);
    graph::GraphBank bank(comm);
    bank.add_capacity(capacity);
    GraphStep step(bank, shape, capacity.max_tokens);
    graph::StaticBatch eager(cp, capacity);
    step.load_inputs(seed + 10 + static_cast<uint64_t>(comm.rank()), stream);
    bank.run(lengths, step.work(), stream);  // warm-up
    step.reload_inputs(stream);
    bank.run(lengths, step.work(), stream);  // capture, and run
    comm.synchronize(stream, 300);
    step.reload_inputs(stream);
    bank.run(lengths, step.work(), stream);  // replay
    comm.synchronize(stream, 300);
    const std::vector<unsigned char> replayed = step.download_outputs(stream);
    step.reload_inputs(stream);
    eager.fill(lengths, stream);
    step.work()(eager, stream);
    comm.synchronize(stream, 300);
    const bool equal = replayed == step.download_outputs(stream);

    std::vector<double> eager_ms, replay_ms, kernel_ms, enqueue_ms;
    const auto wall = [&](const std::function<void()>& enqueue) {
      barrier.wait();
      const auto start = std::chrono::steady_clock::now();
      enqueue();
      comm.synchronize(stream, 300);
      barrier.wait();
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    };
    for (int i = 0; i < iters; ++i) {
      eager_ms.push_back(wall([&] {
        eager.fill(lengths, stream);
        step.work()(eager, stream);
      }));
      replay_ms.push_back(wall([&] { bank.run(lengths, step.work(), stream); }));
    }
    // Kernel time: rank 0's stream is held by a host callback long enough for every rank to
    // enqueue a whole eager step behind it; the device time from its release to the last
    // rank's end is the step without launch gaps.
    if (comm.rank() == 0) hold_ms = std::max(20.0, 4 * median(eager_ms));
    barrier.wait();
    for (int i = 0; i < iters; ++i) {
      barrier.wait();
      eager.fill(lengths, stream);
      THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
      barrier.wait();
      if (comm.rank() == 0) {
        THDCP_CHECK_CUDA(cudaLaunchHostFunc(stream, hold_stream, &hold_ms));
        THDCP_CHECK_CUDA(cudaEventRecord(held, stream));
      }
      barrier.wait();
      const auto start = std::chrono::steady_clock::now();
      THDCP_CHECK_CUDA(cudaStreamWaitEvent(stream, held, 0));
      step.work()(eager, stream);
      THDCP_CHECK_CUDA(cudaEventRecord(stops[static_cast<size_t>(comm.rank())], stream));
      const double enqueued = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      comm.synchronize(stream, 300);
      barrier.wait();
      if (comm.rank() == 0) {
        float longest = 0;
        for (cudaEvent_t e : stops) {
          float ms = 0;
          THDCP_CHECK_CUDA(cudaEventElapsedTime(&ms, held, e));
          longest = std::max(longest, ms);
        }
        kernel_ms.push_back(longest);
      }
      if (comm.rank() == 0) enqueue_ms.push_back(enqueued);
    }
    barrier.wait();
    if (comm.rank() == 0) {
      std::lock_guard<std::mutex> lock(mutex);
      t.equal = equal;
      t.eager_ms = median(eager_ms);
      t.replay_ms = median(replay_ms);
      t.kernel_ms = median(kernel_ms);
      t.hold_ms = hold_ms;
      t.enqueue_ms = median(enqueue_ms);
      const graph::KeyReport r = bank.report().front();
      t.static_bytes = r.static_bytes;
      t.graph_bytes = r.graph_bytes;
    }
    barrier.wait();
    if (!equal) {  // every rank's comparison counts
      std::lock_guard<std::mutex> lock(mutex);
      t.equal = false;
    }
    barrier.wait();
    THDCP_CHECK_CUDA(cudaStreamDestroy(stream));
  });
  cudaEventDestroy(held);
  for (cudaEvent_t e : stops) cudaEventDestroy(e);
  return t;
}

}  // namespace

int bench_graph_command(const std::vector<std::string>& argv) {
  std::vector<std::string> rest;
  for (const std::string& a : argv) {
    if (a != "--graph") rest.push_back(a);
  }
  const Args args(rest, {"layers", "tokens", "cp", "median", "seed", "iters"}, {});
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
  cudaDeviceProp prop{};
  THDCP_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s; a step: %d layers of RoPE (neox) + AllGather CP attention fwd, then bwd; Hq=%lld "
              "Hkv=%lld D=%lld bf16 causal; lognormal documents, median %.0f, max %lld; ranks share the GPU\n",
              prop.name, shape.layers, static_cast<long long>(shape.q_heads), static_cast<long long>(shape.kv_heads),
              static_cast<long long>(shape.head_dim), dist.median, static_cast<long long>(dist.max_length));
  std::printf("| rows/rank | cp | documents | replay = eager | eager ms | replay ms | kernel ms | replay/kernel | "
              "eager/replay | static MiB | graph MiB |\n");
  std::printf("| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  bool ok = true;
  for (int64_t rows : tokens) {
    for (int cp : cps) {
      const GraphTiming t = time_graph(cp, rows, shape, dist, seed + static_cast<uint64_t>(rows + cp), iters);
      ok = ok && t.equal;
      std::printf("| %lld | %d | %lld | %s | %.3f | %.3f | %.3f | %.3f | %.2f | %.1f | %.1f |\n",
                  static_cast<long long>(rows), cp, static_cast<long long>(t.documents), t.equal ? "yes" : "NO",
                  t.eager_ms, t.replay_ms, t.kernel_ms, t.replay_ms / t.kernel_ms, t.eager_ms / t.replay_ms,
                  static_cast<double>(t.static_bytes) / (1 << 20), static_cast<double>(t.graph_bytes) / (1 << 20));
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
