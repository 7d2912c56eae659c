#include "alltoall_cuda.h"

#include "thdcp/core/error.h"
#include "thdcp/core/workspace.h"
#include "thdcp/cuda/attention.h"
#include "thdcp/cuda/check.h"
#include "thdcp/cuda/table.h"

namespace thdcp::cp::detail {

namespace {

cuda::TablePlan table_plan(const Problem& p) { return cuda::TablePlan::single_device(p.capacity, p.mask); }

// This rank's share of the heads over every row: the single-device kernels' shape, with
// fp32 gradients (rounded once, on the way back to the rank's rows).
cuda::AttentionShape head_shape(const Problem& p) {
  cuda::AttentionShape s;
  s.q_heads = p.q_heads / p.cp;
  s.kv_heads = p.kv_heads / p.cp;
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

struct CudaAllToAll::State {
  Parts w;
  CudaHeadExchange x;
  cuda::TablePlan table;
  std::unique_ptr<cuda::ForwardPlan> forward;
  std::unique_ptr<cuda::BackwardPlan> backward;

  State(DeviceCommunicator& comm, const Problem& problem, const Parts& parts)
      : w(parts), x(comm, problem, /*group=*/0, parts.exchange), table(table_plan(problem)) {}

  // What both passes start with: the step's layout and stream, and the single-device table
  // (attention runs over whole documents), timed as the table phase; the exchanges of the
  // inputs follow.
  cuda::DeviceSegmentTable start(const DeviceLayout& layout, cudaStream_t stream, const PhaseMark& mark) {
    x.start(layout, stream);
    mark(Phase::kTable);
    const cuda::DeviceSegmentTable built = table.run(layout, w.segments, stream);
    mark(Phase::kGather);
    return built;
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

void CudaAllToAll::forward(const DeviceLayout& layout, const ForwardTensors& t, cudaStream_t stream,
                           const PhaseMark& mark) {
  State& s = *s_;
  const cuda::DeviceSegmentTable table = s.start(layout, stream, mark);
  const ForwardTensors h = s.x.forward_to_heads(t);
  mark(Phase::kAttention);
  s.forward->run(table, h, stream);
  mark(Phase::kReduce);
  s.x.forward_to_rows(h, t);
  mark(Phase::kCount);
}

void CudaAllToAll::backward(const DeviceLayout& layout, const BackwardTensors& t, cudaStream_t stream,
                            KvSource kv, const PhaseMark& mark) {
  State& s = *s_;
  const cuda::DeviceSegmentTable table = s.start(layout, stream, mark);
  const BackwardTensors h = s.x.backward_to_heads(t, DType::kFloat32, kv == KvSource::kFromForward);
  mark(Phase::kAttention);
  s.backward->run(table, h, stream);
  mark(Phase::kReduce);
  s.x.backward_to_rows(h, t);
  mark(Phase::kCount);
}

}  // namespace thdcp::cp::detail
