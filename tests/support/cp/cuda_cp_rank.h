// One CP rank on the GPU for tests: static device buffers of a capacity (the rank's local
// tensors, the global layout arrays, outputs, workspace), a CudaPlan over them, and the
// steps a test runs on them (upload a batch, enqueue forward + backward, download).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "support/cp_check.h"
#include "support/cuda/cuda_test.h"
#include "support/cuda/device_step.h"
#include "thdcp/cp/cuda.h"
#include "thdcp/plan/rank_split.h"
#include "thdcp/comm/thread_barrier.h"

namespace thdcp::test {

class CudaCpRank {
 public:
  CudaCpRank(DeviceCommunicator& comm, const cp::Problem& problem, const AttentionOptions& options = {});
  ~CudaCpRank() { cudaStreamDestroy(stream_); }

  cudaStream_t stream() const { return stream_; }
  cp::CudaPlan& plan() { return *plan_; }

  // Copies this rank's part of a batch (layout in capacity form) into the static buffers and
  // poisons the outputs, on this rank's stream, complete on return: never during a capture.
  void load(const Batch& b);

  DeviceLayout layout() const { return DeviceLayout{cu_.as<int32_t>(), cup_.as<int32_t>(), problem_.capacity}; }
  // The static q and k buffers, writable (e.g. to apply RoPE in place before a step).
  ThdTensor q() { return tensors_.q.view(); }
  ThdTensor k() { return tensors_.k.view(); }
  ForwardTensors forward_tensors() { return tensors_.forward_tensors(); }
  BackwardTensors backward_tensors() { return tensors_.backward_tensors(); }

  // Enqueues forward then backward on `stream` (capture-safe), with attention sinks where
  // `sinks` (device [Hq] fp32) is given, and their gradient into `dsinks` (device [Hq] fp32)
  // where that is given too.
  void step(cudaStream_t stream, cp::KvSource kv = cp::KvSource::kGather, const float* sinks = nullptr,
            float* dsinks = nullptr);

  Outputs download();

  // load(b), step on this rank's stream, download(): one eager step of `b`.
  Outputs run(const Batch& b, cp::KvSource kv = cp::KvSource::kGather);

 private:
  DeviceCommunicator& comm_;
  cp::Problem problem_;
  DeviceStep tensors_;
  DeviceBuffer cu_, cup_;
  size_t workspace_bytes_ = 0;
  std::shared_ptr<void> workspace_;  // cp::cuda_workspace_memory's
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cp::CudaPlan> plan_;
};

using thdcp::ThreadBarrier;

}  // namespace thdcp::test
