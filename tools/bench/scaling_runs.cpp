#include "bench/scaling_runs.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "bench/harness.h"
#include "io/progress.h"
#include "step/cuda_handles.h"
#include "step/device_step.h"
#include "step/rank_rows.h"
#include "thdcp/comm_device/nccl.h"
#include "thdcp/core/cuda_check.h"
#include "thdcp/cp/cuda.h"
#include "thdcp/cuda/attention.h"

namespace thdcp::tools::scaling {

const char* const kCheckNames[kChecks] = {"out", "lse", "max_logit", "dq", "dk", "dv"};

std::string gib(double bytes) { return format("%.1f GiB", bytes / kGiB); }

namespace {

double device_free_bytes(int device) {
  THDCP_CHECK_CUDA(cudaSetDevice(device));
  size_t free_bytes = 0, total = 0;
  THDCP_CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  return static_cast<double>(free_bytes);
}

}  // namespace

Baseline run_baseline(const BatchLayout& layout, const Inputs& in, const Mask& mask, const StepShape& s, int warmup,
                      int iters) {
  Baseline b;
  const int64_t rows = layout.total_rows();
  const AttentionProblem problem = attention_problem(s, Capacity{layout.num_seqs(), rows}, mask);
  const size_t workspace_bytes = cuda::Attention::workspace_size(problem);
  const double need =
      static_cast<double>(DeviceTensors::bytes(s, rows, layout.cu_seqlens.size()) + workspace_bytes) + kDeviceMargin;
  const double free_bytes = device_free_bytes(0);
  if (need > free_bytes) {
    b.skip = "the single-GPU baseline needs about " + gib(need) + " on GPU 0, " + gib(free_bytes) + " free";
    return b;
  }
  Stream stream;
  DeviceTensors t(s, rows, layout, stream.get());
  t.upload_inputs(in.q, in.k, in.v, in.dout, stream.get());
  t.poison_outputs(stream.get());
  cuda::DeviceBuffer workspace(workspace_bytes);
  const cuda::Attention attention(problem, AttentionOptions{}, workspace.data(), workspace.bytes());
  const DeviceLayout device_layout = t.layout(problem.capacity);
  const ForwardTensors ft = t.forward();
  const BackwardTensors bt = t.backward();
  attention.check(device_layout, &ft, &bt);
  auto step = [&] {
    attention.forward(device_layout, ft, stream.get());
    attention.backward(device_layout, bt, stream.get());
  };
  step();
  b.ref = t.download_outputs(stream.get());
  b.ms = time_median_ms(warmup, iters, stream.get(), step);
  return b;
}

LinkCopies time_link_copies(int gpus, size_t bytes, int warmup, int iters) {
  LinkCopies result;
  if (gpus < 2) {
    result.skip = "one GPU has no link";
    return result;
  }
  for (int r = 0; r < gpus; ++r) {
    int can = 0;
    THDCP_CHECK_CUDA(cudaDeviceCanAccessPeer(&can, r, (r + 1) % gpus));
    if (!can) {
      result.skip = format("GPU %d cannot access GPU %d", r, (r + 1) % gpus);
      return result;
    }
    if (device_free_bytes(r) < 2.0 * static_cast<double>(bytes) + kDeviceMargin) {
      result.skip = format("no room for 2 x %s on GPU %d", gib(static_cast<double>(bytes)).c_str(), r);
      return result;
    }
  }
  // Per GPU (made on it): what it sends, what the previous GPU sends it, a stream and its
  // events. Peer access is enabled where it was not, and disabled again afterwards (NCCL's
  // runs after this choose their paths as before).
  struct Gpu {
    explicit Gpu(size_t bytes) : src(bytes), dst(bytes) {}
    cuda::DeviceBuffer src, dst;
    Stream stream;
    Event start, stop;
    bool enabled = false;
  };
  std::vector<std::unique_ptr<Gpu>> g;
  const auto disable = [&] {
    for (int r = 0; r < static_cast<int>(g.size()); ++r) {
      if (!g[static_cast<size_t>(r)]->enabled) continue;
      (void)cudaSetDevice(r);
      (void)cudaDeviceDisablePeerAccess((r + 1) % gpus);
    }
    (void)cudaGetLastError();
  };
  try {
    for (int r = 0; r < gpus; ++r) {
      THDCP_CHECK_CUDA(cudaSetDevice(r));
      g.push_back(std::make_unique<Gpu>(bytes));
      Gpu& gpu = *g.back();
      const cudaError_t enable = cudaDeviceEnablePeerAccess((r + 1) % gpus, 0);
      if (enable == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
      } else {
        THDCP_CHECK_CUDA(enable);
        gpu.enabled = true;
      }
      THDCP_CHECK_CUDA(cudaMemsetAsync(gpu.src.data(), 1, bytes, gpu.stream.get()));
    }
    std::vector<double> runs;
    for (int i = 0; i < warmup + iters; ++i) {
      for (int r = 0; r < gpus; ++r) {  // every GPU idle, so that the copies start together
        THDCP_CHECK_CUDA(cudaSetDevice(r));
        THDCP_CHECK_CUDA(cudaStreamSynchronize(g[static_cast<size_t>(r)]->stream.get()));
      }
      for (int r = 0; r < gpus; ++r) {
        Gpu& from = *g[static_cast<size_t>(r)];
        const int to = (r + 1) % gpus;
        THDCP_CHECK_CUDA(cudaSetDevice(r));
        THDCP_CHECK_CUDA(cudaEventRecord(from.start.get(), from.stream.get()));
        THDCP_CHECK_CUDA(cudaMemcpyPeerAsync(g[static_cast<size_t>(to)]->dst.data(), to, from.src.data(), r, bytes,
                                             from.stream.get()));
        THDCP_CHECK_CUDA(cudaEventRecord(from.stop.get(), from.stream.get()));
      }
      double slowest = 0;
      for (int r = 0; r < gpus; ++r) {
        Gpu& gpu = *g[static_cast<size_t>(r)];
        THDCP_CHECK_CUDA(cudaSetDevice(r));
        THDCP_CHECK_CUDA(cudaEventSynchronize(gpu.stop.get()));
        float ms = 0;
        THDCP_CHECK_CUDA(cudaEventElapsedTime(&ms, gpu.start.get(), gpu.stop.get()));
        slowest = std::max(slowest, static_cast<double>(ms));
      }
      if (i >= warmup) runs.push_back(slowest);
    }
    result.ms = median(runs);
    result.gbps = static_cast<double>(bytes) / (result.ms * 1e6);
  } catch (...) {
    disable();
    throw;
  }
  disable();
  return result;
}

namespace {

// A host barrier of the group: every rank's thread returns once all have arrived (and throws
// if a rank failed, instead of waiting for it).
void host_barrier(Communicator& host) {
  float token = 0;
  host.all_reduce_max(&token, 1);
}

// True on every rank when `flag` is true on any rank.
bool any_rank(Communicator& host, bool flag) {
  float value = flag ? 1.0f : 0.0f;
  host.all_reduce_max(&value, 1);
  return value > 0.5f;
}

// What a rank times with: every run starts after a host barrier and is waited for through its
// communicator.
TimingLoop rank_loop(const CpRun& run, Communicator& host, DeviceCommunicator& comm, cudaStream_t stream) {
  TimingLoop loop;
  loop.warmup = run.warmup;
  loop.iters = run.iters;
  loop.before = [&host] { host_barrier(host); };
  loop.wait = [&comm, stream] { comm.synchronize(stream, kSyncTimeout); };
  return loop;
}

// The check: one step on NaN-poisoned outputs against this rank's rows of the reference,
// with the tolerances of the CUDA CP tests (tests/support/gpu_tolerance.h: a tensor-core result
// with P, resp. P and dS, rounded to the storage dtype; fp32 results to 2^-16).
void check_rank(const CpRun& run, cp::CudaPlan& plan, const DeviceTensors& t, DeviceCommunicator& comm,
                cudaStream_t stream, RankReport& report) {
  run_pass(plan, t, stream, run.pass);
  comm.synchronize(stream, kSyncTimeout);
  const HostOutputs got = t.download_outputs(stream);
  const LayoutView view = run.layout.view();
  const int cp = comm.size(), rank = comm.rank();
  const Tolerance out_tolerance = derive_tensor_core_tolerance(run.shape.dtype, 1);
  const Tolerance grad_tolerance = derive_tensor_core_tolerance(run.shape.dtype, 2);
  const Tolerance fp32_tolerance = tensor_core_fp32_tolerance();
  const CpLayout split = run.cp_layout;
  report.checks[0] = compare(got.out, split_for_rank(run.ref.out, view, cp, rank, split), out_tolerance);
  report.checks[1] =
      compare(got.lse, split_lse_for_rank(run.ref.lse, run.shape.q_heads, view, cp, rank, split), fp32_tolerance);
  report.checks[2] = compare(got.max_logit, run.ref.max_logit, fp32_tolerance);
  report.checks[3] = compare(got.dq, split_for_rank(run.ref.dq, view, cp, rank, split), grad_tolerance);
  report.checks[4] = compare(got.dk, split_for_rank(run.ref.dk, view, cp, rank, split), grad_tolerance);
  report.checks[5] = compare(got.dv, split_for_rank(run.ref.dv, view, cp, rank, split), grad_tolerance);
  report.passed = std::all_of(report.checks.begin(), report.checks.end(), [](const Comparison& c) { return c.passed(); });
}

// The whole step, every rank starting together (host barrier, streams idle), each timing its
// own; then the phases, in steps of their own.
void time_steps(const CpRun& run, cp::CudaPlan& plan, const DeviceTensors& t, Communicator& host,
                DeviceCommunicator& comm, cudaStream_t stream, RankReport& report) {
  const TimingLoop loop = rank_loop(run, host, comm, stream);
  report.step_ms = time_runs(loop, stream, [&] { run_pass(plan, t, stream, run.pass); });
  plan.enable_phase_timing();
  for (int i = 0; i < run.warmup + run.iters; ++i) {
    host_barrier(host);
    const cp::Timings timings = time_phases(plan, t, stream, run.pass, loop.wait);
    if (i < run.warmup) continue;
    std::array<double, kPhases> ms{};
    for (int p = 0; p < kPhases; ++p) ms[static_cast<size_t>(p)] = timings.seconds[p] * 1e3;
    report.phases.push_back(ms);
  }
}

// The collectives alone, with nothing beside them: what NCCL takes on this host for the
// step's volumes (its bus bandwidth), against which the exposed communication reads. The
// reduce-scatter in the run's reduce_dtype.
void time_collectives(const CpRun& run, const DeviceTensors& t, Communicator& host, DeviceCommunicator& comm,
                      cudaStream_t stream, RankReport& report) {
  const int cp = comm.size();
  const int64_t local = t.k.tokens;
  const size_t kv_bytes = run.shape.bytes(local, run.shape.kv_heads);
  const size_t grad_count = static_cast<size_t>(local * run.shape.kv_heads * run.shape.head_dim);
  const double extra = static_cast<double>(kv_bytes) * cp + sizeof(float) * static_cast<double>(grad_count) * (cp + 1);
  if (extra + kDeviceMargin > device_free_bytes(comm.device())) {
    report.collectives_skip = "no room for " + gib(extra) + " of collective buffers";
  }
  if (any_rank(host, !report.collectives_skip.empty())) return;
  // The all-gathers receive into a window where the communicator wants one (the copy engines).
  const size_t gathered_bytes = kv_bytes * static_cast<size_t>(cp);
  const std::shared_ptr<void> gathered_memory = cp::cuda_workspace_memory(comm, gathered_bytes);
  const std::unique_ptr<DeviceCommunicator::Window> window =
      comm.wants_windows() ? comm.register_window(gathered_memory.get(), gathered_bytes) : nullptr;
  cuda::DeviceBuffer ranked(sizeof(float) * grad_count * cp), reduced(sizeof(float) * grad_count);
  void* gathered = gathered_memory.get();
  ranked.poison(stream);
  const TimingLoop loop = rank_loop(run, host, comm, stream);
  report.gather_ms = time_runs(loop, stream, [&] {
    comm.all_gather(t.k.data, gathered, kv_bytes, stream);
    comm.all_gather(t.v.data, gathered, kv_bytes, stream);
  });
  report.reduce_ms = time_runs(loop, stream, [&] {
    for (int twice = 0; twice < 2; ++twice) {
      if (run.reduce_dtype == DType::kFloat32) {
        comm.reduce_scatter_sum(ranked.as<float>(), reduced.as<float>(), grad_count, stream);
      } else {
        comm.reduce_scatter_sum(ranked.data(), reduced.data(), grad_count, run.reduce_dtype, stream);
      }
    }
  });
}

}  // namespace

void cp_rank(Communicator& host, const CpRun& run, RankReport& report) {
  const int rank = host.rank(), cp = host.size();
  nccl::Options options;
  options.timeout_seconds = kSyncTimeout;
  options.copy_engine = run.copy_engine;
  const std::unique_ptr<DeviceCommunicator> comm =
      run.peer_group ? run.peer_group->communicator(rank) : nccl::create(host, rank, options);
  THDCP_CHECK_CUDA(cudaSetDevice(comm->device()));

  cp::Problem problem = cp_problem(run.shape, cp, Capacity{run.layout.num_seqs(), run.layout.total_rows()}, run.mask,
                                  run.cp_layout, run.comm, run.kv_gather, run.a2a_size, run.reduce_dtype);
  problem.head_slices = run.head_slices;
  const int64_t local = problem.local_rows();
  const size_t workspace_bytes = cp::cuda_workspace_size(problem, run.attention);
  const double need =
      static_cast<double>(DeviceTensors::bytes(run.shape, local, run.layout.cu_seqlens.size()) + workspace_bytes) +
      kDeviceMargin;
  const double free_bytes = device_free_bytes(comm->device());
  if (need > free_bytes) {
    report.skip = "rank " + std::to_string(rank) + " needs about " + gib(need) + " on GPU " +
                  std::to_string(comm->device()) + " (local tensors and a CP workspace holding the whole K/V), " +
                  gib(free_bytes) + " free";
  }
  if (any_rank(host, !report.skip.empty())) return;

  const LayoutView view = run.layout.view();
  Stream stream;
  DeviceTensors t(run.shape, local, run.layout, stream.get());
  const CpLayout split = run.cp_layout;
  t.upload_inputs(split_for_rank(run.in.q, view, cp, rank, split), split_for_rank(run.in.k, view, cp, rank, split),
                  split_for_rank(run.in.v, view, cp, rank, split), split_for_rank(run.in.dout, view, cp, rank, split),
                  stream.get());
  t.poison_outputs(stream.get());
  const std::shared_ptr<void> workspace = cp::cuda_workspace_memory(*comm, workspace_bytes);
  cp::CudaPlan plan(*comm, problem, run.attention, workspace.get(), workspace_bytes);
  comm->warm_up(stream.get());
  const ForwardTensors ft = t.forward();
  const BackwardTensors bt = t.backward();
  plan.check_tensors(t.layout(problem.capacity), &ft, &bt);

  check_rank(run, plan, t, *comm, stream.get(), report);
  if (any_rank(host, !report.passed)) return;  // no timing after a mismatch on any rank
  if (run.timeline && run.comm == cp::CpComm::kAllGather) {
    // Before time_steps: its phase timing makes every later step run in program order.
    plan.enable_timeline();
    for (int i = 0; i <= run.warmup; ++i) {  // the last step's is kept
      host_barrier(host);
      plan.clear_timeline();
      run_pass(plan, t, stream.get(), run.pass);
      comm->synchronize(stream.get(), kSyncTimeout);
    }
    report.timeline = plan.timeline();
    plan.disable_timeline();
  }
  time_steps(run, plan, t, host, *comm, stream.get(), report);
  time_collectives(run, t, host, *comm, stream.get(), report);
  host_barrier(host);
}

}  // namespace thdcp::tools::scaling
