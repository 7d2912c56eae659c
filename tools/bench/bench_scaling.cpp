// thdcp bench --scaling --gpus N[,N...]: AllGather CP across GPUs over NCCL against the same
// batch on one GPU (issue 13).
//
// For every batch size T and mask the same documents (one seeded lognormal draw, every
// document padded to a multiple of 2*lcm(cp sizes), so one layout serves every cp) run
//   - on GPU 0 alone: cuda::ForwardPlan / BackwardPlan over the single-device table, the
//     baseline, and
//   - with AllGather CP over NCCL, cp = N, one process with a thread per GPU (run_in_process
//     and nccl::create, as `thdcp run --gpus N` does): rank r on GPU r.
// Before anything of a (T, mask, cp) is timed, one CP forward + backward is compared with the
// rows of the single-GPU result that each rank owns (out, lse, max_logit, dq, dk, dv; the
// tolerances of the CUDA CP tests, tests/cp/cuda_cp_cases.h). A mismatch prints FAIL, that
// configuration is not timed, and the command exits 1 at the end.
//
// Timing: CUDA events, warm-up steps, then the median of --iters steps of forward + backward.
//   baseline  the whole batch on GPU 0 (table build, forward, backward);
//   step      every rank waits at a host barrier (its stream idle), records a start event,
//             enqueues forward and backward, records a stop event. A step takes as long as its
//             slowest rank: the max over ranks per step, then the median over steps;
//   phases    CudaPlan::enable_phase_timing, in separate eager steps (the forward's events are
//             read before the backward reuses them, so a host sync sits between the two): per
//             rank the median over steps of forward + backward, then the max over ranks.
// The timed steps overlap: the plan runs its collectives on a second stream, the backward's
// reduce-scatter beside its dQ pass. Phase timing runs a step in program order on one stream instead, so the phases are
// each one's own time (a collective's includes any wait for a slower peer); "beyond
// attention" = step - attention phase is what the overlap left exposed.
// efficiency = baseline / (N * step); targets 0.95 at cp 2, 0.90 at cp 4, 0.85 at cp 8.
#include "bench/bench_scaling.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "io/args.h"
#include "thdcp/comm/communicator.h"
#include "thdcp/comm_device/nccl.h"
#include "thdcp/cp/cuda.h"
#include "thdcp/cuda/attention.h"
#include "thdcp/core/cuda_check.h"
#include "thdcp/plan/layout.h"
#include "thdcp/plan/rank_split.h"
#include "thdcp/plan/segment_table.h"
#include "thdcp/testing/compare.h"
#include "thdcp/testing/device_buffer.h"
#include "thdcp/testing/workload.h"

