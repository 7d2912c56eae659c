// The GPU work of `thdcp bench --scaling` (bench_scaling.cpp explains the measurements): the
// whole batch on GPU 0, the baseline and the reference, and one rank of a CP run over NCCL.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "step/device_step.h"
#include "thdcp/comm/communicator.h"
#include "thdcp/comm_device/shared_gpu.h"
#include "thdcp/cp/cp.h"
#include "thdcp/cp/cuda.h"
#include "thdcp/testing/compare.h"

namespace thdcp::tools::scaling {

constexpr int kPhases = static_cast<int>(cp::Phase::kCount);
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// Device memory kept free beyond the buffers counted: NCCL's channels and connection buffers,
// the plans' agreement exchange, the CUDA context's growth.
constexpr double kDeviceMargin = 1.0 * kGiB;
// Seconds a rank waits for its stream (NCCL errors are checked meanwhile), and NCCL's init
// and collective-issue bound: a step takes well under a second, so a peer that died is
// reported within minutes, not after the 10 the lead's runs may have.
constexpr double kSyncTimeout = 120;

// "12.3 GiB"
std::string gib(double bytes);

// The batch's inputs on the host, in the global layout.
struct Inputs {
  HostTensor q, k, v, dout;
};

struct Baseline {
  std::string skip;  // why it did not run
  double ms = 0;     // median forward + backward
  HostOutputs ref;   // the single-GPU result the CP ranks are checked against, global layout
};

// The whole batch on GPU 0: one checked step whose outputs become the reference, then the
// timed steps (table build + forward + backward, as a CP step has them).
Baseline run_baseline(const BatchLayout& layout, const Inputs& in, const Mask& mask, const StepShape& shape,
                      int warmup, int iters);

// The checks of a rank, in this order.
constexpr int kChecks = 6;
extern const char* const kCheckNames[kChecks];  // out, lse, max_logit, dq, dk, dv

// What a rank of one CP run reports (written by its thread, read after run_in_process).
struct RankReport {
  std::string skip;                                 // non-empty: this rank's GPU lacks memory
  std::array<Comparison, kChecks> checks;
  bool passed = false;
  std::vector<double> step_ms;                      // per timed step
  std::vector<std::array<double, kPhases>> phases;  // per timed step: forward + backward, ms
  // The step's collectives alone, on idle GPUs (per timed repeat, ms): the all-gathers of K
  // and V that the forward makes, and the reduce-scatters of fp32 dK and dV of the backward.
  std::vector<double> gather_ms, reduce_ms;
  std::string collectives_skip;  // non-empty: no memory for the extra buffers
  // With CpRun::timeline, one overlapped forward + backward's phases per stream (AllGather
  // rows), in ms from its first mark (cp::CudaPlan::timeline).
  std::vector<cp::TimelineSpan> timeline;
};

// One CP run: the batch, its reference, and what the plans are made with.
struct CpRun {
  const BatchLayout& layout;  // global, in the rows of `cp_layout`
  const Inputs& in;
  const HostOutputs& ref;
  Mask mask;
  StepShape shape;
  Pass pass;  // kForwardBackward or kForwardBackwardKeptKv
  AttentionOptions attention;
  int warmup = 0, iters = 0;
  CpLayout cp_layout = CpLayout::kDualChunk;
  cp::KvGather kv_gather = cp::KvGather::kAuto;
  cp::CpComm comm = cp::CpComm::kAllGather;
  DType reduce_dtype = DType::kFloat32;  // cp::Problem::reduce_dtype
  SharedGpuGroup* peer_group = nullptr;  // set: the ranks' communicators, else NCCL's
  int head_slices = 1;                   // cp::Problem::head_slices (all_to_all)
  int a2a_size = 1;                      // cp::Problem::a2a_size (a2a+ag)
  bool copy_engine = false;              // NCCL with nccl::Options::copy_engine (workspaces in windows)
  bool timeline = false;                 // record one step's timeline (RankReport::timeline)
};

// The link's own rate, for the collectives' busbw to be read against: every GPU r of
// [0, gpus) copies `bytes` to GPU (r + 1) % gpus at once (cudaMemcpyPeerAsync on the copy
// engines, peer access on; on 2 GPUs both directions of the one link), median over `iters`
// runs after `warmup`, the slowest GPU's time. A ring all-gather moves its blocks over these
// links, so bytes / ms is the most its busbw could reach.
struct LinkCopies {
  std::string skip;  // why it did not run (no peer access, no memory, one GPU)
  double ms = 0;
  double gbps = 0;   // per GPU and direction: bytes / (ms * 1e6)
};
LinkCopies time_link_copies(int gpus, size_t bytes, int warmup, int iters);

// One rank of the CP run (rank r on GPU r): its communicator (NCCL, or the peer group's),
// tensors and plan; the check against the reference; the timed steps, phases and collectives.
void cp_rank(Communicator& host, const CpRun& run, RankReport& report);

}  // namespace thdcp::tools::scaling
