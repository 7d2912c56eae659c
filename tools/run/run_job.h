// The main job of `thdcp run`: a packed batch through AllGather CP, forward and backward,
// checked against the single-device reference.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "step/host_step.h"
#include "thdcp/cpu/attention.h"
#include "thdcp/comm/communicator.h"
#include "thdcp/testing/compare.h"
#include "thdcp/cp/cp.h"
#include "thdcp/plan/layout.h"
#include "thdcp/plan/mask.h"
#include "thdcp/core/tensor.h"

namespace thdcp::tools {

// Where the attention runs. kAuto: CUDA when thdcp was built with it and a GPU is visible.
enum class Backend { kAuto, kCpu, kCuda };

// When the single-device reference runs: kAuto skips it when it would be expensive.
enum class CheckMode { kAuto, kAlways, kNever };

struct RunConfig {
  Backend backend = Backend::kAuto;  // resolved (kCpu or kCuda) before the job runs
  int cp = 4;
  int gpus = 0;  // --gpus N: one process drives N GPUs (a thread each) over NCCL; cp = N
  bool peer_copy = false;  // --gpu-comm peer: those GPUs as one peer-copy SharedGpuGroup, not NCCL
  bool copy_engine = false;  // --gpu-comm nccl-ce: NCCL's copy-engine collectives (nccl::Options::copy_engine)
  uint64_t seed = 1234;
  Mask mask = Mask::causal();
  int64_t q_heads = 8;
  int64_t kv_heads = 2;
  int64_t head_dim = 64;
  int64_t v_head_dim = 0;  // --v-head-dim: D_v of v, out, dout, dv; 0: head_dim
  bool sinks = false;      // --sinks: random attention sinks, one logit per query head
  DType dtype = DType::kBFloat16;
  int64_t tokens = 16384;
  int threads = 0;
  CheckMode check = CheckMode::kAuto;
  bool quiet = false;
  std::string lengths_file;  // --lengths
  int64_t batch_index = 0;   // --batch
  std::string load_dir;      // --load
  std::string save_dir;      // --save
  std::string json_file;     // --json
  double max_memory = 0;     // --max-memory in bytes; 0: the machine's physical memory
  bool allow_nonfinite = false;  // --allow-nonfinite: skip the finiteness check of --load
  double loaded_max_v = 0;       // (set by load_batch)
  CpLayout cp_layout = CpLayout::kDualChunk;    // --cp-layout
  cp::CpComm cp_comm = cp::CpComm::kAllGather;  // --cp-comm
  cp::KvGather kv_gather = cp::KvGather::kAuto; // --cp-kv-gather
  int a2a_size = 1;                              // --cp-a2a-size (--cp-comm a2a+ag)
  DType reduce_dtype = DType::kFloat32;          // --cp-reduce-dtype: dK/dV partials across ranks

  // The batch's rows split over cp in multiples of this: each document's padded length under
  // the dual-chunk layout (2*cp), the whole buffer under the contiguous one (cp).
  int64_t row_multiple() const { return cp_layout == CpLayout::kDualChunk ? 2 * int64_t{cp} : int64_t{cp}; }