namespace thdcp::tools {

namespace {

const char* kHelp =
    "usage: thdcp bench --scaling --gpus N[,N...] [options]\n"
    "\n"
    "AllGather CP over NCCL with cp = N, one process with a thread per GPU (rank r on GPU r),\n"
    "against the same batch on GPU 0 alone (the baseline). For every --tokens T and --mask:\n"
    "one seeded draw of lognormal documents packed into T rows (each document padded to a\n"
    "multiple of 2*lcm(N...), the same documents for the baseline and every N); one CP\n"
    "forward+backward checked against the single-GPU result's rows of every rank (PASS/FAIL;\n"
    "no timing after a FAIL, exit 1); then CUDA events, warm-up and the median of --iters\n"
    "forward+backward steps: the baseline, the CP step (a host barrier, then every rank's\n"
    "events; the slowest rank's time), and each CP phase (max over ranks). Prints a markdown\n"
    "table: efficiency = baseline / (N x CP step), targets 0.95 (cp 2), 0.90 (4), 0.85 (8).\n"
    "NCCL_NVLS_ENABLE must be unset (it is then set to 0) or 0: NVLink multicast stays off.\n"
    "\n"
    "  --gpus N[,N...]     CP sizes, each <= the visible GPUs (required)\n"
    "  --tokens T[,T...]   rows per batch, multiples of 2*lcm(N...) (131072,524288)\n"
    "  --mask M[,M...]     causal and/or window (causal,window)\n"
    "  --window L          left window of the windowed mask (4096; right is 0)\n"
    "  --q-heads N         query heads (32)\n"
    "  --kv-heads N        key/value heads (8)\n"
    "  --head-dim N        64 or 128 (128)\n"
    "  --dtype T           bf16 or fp16 (bf16)\n"
    "  --median N          median document length (1500)\n"
    "  --max-length N      longest document (32768)\n"
    "  --seed N            seed of lengths and data (1)\n"
    "  --warmup N          untimed steps (3)\n"
    "  --iters N           timed steps; the median is reported (20)\n"
    "  --kv S[,S...]       where the backward takes K/V from, each a row: gather (all-gather them\n"
    "                      again, the default) or kept (the forward's, cp::KvSource::kFromForward)\n"
    "  --sm-margin M[,M...]  AttentionOptions::sm_margin of the CP plans, each a row (0): SMs the\n"
    "                      persistent Hopper forward leaves to the collectives beside it\n"
    "  --dq-pass B[,B...]  AttentionOptions::separate_dq_pass of the CP plans, each a row (0): 1 = on\n"
    "                      Hopper at head dim 128 without a left window, dQ in a pass of its own,\n"
    "                      beside the reduce-scatter of dK/dV, instead of in the dK/dV pass\n"
    "\n"
    "A configuration whose buffers do not fit the free memory of a GPU (or of the host) is\n"
    "skipped with the reason. Exit codes: 0 every configuration that ran matched, 1 a\n"
    "mismatch, 2 bad input (fewer visible GPUs than N, NCCL missing, NCCL_NVLS_ENABLE != 0).\n";

using cuda::DeviceBuffer;

constexpr int kPhases = static_cast<int>(cp::Phase::kCount);
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// Device memory kept free beyond the buffers counted: NCCL's channels and connection buffers,
// the plans' agreement exchange, the CUDA context's growth.
constexpr double kDeviceMargin = 1.0 * kGiB;
// Seconds a rank waits for its stream (NCCL errors are checked meanwhile), and NCCL's init
// and collective-issue bound: a step takes well under a second, so a peer that died is
// reported within minutes, not after the 10 the lead's runs may have.
constexpr double kSyncTimeout = 120;

struct Shape {
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;
  DType dtype = DType::kBFloat16;
  size_t bytes(int64_t rows, int64_t heads) const {
    return static_cast<size_t>(rows * heads * head_dim) * dtype_size(dtype);
  }
};

struct NamedMask {
  std::string name;
  Mask mask;
};

std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f GiB", bytes / kGiB);
  return text;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

class Stream {
 public:
  Stream() { THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() {
    if (stream_) cudaStreamDestroy(stream_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  Event() { THDCP_CHECK_CUDA(cudaEventCreate(&event_)); }
  ~Event() {
    if (event_) cudaEventDestroy(event_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

float elapsed_ms(const Event& start, const Event& stop) {
  float ms = 0;
  THDCP_CHECK_CUDA(cudaEventElapsedTime(&ms, start.get(), stop.get()));
  return ms;
}

// N(0,1) values: a block of about 4M elements drawn once and repeated. Its length is odd, so
// the repetition does not line up with rows. Timing and the CP-vs-single-GPU check need values
// that are not zeros, not independent ones; drawing 2^31 normals would take minutes.
void fill_repeated(HostTensor& t, uint64_t seed) {
  const int64_t block_len = std::min<int64_t>(t.numel(), (int64_t{1} << 22) + 13);
  if (block_len == 0) return;
  HostTensor block(t.dtype(), 1, 1, block_len);
  fill_normal(block, seed);
  const size_t element = dtype_size(t.dtype());
  auto* dst = static_cast<unsigned char*>(t.data());
  for (int64_t at = 0; at < t.numel(); at += block_len) {
    const int64_t n = std::min(block_len, t.numel() - at);
    std::memcpy(dst + static_cast<size_t>(at) * element, block.data(), static_cast<size_t>(n) * element);
  }
}

// MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read (no check then).
double host_available_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024.0;
  }
  return 0;
}

double device_free_bytes(int device) {
  THDCP_CHECK_CUDA(cudaSetDevice(device));
  size_t free_bytes = 0, total = 0;
  THDCP_CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
  return static_cast<double>(free_bytes);
}

struct Inputs {
  HostTensor q, k, v, dout;
};

// The single-GPU result the CP ranks are checked against, in the global layout.
struct Reference {
  HostTensor out, dq, dk, dv;
  std::vector<float> lse, max_logit;  // [Hq, T], [Hq]
};

struct Baseline {
  std::string skip;  // why it did not run
  double ms = 0;     // median forward + backward
  Reference ref;
};

// The single-device problem of the whole batch.
AttentionProblem single_device_problem(const BatchLayout& layout, const Mask& mask, const Shape& s) {
  AttentionProblem problem;
  problem.capacity = Capacity{layout.num_seqs(), layout.total_rows()};
  problem.mask = mask;
  problem.q_heads = s.q_heads;
  problem.kv_heads = s.kv_heads;
  problem.head_dim = s.head_dim;
  problem.dtype = problem.dq_dtype = problem.dkv_dtype = s.dtype;
  return problem;
}

// The whole batch on GPU 0: one checked step whose outputs become the reference, then the
// timed steps (table build + forward + backward, as a CP step has them).
Baseline run_baseline(const BatchLayout& layout, const Inputs& in, const Mask& mask, const Shape& s, int warmup,
                      int iters) {
  Baseline b;
  const int64_t rows = layout.total_rows();
  const AttentionProblem problem = single_device_problem(layout, mask, s);
  const size_t workspace_bytes = cuda::Attention::workspace_size(problem);
  const size_t offsets = sizeof(int32_t) * layout.cu_seqlens.size();
  const double need = 4.0 * static_cast<double>(s.bytes(rows, s.q_heads)) +
                      4.0 * static_cast<double>(s.bytes(rows, s.kv_heads)) +
                      4.0 * static_cast<double>(rows * s.q_heads + s.q_heads) +
                      static_cast<double>(workspace_bytes + 2 * offsets) + kDeviceMargin;
  const double free_bytes = device_free_bytes(0);
  if (need > free_bytes) {
    b.skip = "the single-GPU baseline needs about " + gib(need) + " on GPU 0, " + gib(free_bytes) + " free";
    return b;
  }
  DeviceBuffer q(s.bytes(rows, s.q_heads)), k(s.bytes(rows, s.kv_heads)), v(s.bytes(rows, s.kv_heads)),
      dout(s.bytes(rows, s.q_heads)), out(s.bytes(rows, s.q_heads)), dq(s.bytes(rows, s.q_heads)),
      dk(s.bytes(rows, s.kv_heads)), dv(s.bytes(rows, s.kv_heads));
  DeviceBuffer lse(sizeof(float) * static_cast<size_t>(rows * s.q_heads)),
      max_logit(sizeof(float) * static_cast<size_t>(s.q_heads));
  DeviceBuffer cu(offsets), cup(offsets), workspace(workspace_bytes);
  Stream stream;
  q.upload(in.q.data(), q.bytes(), stream.get());
  k.upload(in.k.data(), k.bytes(), stream.get());
  v.upload(in.v.data(), v.bytes(), stream.get());
  dout.upload(in.dout.data(), dout.bytes(), stream.get());
  cu.upload(layout.cu_seqlens.data(), offsets, stream.get());
  cup.upload(layout.cu_seqlens_padded.data(), offsets, stream.get());
  for (DeviceBuffer* o : {&out, &dq, &dk, &dv, &lse, &max_logit}) o->poison(stream.get());

  const cuda::Attention attention(problem, AttentionOptions{}, workspace.data(), workspace.bytes());
  const DeviceLayout device_layout{cu.as<int32_t>(), cup.as<int32_t>(), problem.capacity};
  auto view = [&](const DeviceBuffer& buffer, int64_t heads) {
    return ThdTensor{buffer.data(), s.dtype, rows, heads, s.head_dim};
  };
  const ForwardTensors ft{view(q, s.q_heads), view(k, s.kv_heads), view(v, s.kv_heads),
                                view(out, s.q_heads), lse.as<float>(), max_logit.as<float>()};
  const BackwardTensors bt{view(q, s.q_heads),   view(k, s.kv_heads),   view(v, s.kv_heads),
                                 view(out, s.q_heads), view(dout, s.q_heads), lse.as<float>(),
                                 view(dq, s.q_heads),  view(dk, s.kv_heads),  view(dv, s.kv_heads)};
  attention.check(device_layout, &ft, &bt);
  auto step = [&] {
    attention.forward(device_layout, ft, stream.get());
    attention.backward(device_layout, bt, stream.get());
  };

  step();
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream.get()));
  b.ref.out = HostTensor(s.dtype, rows, s.q_heads, s.head_dim);
  b.ref.dq = HostTensor(s.dtype, rows, s.q_heads, s.head_dim);
  b.ref.dk = HostTensor(s.dtype, rows, s.kv_heads, s.head_dim);
  b.ref.dv = HostTensor(s.dtype, rows, s.kv_heads, s.head_dim);
  b.ref.lse.resize(static_cast<size_t>(rows * s.q_heads));
  b.ref.max_logit.resize(static_cast<size_t>(s.q_heads));
  out.download(b.ref.out.data(), out.bytes());
  dq.download(b.ref.dq.data(), dq.bytes());
  dk.download(b.ref.dk.data(), dk.bytes());
  dv.download(b.ref.dv.data(), dv.bytes());
  lse.download(b.ref.lse.data(), lse.bytes());
  max_logit.download(b.ref.max_logit.data(), max_logit.bytes());

  for (int i = 0; i < warmup; ++i) step();
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream.get()));
  Event start, stop;
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    THDCP_CHECK_CUDA(cudaEventRecord(start.get(), stream.get()));
    step();
    THDCP_CHECK_CUDA(cudaEventRecord(stop.get(), stream.get()));
    THDCP_CHECK_CUDA(cudaEventSynchronize(stop.get()));
    ms.push_back(elapsed_ms(start, stop));
  }
  b.ms = median(ms);
  return b;
}

// What a rank of one CP run reports (written by its thread, read after run_in_process).
struct RankReport {
  std::string skip;                                 // non-empty: this rank's GPU lacks memory
  std::array<Comparison, 6> checks;                 // out, lse, max_logit, dq, dk, dv
  bool passed = false;
  std::vector<double> step_ms;                      // per timed step
  std::vector<std::array<double, kPhases>> phases;  // per timed step: forward + backward, ms
  // The step's collectives alone, on idle GPUs (per timed repeat, ms): the all-gathers of K
  // and V that the forward makes, and the reduce-scatters of fp32 dK and dV of the backward.
  std::vector<double> gather_ms, reduce_ms;
  std::string collectives_skip;  // non-empty: no memory for the extra buffers
};

const char* const kCheckNames[6] = {"out", "lse", "max_logit", "dq", "dk", "dv"};

// The rows of `rank` of a global [T, H, D] tensor.
HostTensor local_rows(const HostTensor& global, const LayoutView& layout, int cp, int rank) {
  HostTensor local(global.dtype(), global.tokens() / cp, global.heads(), global.head_dim());
  split_for_rank(global.data(), local.data(), global.row_bytes(), layout, cp, rank);
  return local;
}

// `device` against `expected` (both [rows, H, D] of dtype, or floats).
Comparison compare_device(const DeviceBuffer& device, const HostTensor& expected, const Tolerance& tolerance) {
  HostTensor got(expected.dtype(), expected.tokens(), expected.heads(), expected.head_dim());
  device.download(got.data(), device.bytes());
  return compare_values(got.data(), got.dtype(), expected.data(), expected.dtype(), expected.numel(), tolerance);
}

Comparison compare_device(const DeviceBuffer& device, const std::vector<float>& expected, const Tolerance& tolerance) {
  std::vector<float> got(expected.size());
  device.download(got.data(), device.bytes());
  return compare_values(got.data(), DType::kFloat32, expected.data(), DType::kFloat32,
                        static_cast<int64_t>(expected.size()), tolerance);
}

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

// One rank of the CP run of a (T, mask, cp): its NCCL communicator, buffers and plan; the
// check against the reference; the timed steps.
void cp_rank(Communicator& host, const BatchLayout& layout, const Inputs& in, const Reference& ref, const Mask& mask,
             const Shape& s, cp::KvSource kv, const AttentionOptions& attention,
             int warmup, int iters, std::vector<RankReport>& reports) {
  const int rank = host.rank(), cp = host.size();
  RankReport& report = reports[static_cast<size_t>(rank)];
  nccl::Options options;
  options.timeout_seconds = kSyncTimeout;
  const std::unique_ptr<DeviceCommunicator> comm = nccl::create(host, rank, options);
  THDCP_CHECK_CUDA(cudaSetDevice(comm->device()));

  const LayoutView view_ = layout.view();
  cp::Problem problem;
  problem.cp = cp;
  problem.capacity = Capacity{layout.num_seqs(), layout.total_rows()};
  problem.mask = mask;
  problem.q_heads = s.q_heads;
  problem.kv_heads = s.kv_heads;
  problem.head_dim = s.head_dim;
  problem.dtype = s.dtype;
  const int64_t local = problem.local_rows();
  const size_t offsets = sizeof(int32_t) * layout.cu_seqlens.size();
  const size_t workspace_bytes = cp::cuda_workspace_size(problem);
  const double need = 4.0 * static_cast<double>(s.bytes(local, s.q_heads)) +
                      4.0 * static_cast<double>(s.bytes(local, s.kv_heads)) +
                      4.0 * static_cast<double>(local * s.q_heads + s.q_heads) +
                      static_cast<double>(workspace_bytes + 2 * offsets) + kDeviceMargin;
  const double free_bytes = device_free_bytes(comm->device());
  if (need > free_bytes) {
    report.skip = "rank " + std::to_string(rank) + " needs about " + gib(need) + " on GPU " +
                  std::to_string(comm->device()) + " (local tensors and a CP workspace holding the whole K/V), " +
                  gib(free_bytes) + " free";
  }
  if (any_rank(host, !report.skip.empty())) return;

  DeviceBuffer q(s.bytes(local, s.q_heads)), k(s.bytes(local, s.kv_heads)), v(s.bytes(local, s.kv_heads)),
      dout(s.bytes(local, s.q_heads)), out(s.bytes(local, s.q_heads)), dq(s.bytes(local, s.q_heads)),
      dk(s.bytes(local, s.kv_heads)), dv(s.bytes(local, s.kv_heads));
  DeviceBuffer lse(sizeof(float) * static_cast<size_t>(local * s.q_heads)),
      max_logit(sizeof(float) * static_cast<size_t>(s.q_heads));
  DeviceBuffer cu(offsets), cup(offsets), workspace(workspace_bytes);
  Stream stream;
  for (auto [host_tensor, device] : {std::make_pair(&in.q, &q), std::make_pair(&in.k, &k),
                                     std::make_pair(&in.v, &v), std::make_pair(&in.dout, &dout)}) {
    const HostTensor part = local_rows(*host_tensor, view_, cp, rank);
    device->upload(part.data(), device->bytes(), stream.get());
  }
  cu.upload(layout.cu_seqlens.data(), offsets, stream.get());
  cup.upload(layout.cu_seqlens_padded.data(), offsets, stream.get());
  for (DeviceBuffer* o : {&out, &dq, &dk, &dv, &lse, &max_logit}) o->poison(stream.get());

  cp::CudaPlan plan(*comm, problem, attention, workspace.data(), workspace.bytes());
  comm->warm_up(stream.get());
  auto tensor = [&](const DeviceBuffer& buffer, int64_t heads) {
    return ThdTensor{buffer.data(), s.dtype, local, heads, s.head_dim};
  };
  const DeviceLayout device_layout{cu.as<int32_t>(), cup.as<int32_t>(), problem.capacity};
  const ForwardTensors ft{tensor(q, s.q_heads),   tensor(k, s.kv_heads), tensor(v, s.kv_heads),
                              tensor(out, s.q_heads), lse.as<float>(),       max_logit.as<float>()};
  const BackwardTensors bt{tensor(q, s.q_heads),   tensor(k, s.kv_heads),   tensor(v, s.kv_heads),
                               tensor(out, s.q_heads), tensor(dout, s.q_heads), lse.as<float>(),
                               tensor(dq, s.q_heads),  tensor(dk, s.kv_heads),  tensor(dv, s.kv_heads)};
  plan.check_tensors(device_layout, &ft, &bt);

  // The check: one step on NaN-poisoned outputs against this rank's rows of the reference,
  // with the tolerances of the CUDA CP tests (tests/cp/cuda_cp_cases.h: a tensor-core result
  // with P, resp. P and dS, rounded to the storage dtype; fp32 results to 2^-16).
  plan.forward(device_layout, ft, stream.get());
  plan.backward(device_layout, bt, stream.get(), kv);
  comm->synchronize(stream.get(), kSyncTimeout);
  const Tolerance out_tolerance = derive_tensor_core_tolerance(s.dtype, 1);
  const Tolerance grad_tolerance = derive_tensor_core_tolerance(s.dtype, 2);
  const Tolerance fp32_tolerance = tensor_core_fp32_tolerance();
  report.checks[0] = compare_device(out, local_rows(ref.out, view_, cp, rank), out_tolerance);
  {
    std::vector<float> expected(static_cast<size_t>(local * s.q_heads));
    const int64_t rows = layout.total_rows();
    for (int64_t h = 0; h < s.q_heads; ++h) {
      split_for_rank(ref.lse.data() + h * rows, expected.data() + h * local, sizeof(float), view_, cp, rank);
    }
    report.checks[1] = compare_device(lse, expected, fp32_tolerance);
  }
  report.checks[2] = compare_device(max_logit, ref.max_logit, fp32_tolerance);
  report.checks[3] = compare_device(dq, local_rows(ref.dq, view_, cp, rank), grad_tolerance);
  report.checks[4] = compare_device(dk, local_rows(ref.dk, view_, cp, rank), grad_tolerance);
  report.checks[5] = compare_device(dv, local_rows(ref.dv, view_, cp, rank), grad_tolerance);
  report.passed = std::all_of(report.checks.begin(), report.checks.end(), [](const Comparison& c) { return c.passed(); });
  if (any_rank(host, !report.passed)) return;  // no timing after a mismatch on any rank

  // The whole step: all ranks start together (host barrier, streams idle), each times its own.
  Event start, stop;
  for (int i = 0; i < warmup + iters; ++i) {
    host_barrier(host);
    THDCP_CHECK_CUDA(cudaEventRecord(start.get(), stream.get()));
    plan.forward(device_layout, ft, stream.get());
    plan.backward(device_layout, bt, stream.get(), kv);
    THDCP_CHECK_CUDA(cudaEventRecord(stop.get(), stream.get()));
    comm->synchronize(stream.get(), kSyncTimeout);
    if (i >= warmup) report.step_ms.push_back(elapsed_ms(start, stop));
  }

  // The phases, in steps of their own: the plan's events of the forward are read before the
  // backward records them again.
  plan.enable_phase_timing();
  for (int i = 0; i < warmup + iters; ++i) {
    host_barrier(host);
    cp::Timings timings;
    plan.forward(device_layout, ft, stream.get());
    comm->synchronize(stream.get(), kSyncTimeout);
    plan.add_phase_timings(timings);
    plan.backward(device_layout, bt, stream.get(), kv);
    comm->synchronize(stream.get(), kSyncTimeout);
    plan.add_phase_timings(timings);
    if (i < warmup) continue;
    std::array<double, kPhases> ms{};
    for (int p = 0; p < kPhases; ++p) ms[static_cast<size_t>(p)] = timings.seconds[p] * 1e3;
    report.phases.push_back(ms);
  }

  // The collectives alone, with nothing beside them: what NCCL takes on this host for the
  // step's volumes (its bus bandwidth), against which the exposed communication reads.
  const size_t kv_bytes = s.bytes(local, s.kv_heads);
  const size_t grad_count = static_cast<size_t>(local * s.kv_heads * s.head_dim);
  const double extra = static_cast<double>(kv_bytes) * cp + sizeof(float) * static_cast<double>(grad_count) * (cp + 1);
  if (extra + kDeviceMargin > device_free_bytes(comm->device())) {
    report.collectives_skip = "no room for " + gib(extra) + " of collective buffers";
  }
  if (any_rank(host, !report.collectives_skip.empty())) return;
  DeviceBuffer gathered(kv_bytes * static_cast<size_t>(cp)), ranked(sizeof(float) * grad_count * cp),
      reduced(sizeof(float) * grad_count);
  ranked.poison(stream.get());
  for (int i = 0; i < warmup + iters; ++i) {
    host_barrier(host);
    THDCP_CHECK_CUDA(cudaEventRecord(start.get(), stream.get()));
    comm->all_gather(k.data(), gathered.data(), kv_bytes, stream.get());
    comm->all_gather(v.data(), gathered.data(), kv_bytes, stream.get());
    THDCP_CHECK_CUDA(cudaEventRecord(stop.get(), stream.get()));
    comm->synchronize(stream.get(), kSyncTimeout);
    if (i >= warmup) report.gather_ms.push_back(elapsed_ms(start, stop));
  }
  for (int i = 0; i < warmup + iters; ++i) {
    host_barrier(host);
    THDCP_CHECK_CUDA(cudaEventRecord(start.get(), stream.get()));
    for (int twice = 0; twice < 2; ++twice) {
      comm->reduce_scatter_sum(ranked.as<float>(), reduced.as<float>(), grad_count, stream.get());
    }
    THDCP_CHECK_CUDA(cudaEventRecord(stop.get(), stream.get()));
    comm->synchronize(stream.get(), kSyncTimeout);
    if (i >= warmup) report.reduce_ms.push_back(elapsed_ms(start, stop));
  }
  host_barrier(host);
}

// One row of the final table.
struct Row {
  int64_t tokens = 0;
  std::string mask;
  int cp = 0;
  bool kept_kv = false;  // the backward on the forward's K/V (cp::KvSource::kFromForward)
  int sm_margin = 0;     // AttentionOptions::sm_margin
  size_t documents = 0;
  std::string status;  // "PASS", "FAIL", "skipped"
  double baseline_ms = 0, step_ms = 0, comm_ms = 0, efficiency = 0;
  std::array<double, kPhases> phase_ms{};
  // The collectives alone (the slowest rank, median): all-gathers of K and V, reduce-scatters
  // of fp32 dK and dV, and their bus bandwidths (nccl-tests' busbw: bytes of the whole
  // gathered / reduced tensors x (cp - 1) / cp per second). 0: not measured.
  double gather_ms = 0, reduce_ms = 0, gather_busbw = 0, reduce_busbw = 0;
  bool dq_pass = false;      // AttentionOptions::separate_dq_pass
};

// Where the backward takes K/V from, and (with --dq-pass 1) that dQ had a pass of its own.
std::string backward_form(const Row& r) {
  return std::string(r.kept_kv ? "kept" : "gathered") + (r.dq_pass ? ", dQ pass" : "");
}

double target_of(int cp) {
  switch (cp) {
    case 2: return 0.95;
    case 4: return 0.90;
    case 8: return 0.85;
    default: return 0;
  }
}

std::string target_text(const Row& r) {
  const double target = target_of(r.cp);
  if (target == 0) return "no target";
  char text[48];
  if (r.status != "PASS") {
    std::snprintf(text, sizeof(text), ">= %.2f: not measured", target);
  } else {
    std::snprintf(text, sizeof(text), ">= %.2f: %s", target, r.efficiency >= target ? "met" : "not met");
  }
  return text;
}

std::vector<NamedMask> parse_masks(const std::string& text, int64_t window) {
  std::vector<NamedMask> masks;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    NamedMask m;
    if (item == "causal") {
      m = NamedMask{"causal", Mask::causal()};
    } else if (item == "window") {
      m = NamedMask{"window(" + std::to_string(window) + ",0)", Mask::window(static_cast<int32_t>(window), 0)};
    } else {
      throw UsageError("--mask '" + item + "': use causal and/or window, separated by ','");
    }
    for (const NamedMask& seen : masks) {
      if (seen.name == m.name) throw UsageError("--mask '" + text + "': " + item + " is given twice");
    }
    masks.push_back(m);
  }
  if (masks.empty() || text.empty() || text.back() == ',') {
    throw UsageError("--mask '" + text + "': use causal and/or window, separated by ','");
  }
  return masks;
}

}  // namespace

