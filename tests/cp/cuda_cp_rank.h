// One CP rank on the GPU for tests: static device buffers of a capacity (the rank's local
// tensors, the global layout arrays, outputs, workspace), a CudaPlan over them, and the
// steps a test runs on them (upload a batch, enqueue forward + backward, download).
#pragma once

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda/cuda_test_support.h"
#include "support/cp_check.h"
#include "thdcp/cp/cuda.h"
#include "thdcp/testing/thread_barrier.h"
#include "thdcp/plan/rank_split.h"

namespace thdcp::test {

struct RankOutputs {
  HostTensor out, dq, dk, dv;
  std::vector<float> lse, max_logit;
};

inline bool same_bits(const HostTensor& a, const HostTensor& b) {
  const size_t bytes = static_cast<size_t>(a.numel()) * dtype_size(a.dtype());
  return a.numel() == b.numel() && a.dtype() == b.dtype() && std::memcmp(a.data(), b.data(), bytes) == 0;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every output of `a` equals `b` bit for bit; names the first that does not.
inline ::testing::AssertionResult identical(const RankOutputs& a, const RankOutputs& b) {
  if (!same_bits(a.out, b.out)) return ::testing::AssertionFailure() << "out differs";
  if (!same_bits(a.lse, b.lse)) return ::testing::AssertionFailure() << "lse differs";
  if (!same_bits(a.max_logit, b.max_logit)) return ::testing::AssertionFailure() << "max_logit differs";
  if (!same_bits(a.dq, b.dq)) return ::testing::AssertionFailure() << "dq differs";
  if (!same_bits(a.dk, b.dk)) return ::testing::AssertionFailure() << "dk differs";
  if (!same_bits(a.dv, b.dv)) return ::testing::AssertionFailure() << "dv differs";
  return ::testing::AssertionSuccess();
}

class CudaCpRank {
 public:
  CudaCpRank(DeviceCommunicator& comm, const cp::Problem& problem, const AttentionOptions& options = {})
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
  ~CudaCpRank() { cudaStreamDestroy(stream_); }

  cudaStream_t stream() const { return stream_; }
  cp::CudaPlan& plan() { return *plan_; }

  // Copies this rank's part of a batch (layout in capacity form) into the static buffers and
  // poisons the outputs, on this rank's stream, complete on return: never during a capture.
  void load(const Batch& b) {
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

  DeviceLayout layout() const { return DeviceLayout{cu_.as<int32_t>(), cup_.as<int32_t>(), problem_.capacity}; }
  // The static q and k buffers, writable (e.g. to apply RoPE in place before a step).
  ThdTensor q() { return q_.view(); }
  ThdTensor k() { return k_.view(); }
  ForwardTensors forward_tensors() {
    return ForwardTensors{q_.cview(), k_.cview(), v_.cview(), out_.view(), lse_.as<float>(), max_logit_.as<float>()};
  }
  BackwardTensors backward_tensors() {
    return BackwardTensors{q_.cview(), k_.cview(), v_.cview(), out_.cview(), dout_.cview(),
                               lse_.as<float>(), dq_.view(), dk_.view(), dv_.view()};
  }

  // Enqueues forward then backward on `stream` (capture-safe).
  void step(cudaStream_t stream, cp::KvSource kv = cp::KvSource::kGather) {
    plan_->forward(layout(), forward_tensors(), stream);
    plan_->backward(layout(), backward_tensors(), stream, kv);
  }

  RankOutputs download() {
    comm_.synchronize(stream_, 120);
    THDCP_CHECK_CUDA(cudaDeviceSynchronize());
    RankOutputs r;
    r.out = out_.download();
    r.dq = dq_.download();
    r.dk = dk_.download();
    r.dv = dv_.download();
    r.lse = download_vector<float>(lse_, static_cast<size_t>(problem_.q_heads * rows_));
    r.max_logit = download_vector<float>(max_logit_, static_cast<size_t>(problem_.q_heads));
    return r;
  }

 private:
  DeviceCommunicator& comm_;
  cp::Problem problem_;
  int64_t rows_;
  DeviceTensor q_, k_, v_, dout_, out_, dq_, dk_, dv_;
  DeviceBuffer lse_, max_logit_, cu_, cup_, workspace_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cp::CudaPlan> plan_;
};

using thdcp::ThreadBarrier;


}  // namespace thdcp::test
