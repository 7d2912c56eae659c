#include "a2a_ag_cuda.h"

#include "thdcp/core/error.h"
#include "thdcp/core/workspace.h"
#include "thdcp/cuda/check.h"

namespace thdcp::cp::detail {

namespace {

// The AllGather CP across the groups: ag_size ranks, this member's share of the heads, the
// problem's layout, mask, capacity and kv_gather.
Problem across_problem(const Problem& p) {
  Problem across = p;
  across.cp = p.cp / p.a2a_size;
  across.q_heads = p.q_heads / p.a2a_size;
  across.kv_heads = p.kv_heads / p.a2a_size;
  across.comm = CpComm::kAllGather;
  across.a2a_size = 1;
  return across;
}

struct Parts {
  ExchangeParts exchange;
  void* across = nullptr;
  size_t across_bytes = 0;
};

Parts carve(WorkspaceCarver& carver, const Problem& p, const AttentionOptions& options) {
  Parts w;
  w.exchange = carve_exchange(carver, p, p.a2a_size);
  w.across_bytes = cuda_workspace_size(across_problem(p), options);
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
    : problem_(problem), group_(comm.rank() / problem.a2a_size) {
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
  parts_ = parts.exchange;
  exchange_ = std::make_unique<CudaHeadExchange>(*a2a_, problem, group_, parts_);
  across_ = std::make_unique<CudaPlan>(*ag_, across_problem(problem), options, parts.across, parts.across_bytes);
}

CudaA2aAg::~CudaA2aAg() = default;

void CudaA2aAg::forward(const DeviceLayout& layout, const ForwardTensors& t, cudaStream_t stream,
                        const PhaseMark& mark) {
  CudaHeadExchange& x = *exchange_;
  const ExchangeParts& w = parts_;
  x.start(layout, stream);
  mark(Phase::kTable);  // (a step's first mark; the AllGather plan builds its table itself)
  mark(Phase::kGather);
  const ConstThdTensor q = x.to_heads(t.q, w.q), k = x.to_heads(t.k, w.k), v = x.to_heads(t.v, w.v);
  mark(Phase::kAttention);  // the AllGather plan's own table, gathers and reductions included
  const ThdTensor out = x.dense(w.out, problem_.dtype, x.q_heads(), problem_.value_head_dim());
  const int64_t first_head = x.member() * x.q_heads();
  across_->forward(layout,
                   ForwardTensors{q, k, v, out, w.lse, t.max_logit ? w.max_logit : nullptr,
                                  t.sinks ? t.sinks + first_head : nullptr},
                   stream);
  mark(Phase::kReduce);
  x.to_rows(out, t.out);
  x.lse_to_rows(w.lse, t.lse);
  // Each head's max_logit is whole (max-reduced over the groups) on the member that owns it.
  if (t.max_logit) a2a_->all_gather(w.max_logit, t.max_logit, static_cast<size_t>(x.q_heads()) * sizeof(float), stream);
  mark(Phase::kCount);
}

void CudaA2aAg::backward(const DeviceLayout& layout, const BackwardTensors& t, cudaStream_t stream,
                         const PhaseMark& mark) {
  CudaHeadExchange& x = *exchange_;
  const ExchangeParts& w = parts_;
  x.start(layout, stream);
  mark(Phase::kTable);  // (a step's first mark; the AllGather plan builds its table itself)
  mark(Phase::kGather);
  // dq, dk, dv in fp32: rounded once, on the way back (the AllGather plan reduce-scatters dk
  // and dv in fp32, and its fp32 cast is exact).
  BackwardTensors h = x.backward_to_heads(t);
  h.sinks = t.sinks ? t.sinks + x.member() * x.q_heads() : nullptr;
  h.dsinks = t.dsinks ? w.dsinks : nullptr;
  mark(Phase::kAttention);
  across_->backward(layout, h, stream);
  mark(Phase::kReduce);
  x.to_rows(h.dq, t.dq);
  x.to_rows(h.dk, t.dk);
  x.to_rows(h.dv, t.dv);
  // Each head's d(sink) is whole (summed over the groups) on the member that owns it.
  if (t.dsinks) a2a_->all_gather(w.dsinks, t.dsinks, static_cast<size_t>(x.q_heads()) * sizeof(float), stream);
  mark(Phase::kCount);
}

}  // namespace thdcp::cp::detail