int bench_scaling_command(const std::vector<std::string>& argv) {
  const Args args(argv,
                  {"gpus", "tokens", "mask", "window", "q-heads", "kv-heads", "head-dim", "dtype", "median",
                   "max-length", "seed", "warmup", "iters", "kv", "sm-margin", "dq-pass"},
                  {"scaling", "help"});
  if (args.has("help")) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  if (!args.has("gpus")) throw UsageError("--scaling needs --gpus N (the CP sizes, e.g. --gpus 2 or --gpus 2,4)");
  std::vector<int> cps;
  for (int64_t n : parse_int_list("gpus", args.get("gpus", ""), 1, 64)) {
    if (std::find(cps.begin(), cps.end(), static_cast<int>(n)) != cps.end()) {
      throw UsageError("--gpus '" + args.get("gpus", "") + "': " + std::to_string(n) + " is given twice");
    }
    cps.push_back(static_cast<int>(n));
  }
  int64_t align = 1;  // 2*lcm(cps): every document and T are multiples of it
  for (int c : cps) align = std::lcm(align, static_cast<int64_t>(c));
  align *= 2;
  std::vector<int64_t> tokens_list = {131072, 524288};
  if (args.has("tokens")) tokens_list = parse_int_list("tokens", args.get("tokens", ""), 2, int64_t{1} << 30);
  for (int64_t t : tokens_list) {
    if (t % align != 0) {
      throw UsageError("--tokens " + std::to_string(t) + ": use a multiple of 2*lcm(cp sizes) = " +
                       std::to_string(align) + " (every rank holds T/cp rows, two chunks of every document)");
    }
  }
  const int64_t window = args.get_int("window", 4096, 0, int64_t{1} << 30);
  const std::vector<NamedMask> masks = parse_masks(args.get("mask", "causal,window"), window);
  Shape s;
  s.q_heads = args.get_int("q-heads", 32, 1, 1024);
  s.kv_heads = args.get_int("kv-heads", 8, 1, 1024);
  s.head_dim = args.get_int("head-dim", 128, 1, 1024);
  s.dtype = parse_dtype(args.get("dtype", "bf16"));
  if (s.dtype != DType::kBFloat16 && s.dtype != DType::kFloat16) {
    throw UsageError(std::string("--dtype ") + dtype_name(s.dtype) + ": the CUDA kernels take bf16 or fp16");
  }
  if (!cuda::cuda_supports_head_dim(s.head_dim)) {
    throw UsageError("--head-dim " + std::to_string(s.head_dim) + ": the CUDA kernels take 64 or 128");
  }
  if (s.q_heads % s.kv_heads != 0) {
    throw UsageError("--q-heads " + std::to_string(s.q_heads) + " must be a multiple of --kv-heads " +
                     std::to_string(s.kv_heads));
  }
  LengthDistribution dist;
  dist.median = static_cast<double>(args.get_int("median", 1500, 1, int64_t{1} << 30));
  dist.max_length = args.get_int("max-length", 32768, 1, int64_t{1} << 30);
  const uint64_t seed = args.get_seed("seed", 1);
  const int warmup = static_cast<int>(args.get_int("warmup", 3, 0, 1000));
  const int iters = static_cast<int>(args.get_int("iters", 20, 1, 10000));
  std::vector<int> margin_list;
  for (int64_t m : parse_int_list("sm-margin", args.get("sm-margin", "0"), 0, 1024)) {
    margin_list.push_back(static_cast<int>(m));
  }
  std::vector<bool> dq_pass_list;
  for (int64_t b : parse_int_list("dq-pass", args.get("dq-pass", "0"), 0, 1)) dq_pass_list.push_back(b != 0);
  std::vector<bool> kv_list;
  {
    std::stringstream items(args.get("kv", "gather"));
    std::string item;
    while (std::getline(items, item, ',')) {
      if (item != "gather" && item != "kept") {
        throw UsageError("--kv '" + args.get("kv", "") + "': use gather and/or kept, separated by ','");
      }
      kv_list.push_back(item == "kept");
    }
    if (kv_list.empty()) throw UsageError("--kv '': use gather and/or kept");
  }

  // The GPUs: every cp needs its own (NCCL refuses two ranks on one device).
  int visible = 0;
  const cudaError_t status = cudaGetDeviceCount(&visible);
  std::string why_none;
  if (status != cudaSuccess) {
    visible = 0;
    why_none = std::string(" (") + cudaGetErrorString(status) + ")";
    (void)cudaGetLastError();
  }
  const int most = *std::max_element(cps.begin(), cps.end());
  if (most > visible) {
    throw UsageError("--gpus " + std::to_string(most) + ": only " + std::to_string(visible) + " GPU(s) are visible" +
                     why_none + "; AllGather CP over NCCL needs a GPU per rank (check CUDA_VISIBLE_DEVICES)");
  }
  if (!nccl::built_with_nccl()) throw UsageError("--scaling needs NCCL: this thdcp was built without it");
  // NVLink multicast (NVLS) must stay off on these hosts; NCCL reads the variable at init.
  std::string nvls_note;
  if (const char* nvls = std::getenv("NCCL_NVLS_ENABLE")) {
    if (std::string(nvls) != "0") {
      throw UsageError(std::string("NCCL_NVLS_ENABLE=") + nvls +
                       ": NVLink multicast must stay off on these hosts: unset it or set it to 0");
    }
    nvls_note = "NCCL_NVLS_ENABLE=0 (from the environment)";
  } else {
    if (setenv("NCCL_NVLS_ENABLE", "0", 1) != 0) throw Error("could not set NCCL_NVLS_ENABLE=0");
    nvls_note = "NCCL_NVLS_ENABLE=0 (was unset; set by thdcp before NCCL init: NVLink multicast stays off)";
  }

  std::printf("thdcp bench --scaling: AllGather CP over NCCL, one process, a thread per GPU (rank r on GPU r)\n");
  std::string gpu_names;  // repeated above the table
  for (int d = 0; d < most; ++d) {
    cudaDeviceProp prop{};
    THDCP_CHECK_CUDA(cudaGetDeviceProperties(&prop, d));
    std::printf("GPU %d: %s (%d SMs, sm_%d%d, %.1f GiB)\n", d, prop.name, prop.multiProcessorCount, prop.major,
                prop.minor, static_cast<double>(prop.totalGlobalMem) / kGiB);
    gpu_names += (d ? ", " : "") + std::to_string(d) + ": " + prop.name;
  }
  if (most > 1) {
    std::string peers;
    for (int a = 0; a < most; ++a) {
      for (int b = a + 1; b < most; ++b) {
        int can = 0;
        THDCP_CHECK_CUDA(cudaDeviceCanAccessPeer(&can, a, b));
        peers += " " + std::to_string(a) + "-" + std::to_string(b) + ":" + (can ? "yes" : "no");
      }
    }
    std::printf("peer access:%s\n", peers.c_str());
  }
  int driver = 0, runtime = 0;
  THDCP_CHECK_CUDA(cudaDriverGetVersion(&driver));
  THDCP_CHECK_CUDA(cudaRuntimeGetVersion(&runtime));
  THDCP_CHECK_CUDA(cudaSetDevice(0));
  std::printf("CUDA driver %d, runtime %d; kernels: %s; %s\n", driver, runtime, cuda::kernel_family(),
              nvls_note.c_str());
  std::printf("problem: Hq=%lld Hkv=%lld D=%lld %s; lengths lognormal median %.0f sigma %.1f max %lld, seed %llu; "
              "documents padded to multiples of %lld; warm-up %d, median of %d steps\n",
              static_cast<long long>(s.q_heads), static_cast<long long>(s.kv_heads),
              static_cast<long long>(s.head_dim), dtype_name(s.dtype), dist.median, dist.sigma,
              static_cast<long long>(dist.max_length), static_cast<unsigned long long>(seed),
              static_cast<long long>(align), warmup, iters);
  std::fflush(stdout);

  struct Variant {
    int cp;
    bool kept_kv;
    int sm_margin;
    bool dq_pass;
  };
  std::vector<Variant> variants;  // each a row
  for (int c : cps) {
    for (bool kept : kv_list) {
      for (int margin : margin_list) {
        for (bool dq_pass : dq_pass_list) variants.push_back(Variant{c, kept, margin, dq_pass});
      }
    }
  }
  std::vector<Row> rows;
  bool failed = false;
  for (int64_t tokens : tokens_list) {
    // One draw for this T: sampled with the coarsest padding, so every cp's layout is this one.
    const std::vector<int64_t> lengths = sample_lengths(tokens, static_cast<int>(align / 2), dist, seed);
    const BatchLayout layout =
        make_layout(lengths, static_cast<int>(align / 2), Capacity{static_cast<int>(lengths.size()) + 1, tokens});
    int64_t longest = 0;
    for (int64_t n : lengths) longest = std::max(longest, n);
    std::printf("\nT=%lld: %zu documents, %lld valid tokens, longest %lld\n", static_cast<long long>(tokens),
                lengths.size(), static_cast<long long>(layout.valid_tokens()), static_cast<long long>(longest));

    // Host: the inputs, the reference, and each rank's part of one tensor and its download at a time.
    const double inputs_bytes = 2.0 * static_cast<double>(s.bytes(tokens, s.q_heads) + s.bytes(tokens, s.kv_heads));
    const double host_need = 2.0 * inputs_bytes + 4.0 * static_cast<double>(tokens * s.q_heads) +
                             2.0 * static_cast<double>(s.bytes(tokens, s.q_heads));
    const double host_free = host_available_bytes();
    if (host_free > 0 && host_need > host_free) {
      std::printf("skip T=%lld: needs about %s of host memory, %s available\n", static_cast<long long>(tokens),
                  gib(host_need).c_str(), gib(host_free).c_str());
      for (const NamedMask& m : masks) {
        for (int c : cps) rows.push_back(Row{tokens, m.name, c, false, 0, lengths.size(), "skipped", 0, 0, 0, 0, {}});
      }
      continue;
    }
    Inputs in{HostTensor(s.dtype, tokens, s.q_heads, s.head_dim), HostTensor(s.dtype, tokens, s.kv_heads, s.head_dim),
              HostTensor(s.dtype, tokens, s.kv_heads, s.head_dim), HostTensor(s.dtype, tokens, s.q_heads, s.head_dim)};
    fill_repeated(in.q, seed + 1);
    fill_repeated(in.k, seed + 2);
    fill_repeated(in.v, seed + 3);
    fill_repeated(in.dout, seed + 4);

    for (const NamedMask& m : masks) {
      const double pairs = static_cast<double>(table_pairs(build_segment_table(layout.view(), m.mask)));
      const Baseline base = run_baseline(layout, in, m.mask, s, warmup, iters);
      if (!base.skip.empty()) {
        std::printf("skip T=%lld %s: %s\n", static_cast<long long>(tokens), m.name.c_str(), base.skip.c_str());
        for (int c : cps) rows.push_back(Row{tokens, m.name, c, false, 0, lengths.size(), "skipped", 0, 0, 0, 0, {}});
        continue;
      }
      std::printf("baseline T=%lld %s: 1 GPU, fwd+bwd %.3f ms (%.1f TFLOP/s over %.0f allowed pairs)\n",
                  static_cast<long long>(tokens), m.name.c_str(), base.ms,
                  14.0 * pairs * static_cast<double>(s.head_dim * s.q_heads) / (base.ms * 1e9), pairs);
      std::fflush(stdout);

      for (const Variant& variant : variants) {
        const int c = variant.cp;
        const cp::KvSource kv = variant.kept_kv ? cp::KvSource::kFromForward : cp::KvSource::kGather;
        Row row{tokens, m.name, c, variant.kept_kv, variant.sm_margin, lengths.size(), "PASS", base.ms, 0, 0, 0, {}};
        row.dq_pass = variant.dq_pass;
        AttentionOptions attention;
        attention.sm_margin = variant.sm_margin;
        attention.separate_dq_pass = variant.dq_pass;
        std::vector<RankReport> reports(static_cast<size_t>(c));
        run_in_process(c, [&](Communicator& host) {
          cp_rank(host, layout, in, base.ref, m.mask, s, kv, attention, warmup, iters, reports);
        });
        std::string skip;
        for (const RankReport& r : reports) {
          if (!r.skip.empty()) skip += (skip.empty() ? "" : "; ") + r.skip;
        }
        if (!skip.empty()) {
          std::printf("skip T=%lld %s cp=%d: %s\n", static_cast<long long>(tokens), m.name.c_str(), c, skip.c_str());
          row.status = "skipped";
          rows.push_back(row);
          continue;
        }
        bool passed = true;
        for (int t = 0; t < 6; ++t) {
          Comparison worst;
          for (const RankReport& r : reports) {
            const Comparison& x = r.checks[static_cast<size_t>(t)];
            worst.count += x.count;
            worst.mismatches += x.mismatches;
            worst.max_abs_error = std::max(worst.max_abs_error, x.max_abs_error);
            worst.max_rel_error = std::max(worst.max_rel_error, x.max_rel_error);
          }
          std::printf("verify T=%lld %s cp=%d %-9s max abs err %.3e, max rel err %.3e, %lld/%lld outside "
                      "tolerance\n",
                      static_cast<long long>(tokens), m.name.c_str(), c, kCheckNames[t], worst.max_abs_error,
                      worst.max_rel_error, static_cast<long long>(worst.mismatches),
                      static_cast<long long>(worst.count));
          passed = passed && worst.mismatches == 0;
        }
        std::printf("verify T=%lld %s cp=%d: %s (every rank's rows against the single-GPU result)\n",
                    static_cast<long long>(tokens), m.name.c_str(), c, passed ? "PASS" : "FAIL: not timed");
        if (!passed) {
          failed = true;
          row.status = "FAIL";
          rows.push_back(row);
          std::fflush(stdout);
          continue;
        }
        // The step: the slowest rank of each step, median over steps.
        std::vector<double> slowest(static_cast<size_t>(iters), 0.0);
        std::string per_rank;
        for (const RankReport& r : reports) {
          for (size_t i = 0; i < slowest.size(); ++i) slowest[i] = std::max(slowest[i], r.step_ms[i]);
          char text[32];
          std::snprintf(text, sizeof(text), " %.3f", median(r.step_ms));
          per_rank += text;
        }
        row.step_ms = median(slowest);
        // The phases: per rank the median over steps, then the max over ranks. What the step
        // spends beyond its attention kernels (communication and the work around it that the
        // overlap did not hide): step - attention.
        for (const RankReport& r : reports) {
          for (int p = 0; p < kPhases; ++p) {
            std::vector<double> one;
            for (const auto& step : r.phases) one.push_back(step[static_cast<size_t>(p)]);
            row.phase_ms[static_cast<size_t>(p)] = std::max(row.phase_ms[static_cast<size_t>(p)], median(one));
          }
        }
        row.comm_ms = row.step_ms - row.phase_ms[static_cast<size_t>(cp::Phase::kAttention)];
        if (reports[0].collectives_skip.empty()) {
          std::vector<double> gather(static_cast<size_t>(iters), 0.0), reduce(static_cast<size_t>(iters), 0.0);
          for (const RankReport& r : reports) {
            for (size_t i = 0; i < gather.size(); ++i) {
              gather[i] = std::max(gather[i], r.gather_ms[i]);
              reduce[i] = std::max(reduce[i], r.reduce_ms[i]);
            }
          }
          row.gather_ms = median(gather);
          row.reduce_ms = median(reduce);
          const double share = static_cast<double>(c - 1) / c;
          const double kv_bytes = static_cast<double>(s.bytes(tokens, s.kv_heads));
          const double grad_bytes = sizeof(float) * static_cast<double>(tokens * s.kv_heads * s.head_dim);
          row.gather_busbw = 2 * kv_bytes * share / (row.gather_ms * 1e6);
          row.reduce_busbw = 2 * grad_bytes * share / (row.reduce_ms * 1e6);
          std::printf("collectives alone T=%lld cp=%d: all-gather of K and V %.3f ms (busbw %.0f GB/s), "
                      "reduce-scatter of fp32 dK and dV %.3f ms (busbw %.0f GB/s)\n",
                      static_cast<long long>(tokens), c, row.gather_ms, row.gather_busbw, row.reduce_ms,
                      row.reduce_busbw);
        } else {
          std::printf("collectives alone T=%lld cp=%d: not measured: %s\n", static_cast<long long>(tokens), c,
                      reports[0].collectives_skip.c_str());
        }
        row.efficiency = base.ms / (c * row.step_ms);
        std::printf("result T=%lld %s cp=%d, backward K/V %s, SM margin %d: baseline "
                    "%.3f ms, CP step %.3f ms (per rank:%s), beyond attention %.3f ms, efficiency %.3f (%s)\n",
                    static_cast<long long>(tokens), m.name.c_str(), c, backward_form(row).c_str(), row.sm_margin, base.ms, row.step_ms,
                    per_rank.c_str(), row.comm_ms, row.efficiency, target_text(row).c_str());
        std::fflush(stdout);
        rows.push_back(row);
      }
    }
  }

  std::printf("\nGPUs %s; %s\n", gpu_names.c_str(), nvls_note.c_str());
  std::printf("AllGather CP over NCCL vs 1 GPU, forward+backward, ms (CUDA events, median of %d after %d warm-up):\n"
              "step = the slowest rank's step (ranks start together after a host barrier; collectives on the\n"
              "plan's second stream, the reduce-scatter overlapped with the dQ pass); phases = per rank the\n"
              "median over separate eager steps run in program order on one stream (phase timing), max over\n"
              "ranks (reduce = max_logit all-reduce + fp32 dK/dV reduce-scatter, including waits for a slower\n"
              "peer); beyond attention = step - attention phase: what the overlap left exposed;\n"
              "efficiency = baseline / (cp x step).\n\n",
              iters, warmup);
  std::printf("| T | mask | cp | bwd K/V | SM margin | documents | check | baseline ms | step ms |");
  for (int p = 0; p < kPhases; ++p) std::printf(" %s |", cp::phase_name(static_cast<cp::Phase>(p)));
  std::printf(" beyond attention ms | efficiency | target |\n");
  std::printf("| ---: | --- | ---: | --- | ---: | ---: | --- | ---: | ---: |");
  for (int p = 0; p < kPhases; ++p) std::printf(" ---: |");
  std::printf(" ---: | ---: | --- |\n");
  for (const Row& r : rows) {
    std::printf("| %lld | %s | %d | %s | %d | %zu | %s |", static_cast<long long>(r.tokens), r.mask.c_str(), r.cp,
                backward_form(r).c_str(), r.sm_margin, r.documents, r.status.c_str());
    if (r.status == "PASS") {
      std::printf(" %.3f | %.3f |", r.baseline_ms, r.step_ms);
      for (int p = 0; p < kPhases; ++p) std::printf(" %.3f |", r.phase_ms[static_cast<size_t>(p)]);
      std::printf(" %.3f | %.3f | %s |\n", r.comm_ms, r.efficiency, target_text(r).c_str());
    } else {
      if (r.baseline_ms > 0) {
        std::printf(" %.3f | - |", r.baseline_ms);
      } else {
        std::printf(" - | - |");
      }
      for (int p = 0; p < kPhases; ++p) std::printf(" - |");
      std::printf(" - | - | %s |\n", target_text(r).c_str());
    }
  }
  std::printf("\nThe step's collectives alone (the slowest rank, median; nothing else on the GPUs): all-gathers\n"
              "of K and V as in the forward, reduce-scatters of fp32 dK and dV as in the backward. busbw as in\n"
              "nccl-tests: bytes of the whole tensors x (cp - 1) / cp per second.\n\n");
  std::printf("| T | mask | cp | bwd K/V | SM margin | all-gather K, V ms | busbw GB/s | "
              "reduce-scatter dK, dV ms | busbw GB/s |\n| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | "
              "---: |\n");
  for (const Row& r : rows) {
    if (r.gather_ms <= 0) continue;
    std::printf("| %lld | %s | %d | %s | %d | %.3f | %.0f | %.3f | %.0f |\n", static_cast<long long>(r.tokens),
                r.mask.c_str(), r.cp, backward_form(r).c_str(), r.sm_margin, r.gather_ms,
                r.gather_busbw, r.reduce_ms, r.reduce_busbw);
  }
  if (failed) std::printf("\nverification FAILED for at least one configuration (not timed)\n");
  return failed ? 1 : 0;
}

}  // namespace thdcp::tools
