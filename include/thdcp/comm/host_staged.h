// A communicator for device buffers built on a host communicator: each collective copies
// the device input to the host, runs the host collective, and copies the result back.
//
// It synchronises `stream` in every collective, so it cannot be captured in a CUDA graph:
// it exists for tests and single-process runs that put several CP ranks on one GPU (threads
// of one process, joined by thdcp::run_in_process). Across GPUs and processes the
// stream-ordered NCCL communicator is the one to use.
#pragma once

#include <vector>

#include <cuda_runtime_api.h>

#include "thdcp/comm/communicator.h"

namespace thdcp::cuda {

class HostStagedCommunicator final : public Communicator {
 public:
  HostStagedCommunicator(Communicator& host, cudaStream_t stream) : host_(host), stream_(stream) {}

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  const char* kind() const override { return "in-process, host-staged"; }

  void all_gather(const void* send, void* recv, size_t bytes) override;
  void reduce_scatter_sum(const float* send, float* recv, size_t count) override;
  void all_reduce_max(float* data, size_t count) override;

 private:
  Communicator& host_;
  cudaStream_t stream_;
  std::vector<unsigned char> send_, recv_;
};

}  // namespace thdcp::cuda
