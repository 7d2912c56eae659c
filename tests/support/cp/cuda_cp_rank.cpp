#include "support/cp/cuda_cp_rank.h"

namespace thdcp::test {

CudaCpRank::CudaCpRank(DeviceCommunicator& comm, const cp::Problem& problem, const AttentionOptions& options)
    : comm_(comm),
      problem_(problem),
      rows_(problem.local_rows()),
      q_(problem.dtype, rows_, problem.q_heads, problem.head_dim),
      k_(problem.dtype, rows_, problem.kv_heads, problem.head_dim),
      v_(problem.dtype, rows_, problem.kv_heads, problem.head_dim),
      dout_(problem.dtype, rows_, problem.q_heads, problem.head_dim),
      out_(problem.dtype, rows_, problem.q_heads, problem.head_dim),
      dq_(problem.dtype, rows_, problem.q_heads, problem.head_dim),
      dk_(problem.dtype, rows_, problem.kv_heads, problem.head_dim),
      dv_(problem.dtype, rows_, problem.kv_heads, problem.head_dim),
      lse_(sizeof(float) * static_cast<size_t>(problem.q_heads * rows_)),
      max_logit_(sizeof(float) * static_cast<size_t>(problem.q_heads)),
      cu_(sizeof(int32_t) * static_cast<size_t>(problem.capacity.max_seqs + 1)),
      cup_(sizeof(int32_t) * static_cast<size_t>(problem.capacity.max_seqs + 1)),
      workspace_(cp::cuda_workspace_size(problem, options)) {
  THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  plan_ = std::make_unique<cp::CudaPlan>(comm, problem, options, workspace_.data(), workspace_.bytes());
  const ForwardTensors forward = forward_tensors();
  const BackwardTensors backward = backward_tensors();
  plan_->check_tensors(layout(), &forward, &backward);  // the static buffers, once
}

void CudaCpRank::load(const Batch& b) {
  const LayoutView layout = b.layout.view();
  THDCP_CHECK(layout.num_seqs == problem_.capacity.max_seqs && layout.total_rows() == problem_.capacity.max_tokens,
              "test batch is not in the plan's capacity form");
  const int cp = comm_.size(), rank = comm_.rank();
  // On this rank's stream, complete on return (see DeviceBuffer::upload(..., stream)).
  q_.buffer.upload(local_part(b.q, layout, cp, rank).data(), q_.bytes(), stream_);
  k_.buffer.upload(local_part(b.k, layout, cp, rank).data(), k_.bytes(), stream_);
  v_.buffer.upload(local_part(b.v, layout, cp, rank).data(), v_.bytes(), stream_);
  dout_.buffer.upload(local_part(b.dout, layout, cp, rank).data(), dout_.bytes(), stream_);
  cu_.upload(b.layout.cu_seqlens.data(), cu_.bytes(), stream_);
  cup_.upload(b.layout.cu_seqlens_padded.data(), cup_.bytes(), stream_);
  for (DeviceBuffer* p : {&out_.buffer, &dq_.buffer, &dk_.buffer, &dv_.buffer, &lse_, &max_logit_}) p->poison(stream_);
}

ForwardTensors CudaCpRank::forward_tensors() {
  return ForwardTensors{q_.cview(), k_.cview(), v_.cview(), out_.view(), lse_.as<float>(), max_logit_.as<float>()};
}
BackwardTensors CudaCpRank::backward_tensors() {
  return BackwardTensors{q_.cview(),       k_.cview(), v_.cview(), out_.cview(), dout_.cview(),
                         lse_.as<float>(), dq_.view(), dk_.view(), dv_.view()};
}

void CudaCpRank::step(cudaStream_t stream, cp::KvSource kv) {
  plan_->forward(layout(), forward_tensors(), stream);
  plan_->backward(layout(), backward_tensors(), stream, kv);
}

Outputs CudaCpRank::download() {
  comm_.synchronize(stream_, 120);
  THDCP_CHECK_CUDA(cudaDeviceSynchronize());
  Outputs r;
  r.out = out_.download();
  r.dq = dq_.download();
  r.dk = dk_.download();
  r.dv = dv_.download();
  r.lse = download_vector<float>(lse_, static_cast<size_t>(problem_.q_heads * rows_));
  r.max_logit = download_vector<float>(max_logit_, static_cast<size_t>(problem_.q_heads));
  return r;
}

}  // namespace thdcp::test
