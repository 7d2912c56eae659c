// thdcp bench --cp N: AllGather CP with N ranks sharing one GPU (shared-GPU communicator).
// Verifies the CP step against the CPU reference on a small batch, then times, on the large
// batch: each phase with CUDA events (every rank's, summed over ranks; the ranks run
// concurrently on the one GPU, so a phase's events can include other ranks' work), and the
// whole step of all ranks as one captured CUDA graph, against the single-device attention.
#include "bench/bench_cp.h"

#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bench/harness.h"
#include "step/cuda_handles.h"
#include "step/device_step.h"
#include "step/rank_rows.h"
#include "thdcp/comm_device/shared_gpu.h"
#include "thdcp/core/cuda_check.h"
#include "thdcp/cp/cuda.h"
#include "thdcp/testing/compare.h"
#include "thdcp/comm/thread_barrier.h"
#include "thdcp/testing/workload.h"

namespace thdcp::tools {

namespace {

// Seconds a rank waits for its stream (the shared-GPU communicator's synchronize).
constexpr double kSyncTimeout = 120;

}  // namespace

bool verify_cp(int cp, const std::vector<int64_t>& lengths, const Mask& mask, const char* mask_name,
               const StepShape& shape, uint64_t seed) {
  const BatchLayout layout = exact_layout(lengths, cp);
  const LayoutView view = layout.view();
  const int64_t rows = layout.total_rows();
  HostInputs in = host_inputs(shape, rows);
  fill_normal(in.q, seed + 1);
  fill_normal(in.k, seed + 2);
  fill_normal(in.v, seed + 3);
  fill_normal(in.dout, seed + 4);
  const HostTensor &q = in.q, &k = in.k, &v = in.v, &dout = in.dout;
  const HostOutputs ref = cpu_reference(build_segment_table(view, mask), q, k, v, dout);

  const cp::Problem p = cp_problem(shape, cp, Capacity{layout.num_seqs(), rows}, mask);
  HostOutputs got = host_outputs(shape, rows);  // the CP results, in the global layout
  run_shared_gpu(cp, [&](DeviceCommunicator& comm) {
    const int rank = comm.rank();
    Stream stream;
    DeviceTensors t(shape, p.local_rows(), layout, stream.get());
    t.upload_inputs(split_for_rank(q, view, cp, rank), split_for_rank(k, view, cp, rank),
                    split_for_rank(v, view, cp, rank), split_for_rank(dout, view, cp, rank), stream.get());
    t.poison_outputs(stream.get());
    cuda::DeviceBuffer workspace(cp::cuda_workspace_size(p));
    cp::CudaPlan plan(comm, p, AttentionOptions{}, workspace.data(), workspace.bytes());
    run_pass(plan, t, stream.get(), Pass::kForwardBackward);
    comm.synchronize(stream.get(), kSyncTimeout);
    const HostOutputs local = t.download_outputs(stream.get());
    // Rows of different ranks never overlap: each rank writes its own.
    merge_from_rank(local.out, got.out, view, cp, rank);
    merge_from_rank(local.dq, got.dq, view, cp, rank);
    merge_from_rank(local.dk, got.dk, view, cp, rank);
    merge_from_rank(local.dv, got.dv, view, cp, rank);
  });
  Verification check(format("cp=%d %-7s", cp, mask_name), 10);
  check.check("out", compare(got.out, ref.out, derive_tensor_core_tolerance(shape.dtype, 1)));
  check.check("dq", compare(got.dq, ref.dq, derive_tensor_core_tolerance(shape.dtype, 2)));
  check.check("dk", compare(got.dk, ref.dk, derive_tensor_core_tolerance(shape.dtype, 2)));
  check.check("dv", compare(got.dv, ref.dv, derive_tensor_core_tolerance(shape.dtype, 2)));
  return check.passed();
}

namespace {

// What the ranks of one timed pass share: rank 0 captures every rank's step from `origin`
// (each rank's stream forks from it and joins it back).
struct Capture {
  explicit Capture(int cp) : barrier(cp) {
    for (int r = 0; r < cp; ++r) joins.push_back(std::make_unique<Event>(false));
  }
  ThreadBarrier barrier;
  Stream origin;
  Event fork{false};
  std::vector<std::unique_ptr<Event>> joins;
  std::mutex mutex;
};

// This rank's phases of `pass`, the mean over `iters` eager steps after `warmup` ones.
cp::Timings mean_phases(cp::CudaPlan& plan, const DeviceTensors& t, DeviceCommunicator& comm, cudaStream_t stream,
                        Pass pass, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) run_pass(plan, t, stream, pass);
  comm.synchronize(stream, kSyncTimeout);
  cp::Timings mean;
  for (int i = 0; i < iters; ++i) {
    const cp::Timings one = time_phases(plan, t, stream, pass, [&] { comm.synchronize(stream, kSyncTimeout); });
    for (int ph = 0; ph < static_cast<int>(cp::Phase::kCount); ++ph) mean.seconds[ph] += one.seconds[ph] / iters;
  }
  return mean;
}

// `pass` of every rank captured as one graph, then replayed: on rank 0 the median ms of a
// replay, on the others 0.
double replay_ms(Capture& capture, cp::CudaPlan& plan, const DeviceTensors& t, int rank, cudaStream_t stream,
                 Pass pass, int warmup, int iters) {
  const cudaStream_t origin = capture.origin.get();
  capture.barrier.wait();
  if (rank == 0) {
    THDCP_CHECK_CUDA(cudaStreamBeginCapture(origin, cudaStreamCaptureModeGlobal));
    THDCP_CHECK_CUDA(cudaEventRecord(capture.fork.get(), origin));
  }
  capture.barrier.wait();
  THDCP_CHECK_CUDA(cudaStreamWaitEvent(stream, capture.fork.get(), 0));
  run_pass(plan, t, stream, pass);
  THDCP_CHECK_CUDA(cudaEventRecord(capture.joins[static_cast<size_t>(rank)]->get(), stream));
  capture.barrier.wait();
  double ms = 0;
  if (rank == 0) {
    for (const auto& join : capture.joins) THDCP_CHECK_CUDA(cudaStreamWaitEvent(origin, join->get(), 0));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    THDCP_CHECK_CUDA(cudaStreamEndCapture(origin, &graph));
    THDCP_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    ms = time_median_ms(warmup, iters, origin, [&] { THDCP_CHECK_CUDA(cudaGraphLaunch(exec, origin)); });
    THDCP_CHECK_CUDA(cudaGraphExecDestroy(exec));
    THDCP_CHECK_CUDA(cudaGraphDestroy(graph));
  }
  capture.barrier.wait();
  return ms;
}

}  // namespace

