// The CUDA backend of `thdcp run` (compiled to a stub when thdcp is built without CUDA).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "io/args.h"
#include "io/progress.h"
#include "run/run_inputs.h"
#include "run/run_job.h"
#include "step/rank_rows.h"

#if defined(THDCP_CLI_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "step/cuda_handles.h"
#include "step/cuda_head_dims.h"
#include "step/device_step.h"
#include "step/visible_gpus.h"
#include "thdcp/comm/mpi.h"
#include "thdcp/comm_device/nccl.h"
#include "thdcp/comm_device/shared_gpu.h"
#include "thdcp/cp/cuda.h"
#include "thdcp/core/cuda_check.h"
#include "thdcp/testing/device_buffer.h"
#endif

namespace thdcp::tools {

#if defined(THDCP_CLI_WITH_CUDA)

Backend resolve_backend(const RunConfig& c, std::string* why) {
  const Backend requested = c.backend;
  if (requested == Backend::kCpu) {
    if (c.gpus > 0) throw UsageError("--gpus " + std::to_string(c.gpus) + " needs the CUDA backend: drop --backend cpu");
    *why = "--backend cpu";
    return Backend::kCpu;
  }
  // What the CUDA kernels cannot run: auto then runs the CPU backend, saying why.
  std::string unsupported = cuda_head_dims_refusal(c.head_dim, c.v_head_dim);
  if (c.dtype == DType::kFloat32) unsupported = "the CUDA kernels do not support fp32 storage";
  if (c.kv_gather == cp::KvGather::kHalo) {
    const int64_t rows = c.tokens / std::max(c.cp, 1);
    if (c.cp_layout != CpLayout::kContiguous) {
      unsupported = "the CUDA CP backend gathers a halo (--cp-kv-gather halo) under --cp-layout contiguous only";
    } else if (c.mask.window_left < 0 || c.mask.window_right < 0 || c.mask.window_left > rows ||
               c.mask.window_right > rows) {
      unsupported = "the CUDA CP backend's halo gather (--cp-kv-gather halo) needs a window on both sides, each at "
                    "most the rows per rank (" + std::to_string(rows) + ")";
    }
  }
  std::string no_device;
  const int count = visible_gpus(&no_device);
  // Processes of this node that would each need a GPU of their own (NCCL refuses two ranks
  // on one device).
  std::string crowded;
  if (no_device.empty() && mpi::launched_by_mpi()) {
    const char* local_size = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (!local_size) local_size = std::getenv("SLURM_NTASKS_PER_NODE");
    const int processes = local_size ? std::atoi(local_size) : 1;
    if (processes > count) {
      crowded = std::to_string(processes) + " processes on this node share " + std::to_string(count) +
                " GPU(s), and NCCL needs a GPU per rank";
    }
    if (!nccl::built_with_nccl()) crowded = "this thdcp was built without NCCL, which the CUDA backend uses across processes";
  }
  if (c.gpus > 0) {
    if (!unsupported.empty()) throw UsageError("--gpus: " + unsupported);
    if (!no_device.empty()) throw UsageError("--gpus " + std::to_string(c.gpus) + ": " + no_device);
    if (c.gpus > count) {
      throw UsageError("--gpus " + std::to_string(c.gpus) + ": only " + std::to_string(count) + " GPU(s) are visible");
    }
    if (!c.peer_copy && !nccl::built_with_nccl()) {
      throw UsageError("--gpus needs NCCL: this thdcp was built without it (or use --gpu-comm peer)");
    }
  }
  for (const std::string& reason : {unsupported, no_device, crowded}) {
    if (reason.empty()) continue;
    if (requested == Backend::kCuda) throw UsageError("--backend cuda: " + reason + ": use --backend cpu");
    *why = reason;
    return Backend::kCpu;
  }
  cudaDeviceProp prop{};
  THDCP_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  *why = std::string(prop.name) + (count > 1 ? " (x" + std::to_string(count) + ")" : "");
  return Backend::kCuda;
}

class CudaRun {
 public:
  enum class Mode { kSharedGpu, kThreadPerGpu, kPeerCopy, kProcessPerGpu };
  bool copy_engine = false;  // kThreadPerGpu with NCCL's copy-engine collectives
  Mode mode = Mode::kSharedGpu;
  std::unique_ptr<SharedGpuGroup> group;  // kSharedGpu, kPeerCopy
};

std::shared_ptr<CudaRun> prepare_cuda_run(const RunConfig& config, bool process_per_rank) {
  auto run = std::make_shared<CudaRun>();
  if (process_per_rank) {
    run->mode = CudaRun::Mode::kProcessPerGpu;
  } else if (config.gpus > 0 && config.peer_copy) {
    run->mode = CudaRun::Mode::kPeerCopy;
    SharedGpuOptions options;
    for (int d = 0; d < config.gpus; ++d) options.devices.push_back(d);
    run->group = std::make_unique<SharedGpuGroup>(config.gpus, options);
  } else if (config.gpus > 0) {
    run->mode = CudaRun::Mode::kThreadPerGpu;
    run->copy_engine = config.copy_engine;
  } else {
    run->mode = CudaRun::Mode::kSharedGpu;
    run->group = std::make_unique<SharedGpuGroup>(config.cp);
  }
  return run;
}

std::string cuda_run_communicator(const CudaRun& run) {
  switch (run.mode) {
    case CudaRun::Mode::kSharedGpu: return "shared-gpu (ranks are threads sharing GPU 0)";
    case CudaRun::Mode::kThreadPerGpu:
      return run.copy_engine ? "nccl, copy engines (one process, a thread per GPU)" : "nccl (one process, a thread per GPU)";
    case CudaRun::Mode::kPeerCopy: return "peer-copy (one process, a thread per GPU, copy engines)";
    case CudaRun::Mode::kProcessPerGpu: return "nccl (a process per GPU)";
  }
  return "?";
}

namespace {

struct RankDevice {
  int device = 0;
  std::unique_ptr<DeviceCommunicator> comm;
};

RankDevice connect(CudaRun& run, Communicator& host_comm) {
  RankDevice d;
  int devices = 0;
  THDCP_CHECK_CUDA(cudaGetDeviceCount(&devices));
  switch (run.mode) {
    case CudaRun::Mode::kSharedGpu:
      d.device = 0;
      THDCP_CHECK_CUDA(cudaSetDevice(d.device));
      d.comm = run.group->communicator(host_comm.rank());
      break;
    case CudaRun::Mode::kThreadPerGpu: {
      d.device = host_comm.rank();
      nccl::Options options;
      options.copy_engine = run.copy_engine;
      d.comm = nccl::create(host_comm, d.device, options);
      break;
    }
    case CudaRun::Mode::kPeerCopy:
      d.device = host_comm.rank();
      THDCP_CHECK_CUDA(cudaSetDevice(d.device));
      d.comm = run.group->communicator(host_comm.rank());
      break;
    case CudaRun::Mode::kProcessPerGpu: {
      const int local_rank = nccl::local_rank_from_environment();
      d.device = nccl::device_for_local_rank(local_rank >= 0 ? local_rank : host_comm.rank(), devices);
      d.comm = nccl::create(host_comm, d.device);
      break;
    }
  }
  THDCP_CHECK_CUDA(cudaSetDevice(d.device));
  return d;
}

}  // namespace

namespace {

// The CP problem of a run: its batch's layout as the capacity, the run's shapes and CP mode.
cp::Problem problem_of(const RunConfig& c, const LayoutView& layout, int cp) {
  return cp_problem(c.step_shape(), cp, Capacity{layout.num_seqs, layout.total_rows()}, c.mask, c.cp_layout,
                    c.cp_comm, c.kv_gather, c.a2a_size, c.reduce_dtype);
}

// This rank's CP forward and backward over `comm` on `stream`: its rows up, one CudaPlan,
// the results down, with the wall time and the phases of each pass.
RankResult run_step(DeviceCommunicator& comm, const RunConfig& c, const GlobalBatch& batch, cudaStream_t stream,
                    Progress& progress) {
  const LayoutView layout = batch.layout.view();
  const int cp = comm.size(), rank = comm.rank();
  const cp::Problem problem = problem_of(c, layout, cp);
  DeviceTensors t(c.step_shape(), problem.local_rows(), batch.layout, stream);
  const CpLayout split = c.cp_layout;
  t.upload_inputs(split_for_rank(batch.q, layout, cp, rank, split), split_for_rank(batch.k, layout, cp, rank, split),
                  split_for_rank(batch.v, layout, cp, rank, split), split_for_rank(batch.dout, layout, cp, rank, split),
                  stream);
  if (!batch.sinks.empty()) t.upload_sinks(batch.sinks, stream);
  const size_t workspace_bytes = cp::cuda_workspace_size(problem);
  const std::shared_ptr<void> workspace = cp::cuda_workspace_memory(comm, workspace_bytes);
  cp::CudaPlan plan(comm, problem, AttentionOptions{}, workspace.get(), workspace_bytes);
  plan.enable_phase_timing();
  comm.warm_up(stream);
  const DeviceLayout device_layout = t.layout(problem.capacity);

  RankResult r;
  auto start = std::chrono::steady_clock::now();
  plan.forward(device_layout, t.forward(), stream);
  comm.synchronize(stream, 600);
  r.forward_wall = seconds_since(start);
  plan.add_phase_timings(r.forward);
  progress.step();
  start = std::chrono::steady_clock::now();
  plan.backward(device_layout, t.backward(), stream);
  comm.synchronize(stream, 600);
  r.backward_wall = seconds_since(start);
  plan.add_phase_timings(r.backward);
  progress.step();
  static_cast<HostOutputs&>(r) = t.download_outputs(stream);
  return r;
}

}  // namespace

void check_device_memory(const RunConfig& c, const GlobalBatch& batch, bool process_per_rank) {
  const LayoutView layout = batch.layout.view();
  const cp::Problem problem = problem_of(c, layout, c.cp);
  const double per_rank =
      static_cast<double>(DeviceTensors::bytes(c.step_shape(), problem.local_rows(), batch.layout.cu_seqlens.size()) +
                          cp::cuda_workspace_size(problem));
  const int ranks_per_gpu = process_per_rank || c.gpus > 0 ? 1 : c.cp;
  const double need = per_rank * ranks_per_gpu;
  size_t free_bytes = 0, total = 0;
  THDCP_CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  if (need <= static_cast<double>(free_bytes)) return;
  char text[256];
  std::snprintf(text, sizeof(text),
                "this run needs about %.1f GiB of GPU memory (%d rank(s) per GPU, %.1f GiB each: local tensors and "
                "a CP workspace holding the whole K/V), more than the %.1f GiB free",
                need / double(1 << 30), ranks_per_gpu, per_rank / double(1 << 30),
                static_cast<double>(free_bytes) / double(1 << 30));
  throw UsageError(std::string(text) + ": lower --tokens, --heads or --head-dim, or use more GPUs (--gpus, mpirun)");
}

RankResult run_rank_cuda(CudaRun& run, Communicator& host_comm, const RunConfig& c, const GlobalBatch& batch,
                         Progress& progress) {
  RankDevice rank_device;
  try {
    rank_device = connect(run, host_comm);
  } catch (const std::exception& e) {
    if (run.group) run.group->abort(std::string("a rank failed to start: ") + e.what());
    throw;
  }
  try {
    const Stream stream;
    return run_step(*rank_device.comm, c, batch, stream.get(), progress);
  } catch (const std::exception& e) {
    if (run.group) run.group->abort(std::string("rank failed: ") + e.what());
    throw;
  }
}

#else  // built without CUDA

Backend resolve_backend(const RunConfig& c, std::string* why) {
  const Backend requested = c.backend;
  if (requested == Backend::kCuda) {
    throw UsageError("--backend cuda: this thdcp was built without CUDA (rebuild with -DTHDCP_WITH_CUDA=ON)");
  }
  if (c.gpus > 0) throw UsageError("--gpus: this thdcp was built without CUDA");
  *why = requested == Backend::kCpu ? "--backend cpu" : "built without CUDA";
  return Backend::kCpu;
}

class CudaRun {};
void check_device_memory(const RunConfig&, const GlobalBatch&, bool) {}
std::shared_ptr<CudaRun> prepare_cuda_run(const RunConfig&, bool) {
  throw UsageError("this thdcp was built without CUDA");
}
std::string cuda_run_communicator(const CudaRun&) { return "none"; }
RankResult run_rank_cuda(CudaRun&, Communicator&, const RunConfig&, const GlobalBatch&, Progress&) {
  throw UsageError("this thdcp was built without CUDA");
}

#endif

}  // namespace thdcp::tools