  StepShape step_shape() const { return StepShape{{q_heads, kv_heads, head_dim, v_head_dim}, dtype}; }
};

// kAuto runs the reference only below this many floating-point operations (fwd + bwd,
// 14 * pairs * D * Hq): about a minute on two cores.
constexpr double kAutoCheckFlopLimit = 2e12;

// A batch in the global (unsplit) layout the job runs on: every padded length a multiple
// of 2*cp.
struct GlobalBatch {
  std::string source;  // where it came from, for the summary
  std::vector<int64_t> lengths;
  BatchLayout layout;
  HostTensor q, k, v, dout;
  std::vector<float> sinks;  // [Hq] attention sinks (--sinks), empty without
  // The layout the user gave (--load) and, for each row of `layout`, its row there (-1 for
  // padding that thdcp added). Equal to `layout` and the identity otherwise.
  BatchLayout user_layout;
  std::vector<int32_t> user_rows;
};

// Outputs in the global layout: lse [Hq, T].
using GlobalOutputs = HostOutputs;

struct TensorCheck {
  std::string name;
  Comparison comparison;
};

struct RunReport {
  RunConfig config;
  std::string communicator;
  int64_t rows = 0, valid_tokens = 0, documents = 0, longest = 0;
  std::vector<int64_t> rank_valid_tokens;
  std::vector<int64_t> rank_pairs;
  int64_t total_pairs = 0;
  double reference_forward_s = 0, reference_backward_s = 0;
  double cp_forward_s = 0, cp_backward_s = 0;  // wall time of the whole group
  cp::Timings forward_phases, backward_phases;  // slowest rank per phase
  std::vector<TensorCheck> checks;
  bool checked = false;
  double reference_flops = 0;  // 14 * pairs * D * Hq
  std::string check_note;      // why the check was skipped, if it was
  double host_bytes_estimated = 0;  // estimate_host_bytes, checked before the run
  double host_bytes_peak = 0;       // this process's peak resident memory (getrusage)
  cp::KvTraffic kv_traffic;         // the CPU backend's all_gather: what each rank received
  bool passed() const;
};

class Progress;

// One rank's local results (T/cp rows, the rank's dual-chunk order) and its times.
struct RankResult : HostOutputs {
  cp::Timings forward, backward;  // phases (CPU backend; the CUDA backend reports totals only)
  cp::KvTraffic kv_traffic;       // CPU backend, all_gather: the plan's count (every rank's; empty otherwise)
  double forward_wall = 0, backward_wall = 0;
};

// config.backend kAuto -> kCuda when thdcp was built with CUDA, a device is visible and the
// kernels support the dtype and head dim, else kCpu; kCuda without one of those is a
// UsageError naming what is missing. `why` says what was found (the GPU's name).
Backend resolve_backend(const RunConfig& config, std::string* why);

// How the CUDA ranks of a run reach each other (run_cuda.cpp): threads sharing one GPU
// (shared-GPU communicator), a thread per GPU (--gpus, NCCL), or a process per GPU (mpirun,
// NCCL). Made once per process before the ranks start.
class CudaRun;
std::shared_ptr<CudaRun> prepare_cuda_run(const RunConfig& config, bool process_per_rank);

// Before any device allocation: the device memory each rank takes (its local tensors and its
// CP plan's workspace, which holds the whole K/V) times the ranks sharing a GPU, against that
// GPU's free memory. Throws UsageError (exit 2) with the figures and what to lower.
void check_device_memory(const RunConfig& config, const GlobalBatch& batch, bool process_per_rank);
std::string cuda_run_communicator(const CudaRun& run);

// This rank's CP forward and backward on the CUDA backend: the local tensors are uploaded,
// one CudaPlan runs forward and backward over the run's device communicator, the results
// are downloaded. `comm` is the host communicator of the ranks (bootstrap and assembly).
RankResult run_rank_cuda(CudaRun& run, Communicator& comm, const RunConfig& config, const GlobalBatch& batch,
                         Progress& progress);

// Runs the job with every rank a thread of this process. `outputs` receives the CP results in
// the job's global layout.
RunReport run_in_process_job(const RunConfig& config, const GlobalBatch& batch, GlobalOutputs& outputs,
                             Progress& progress);

// Runs this process's rank of the job over `comm` (e.g. MPI); every rank builds the same
// batch. The report is complete on rank 0 (the others hold their own timings).
RunReport run_rank_job(Communicator& comm, const RunConfig& config, const GlobalBatch& batch, GlobalOutputs& outputs,
                       Progress& progress);

// The sizes a run's host memory follows, known before its tensors are read or allocated.
struct RunSize {
  int64_t rows = 0;         // rows of the layout the job runs on
  int64_t sequences = 0;    // sequences of the batch (an upper bound where not yet known)
  int64_t loaded_rows = 0;  // --load: rows of the files' tensors, each read while the job's exist
  int64_t offsets = 0;      // --load: entries of cu_seqlens.npy and cu_seqlens_padded.npy
};

// Host memory a run will take at its peak, estimated from its sizes before anything is
// allocated: the global inputs and outputs, the single-device reference's outputs, every
// rank's local tensors, and each rank's CP buffers (gathered and reordered K/V, fp32 dK/dV
// partial sums: the whole T rows per rank, the AllGather CP working set; one rank per process
// under mpirun, cp ranks in one process otherwise; on the GPU those live on the device); per
// row its maps, per sequence its layouts and segment tables (global, and two segments per
// sequence on every rank); with --load, the larger of that and the loading's peak (the job's
// tensors, one file's tensor and the offsets), and with --save one tensor in the files'
// layout. In double: no overflow.
double estimate_host_bytes(const RunConfig& config, const RunSize& size, bool process_per_rank);

// Throws UsageError (exit 2) when the estimate, or with the threads the run starts the address
// space it needs, exceeds the budget (io/memory_budget.h: --max-memory, the machine's memory,
// an address-space limit); the message gives the figures and what to lower. `source` says
// where the sizes came from ("--tokens 65536", "--load 'DIR'").
void check_host_memory(const RunConfig& config, const RunSize& size, bool process_per_rank, const std::string& source);

}  // namespace thdcp::tools
