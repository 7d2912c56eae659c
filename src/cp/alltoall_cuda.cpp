#include "alltoall_cuda.h"

#include "thdcp/core/error.h"
#include "thdcp/core/workspace.h"
#include "thdcp/cuda/attention.h"
#include "thdcp/cuda/check.h"
#include "thdcp/cuda/table.h"

namespace thdcp::cp::detail {

namespace {

cuda::TablePlan table_plan(const Problem& p) { return cuda::TablePlan::single_device(p.capacity, p.mask); }

// One slice of this rank's share of the heads over every row: the single-device kernels'
// shape, with fp32 gradients (rounded once, on the way back to the rank's rows).
cuda::AttentionShape head_shape(const Problem& p) {
  cuda::AttentionShape s;
  s.q_heads = p.q_heads / p.cp / p.head_slices;
  s.kv_heads = p.kv_heads / p.cp / p.head_slices;
  s.head_dim = p.head_dim;
  s.v_head_dim = p.v_head_dim;
  s.table = table_plan(p).table();
  s.dtype = p.dtype;
  s.dq_dtype = DType::kFloat32;
  s.dkv_dtype = DType::kFloat32;
  return s;
}

// The parts of the workspace; `carver` without memory sizes it.
struct Parts {
  Segment* segments = nullptr;
  ExchangeParts exchange;  // one group of cp members: every row, sequence order
  void* forward = nullptr;
  void* backward = nullptr;
  size_t forward_bytes = 0, backward_bytes = 0;
};

Parts carve(WorkspaceCarver& carver, const Problem& p, const AttentionOptions& options) {
  Parts w;
  w.segments = carver.take<Segment>(table_plan(p).workspace_size());
  w.exchange = carve_exchange(carver, p, p.cp);
  const cuda::AttentionShape shape = head_shape(p);
  w.forward_bytes = cuda::ForwardPlan::workspace_size(shape);
  w.backward_bytes = cuda::BackwardPlan::workspace_size(shape, options);
  w.forward = carver.take(w.forward_bytes);
  w.backward = carver.take(w.backward_bytes);
  return w;
}

}  // namespace

// The most head slices a plan takes (events per slice are made at plan time).
constexpr int kMaxSlices = 16;

struct CudaAllToAll::State {
  Parts w;
  CudaHeadExchange x;
  cuda::TablePlan table;
  std::unique_ptr<cuda::ForwardPlan> forward;
  std::unique_ptr<cuda::BackwardPlan> backward;
  // With more than one slice: the exchanges run on `side` (the device's highest priority, so
  // that NCCL's blocks are scheduled before the attention's waiting ones), forked from and
  // joined back to the step's stream by `fork` and `join`; `in[s]`: slice s's inputs are on
  // its heads; `done[s]`: its attention has finished.
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  cudaEvent_t in[kMaxSlices] = {}, done[kMaxSlices] = {};