CpTiming time_cp(int cp, const std::vector<int64_t>& lengths, const Mask& mask, const StepShape& shape, uint64_t seed,
                 int warmup, int iters) {
  const BatchLayout layout = exact_layout(lengths, cp);
  const cp::Problem p = cp_problem(shape, cp, Capacity{layout.num_seqs(), layout.total_rows()}, mask);
  CpTiming result;
  result.rows = layout.total_rows();
  Capture capture(cp);
  for (Pass pass : {Pass::kForward, Pass::kForwardBackward, Pass::kForwardBackwardKeptKv}) {
    const int index = static_cast<int>(pass);
    run_shared_gpu(cp, [&](DeviceCommunicator& comm) {
      Stream stream;
      DeviceTensors t(shape, p.local_rows(), layout, stream.get());
      // Timing needs values that are not zeros, not a particular batch.
      fill_inputs(t, seed + static_cast<uint64_t>(comm.rank()), kRandomBlock, stream.get(), true);
      cuda::DeviceBuffer workspace(cp::cuda_workspace_size(p));
      cp::CudaPlan plan(comm, p, AttentionOptions{}, workspace.data(), workspace.bytes());
      plan.enable_phase_timing();
      comm.warm_up(stream.get());
      // Phases: eager steps, events on this rank's stream, summed over the ranks.
      const cp::Timings mine = mean_phases(plan, t, comm, stream.get(), pass, warmup, iters);
      {
        std::lock_guard<std::mutex> lock(capture.mutex);
        for (int ph = 0; ph < static_cast<int>(cp::Phase::kCount); ++ph) {
          result.phases[index].seconds[ph] += mine.seconds[ph];
        }
      }
      // The whole step of every rank as one graph, from a plan without phase timing (which
      // runs a step in program order on one stream): its collectives overlap the attention.
      cp::CudaPlan overlapped(comm, p, AttentionOptions{}, workspace.data(), workspace.bytes());
      const double ms = replay_ms(capture, overlapped, t, comm.rank(), stream.get(), pass, warmup, iters);
      if (comm.rank() == 0) result.graph_ms[index] = ms;
    });
  }
  return result;
}

}  // namespace thdcp::tools
