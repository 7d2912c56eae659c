#include "support/cp/cuda_cp_rank.h"

#include <utility>

namespace thdcp::test {

CudaCpRank::CudaCpRank(DeviceCommunicator& comm, const cp::Problem& problem, const AttentionOptions& options)
    : comm_(comm),
      problem_(problem),
      tensors_(problem.dtype, problem.local_rows(), problem.local_rows(), problem.heads(), problem.dtype),
      cu_(sizeof(int32_t) * static_cast<size_t>(problem.capacity.max_seqs + 1)),
      cup_(sizeof(int32_t) * static_cast<size_t>(problem.capacity.max_seqs + 1)),
      workspace_bytes_(cp::cuda_workspace_size(problem, options)),
      workspace_(cp::cuda_workspace_memory(comm, workspace_bytes_)) {
  THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  plan_ = std::make_unique<cp::CudaPlan>(comm, problem, options, workspace_.get(), workspace_bytes_);
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
  for (auto [to, from] : {std::make_pair(&tensors_.q, &b.q), std::make_pair(&tensors_.k, &b.k),
                          std::make_pair(&tensors_.v, &b.v), std::make_pair(&tensors_.dout, &b.dout)}) {
    to->buffer.upload(local_part(*from, layout, cp, rank, problem_.layout).data(), to->bytes(), stream_);
  }
  cu_.upload(b.layout.cu_seqlens.data(), cu_.bytes(), stream_);
  cup_.upload(b.layout.cu_seqlens_padded.data(), cup_.bytes(), stream_);
  tensors_.poison_outputs(stream_);
}

void CudaCpRank::step(cudaStream_t stream, cp::KvSource kv, const float* sinks, float* dsinks) {
  ForwardTensors forward = forward_tensors();
  BackwardTensors backward = backward_tensors();
  forward.sinks = backward.sinks = sinks;
  backward.dsinks = dsinks;
  plan_->forward(layout(), forward, stream);
  plan_->backward(layout(), backward, stream, kv);
}

Outputs CudaCpRank::download() {
  comm_.synchronize(stream_, 120);
  THDCP_CHECK_CUDA(cudaDeviceSynchronize());
  return tensors_.download_outputs();
}

Outputs CudaCpRank::run(const Batch& b, cp::KvSource kv) {
  load(b);
  step(stream_, kv);
  return download();
}

}  // namespace thdcp::test