  State(DeviceCommunicator& comm, const Problem& problem, const Parts& parts)
      : w(parts), x(comm, problem, /*group=*/0, parts.exchange, problem.head_slices), table(table_plan(problem)) {
    if (problem.head_slices == 1) return;
    THDCP_CHECK(problem.head_slices <= kMaxSlices,
                "head_slices=" << problem.head_slices << ": at most " << kMaxSlices << " slices");
    int least = 0, greatest = 0;
    THDCP_CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    THDCP_CHECK_CUDA(cudaStreamCreateWithPriority(&side, cudaStreamNonBlocking, greatest));
    for (cudaEvent_t* e : {&fork, &join}) THDCP_CHECK_CUDA(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    for (int i = 0; i < problem.head_slices; ++i) {
      THDCP_CHECK_CUDA(cudaEventCreateWithFlags(&in[i], cudaEventDisableTiming));
      THDCP_CHECK_CUDA(cudaEventCreateWithFlags(&done[i], cudaEventDisableTiming));
    }
  }
  ~State() {
    for (cudaEvent_t e : in) if (e) cudaEventDestroy(e);
    for (cudaEvent_t e : done) if (e) cudaEventDestroy(e);
    if (fork) cudaEventDestroy(fork);
    if (join) cudaEventDestroy(join);
    if (side) cudaStreamDestroy(side);
  }
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  int slices() const { return x.slices(); }

  // What both passes start with: the step's layout and stream, and the single-device table
  // (attention runs over whole documents), timed as the table phase; the exchanges of the
  // inputs follow, on `side` where there are slices (returned: the exchanges' stream).
  cudaStream_t start(const DeviceLayout& layout, cudaStream_t stream, const PhaseMark& mark,
                     cuda::DeviceSegmentTable& built) {
    cudaStream_t exchanges = stream;
    if (slices() > 1) {
      THDCP_CHECK_CUDA(cudaEventRecord(fork, stream));  // the caller's inputs and layout are ready
      THDCP_CHECK_CUDA(cudaStreamWaitEvent(side, fork, 0));
      exchanges = side;
    }
    x.start(layout, exchanges);
    mark(Phase::kTable);
    built = table.run(layout, w.segments, stream);
    mark(Phase::kGather);
    return exchanges;
  }
  // Each event is recorded where its slice's work was just enqueued and waited for where the
  // dependent work is about to be: slice i's inputs are exchanged (on `side`) ...
  void inputs_exchanged(int i) {
    if (slices() > 1) THDCP_CHECK_CUDA(cudaEventRecord(in[i], side));
  }
  // ... before its attention (on the step's stream) ...
  void before_attention(int i, cudaStream_t stream) {
    if (slices() > 1) THDCP_CHECK_CUDA(cudaStreamWaitEvent(stream, in[i], 0));
  }
  // ... which is done ...
  void attention_done(int i, cudaStream_t stream) {
    if (slices() > 1) THDCP_CHECK_CUDA(cudaEventRecord(done[i], stream));
  }
  // ... before its results go back (on `side`).
  void before_return(int i) {
    if (slices() > 1) THDCP_CHECK_CUDA(cudaStreamWaitEvent(side, done[i], 0));
  }
  // The step's stream follows every exchange.
  void finish(cudaStream_t stream) {
    if (slices() == 1) return;
    THDCP_CHECK_CUDA(cudaEventRecord(join, side));
    THDCP_CHECK_CUDA(cudaStreamWaitEvent(stream, join, 0));
  }
};

size_t CudaAllToAll::workspace_size(const Problem& problem, const AttentionOptions& options) {
  WorkspaceCarver sizing;
  carve(sizing, problem, options);
  return sizing.bytes();
}

CudaAllToAll::CudaAllToAll(DeviceCommunicator& comm, const Problem& problem, const AttentionOptions& options,
                           void* workspace, size_t workspace_bytes) {
  THDCP_CHECK(problem.comm == CpComm::kAllToAll, "CudaAllToAll: comm=" << cp_comm_name(problem.comm));
  const size_t needed = workspace_size(problem, options);
  THDCP_CHECK(workspace_bytes >= needed,
              "workspace has " << workspace_bytes << " bytes; cuda_workspace_size gives " << needed);
  WorkspaceCarver carver(workspace);
  s_ = std::make_unique<State>(comm, problem, carve(carver, problem, options));
  const cuda::AttentionShape shape = head_shape(problem);
  // The plans check dtype, head dims, kernel family and their workspaces.
  s_->forward = std::make_unique<cuda::ForwardPlan>(shape, options, s_->w.forward, s_->w.forward_bytes);
  s_->backward = std::make_unique<cuda::BackwardPlan>(shape, options, s_->w.backward, s_->w.backward_bytes);
}

CudaAllToAll::~CudaAllToAll() = default;

// Slice by slice: every slice's inputs are exchanged first (on the exchanges' stream, in
// order), each slice's attention waits for its own, and each slice's results go back once its
// attention is done; with one slice all of it runs on the step's stream in that order.
void CudaAllToAll::forward(const DeviceLayout& layout, const ForwardTensors& t, cudaStream_t stream,
                           const PhaseMark& mark) {
  State& s = *s_;
  cuda::DeviceSegmentTable table;
  s.start(layout, stream, mark, table);
  ForwardTensors h[kMaxSlices];
  for (int i = 0; i < s.slices(); ++i) {
    h[i] = s.x.forward_to_heads(t, i);
    s.inputs_exchanged(i);
  }
  mark(Phase::kAttention);
  for (int i = 0; i < s.slices(); ++i) {
    s.before_attention(i, stream);
    s.forward->run(table, h[i], stream);
    s.attention_done(i, stream);
  }
  mark(Phase::kReduce);
  for (int i = 0; i < s.slices(); ++i) {
    s.before_return(i);
    s.x.forward_to_rows(h[i], t, i);
  }
  s.x.gather_max_logit(t);
  s.finish(stream);
  mark(Phase::kCount);
}

void CudaAllToAll::backward(const DeviceLayout& layout, const BackwardTensors& t, cudaStream_t stream,
                            KvSource kv, const PhaseMark& mark) {
  State& s = *s_;
  cuda::DeviceSegmentTable table;
  s.start(layout, stream, mark, table);
  BackwardTensors h[kMaxSlices];
  for (int i = 0; i < s.slices(); ++i) {
    h[i] = s.x.backward_to_heads(t, DType::kFloat32, kv == KvSource::kFromForward, i);
    s.inputs_exchanged(i);
  }
  mark(Phase::kAttention);
  for (int i = 0; i < s.slices(); ++i) {
    s.before_attention(i, stream);
    s.backward->run(table, h[i], stream);
    s.attention_done(i, stream);
  }
  mark(Phase::kReduce);
  for (int i = 0; i < s.slices(); ++i) {
    s.before_return(i);
    s.x.backward_to_rows(h[i], t, i);
  }
  s.x.gather_dsinks(t);
  s.finish(stream);
  mark(Phase::kCount);
}

}  // namespace thdcp::cp::detail
