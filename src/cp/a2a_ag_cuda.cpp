#include "a2a_ag_cuda.h"

#include "agreement.h"
#include "window_cuda.h"
#include "thdcp/core/error.h"
#include "thdcp/core/workspace.h"
#include "thdcp/cuda/check.h"

namespace thdcp::cp::detail {

namespace {

struct Parts {
  ExchangeParts exchange;
  void* across = nullptr;
  size_t across_bytes = 0;
};

Parts carve(WorkspaceCarver& carver, const Problem& p, const AttentionOptions& options) {
  Parts w;
  w.exchange = carve_exchange(carver, p, p.a2a_size);
  w.across_bytes = cuda_workspace_size(a2a_ag_across(p), options);
  w.across = carver.take(w.across_bytes);
  return w;
}

}  // namespace

size_t CudaA2aAg::workspace_size(const Problem& problem, const AttentionOptions& options) {
  WorkspaceCarver sizing;
  carve(sizing, problem, options);
  return sizing.bytes();
}

CudaA2aAg::CudaA2aAg(DeviceCommunicator& comm, const Problem& problem, const AttentionOptions& options,
                     void* workspace, size_t workspace_bytes)
    : group_(comm.rank() / problem.a2a_size) {
  THDCP_CHECK(problem.comm == CpComm::kA2aAg, "CudaA2aAg: comm=" << cp_comm_name(problem.comm));
  const size_t needed = workspace_size(problem, options);
  THDCP_CHECK(workspace_bytes >= needed,
              "workspace has " << workspace_bytes << " bytes; cuda_workspace_size gives " << needed);
  const int member = comm.rank() % problem.a2a_size;
  a2a_ = comm.split(/*color=*/group_, /*key=*/member);
  ag_ = comm.split(/*color=*/member, /*key=*/group_);
  // Connections made lazily (NCCL) are made now, not inside a step that may be captured.
  cudaStream_t stream = nullptr;
  THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  try {
    a2a_->warm_up(stream);
    ag_->warm_up(stream);
  } catch (...) {
    cudaStreamDestroy(stream);
    throw;
  }
  THDCP_CHECK_CUDA(cudaStreamDestroy(stream));
  WorkspaceCarver carver(workspace);
  const Parts parts = carve(carver, problem, options);
  window_ = workspace_window(*a2a_, workspace, workspace_bytes);  // the exchange's (the AllGather plan makes its own)
  exchange_ = std::make_unique<CudaHeadExchange>(*a2a_, problem, group_, parts.exchange);
  across_ = std::make_unique<CudaPlan>(*ag_, a2a_ag_across(problem), options, parts.across, parts.across_bytes);
}

CudaA2aAg::~CudaA2aAg() = default;

// The exchange's start, timed from a table mark (a step's first; the AllGather plan builds
// its own table, timed with its attention).
void CudaA2aAg::start(const DeviceLayout& layout, cudaStream_t stream, const PhaseMark& mark) {
  exchange_->start(layout, stream);
  mark(Phase::kTable);
  mark(Phase::kGather);
}

void CudaA2aAg::forward(const DeviceLayout& layout, const ForwardTensors& t, cudaStream_t stream,
                        const PhaseMark& mark) {
  start(layout, stream, mark);
  const ForwardTensors h = exchange_->forward_to_heads(t);
  mark(Phase::kAttention);  // the AllGather plan's table, gathers and reductions included
  across_->forward(layout, h, stream);
  mark(Phase::kReduce);
  exchange_->forward_to_rows(h, t);
  exchange_->gather_max_logit(t);
  mark(Phase::kCount);
}

void CudaA2aAg::backward(const DeviceLayout& layout, const BackwardTensors& t, cudaStream_t stream, KvSource kv,
                         const PhaseMark& mark) {
  start(layout, stream, mark);
  // dq in the problem's dtype, as the AllGather plan writes it (whole on each rank, rounded
  // once there; the way back only moves it); dk, dv in fp32, rounded once before the way back
  // (the AllGather plan reduce-scatters them in fp32, and its fp32 cast is exact). Kept: the
  // forward's head-sharded tensors, and the AllGather plan's own gathered K/V.
  const BackwardTensors h = exchange_->backward_to_heads(t, t.dq.dtype, kv == KvSource::kFromForward);
  mark(Phase::kAttention);
  across_->backward(layout, h, stream, kv);
  mark(Phase::kReduce);
  exchange_->backward_to_rows(h, t);
  exchange_->gather_dsinks(t);
  mark(Phase::kCount);
}

}  // namespace thdcp::cp::detail
