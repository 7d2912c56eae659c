// Helpers of the GPU tests: skipping without a device, owned device buffers and tensors,
// a stream of the test's own.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "thdcp/comm/communicator.h"
#include "thdcp/core/cuda_check.h"
#include "thdcp/core/tensor.h"
#include "thdcp/testing/device_buffer.h"

namespace thdcp::test {

// Every GPU test derives from this fixture: without a usable device the test is reported
// as skipped, with the reason, never as passed.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override;
};

// GPU tests of 2 or more GPUs: skipped with the reason below 2; gpus_ GPUs visible.
class MultiGpuTest : public CudaTest {
 protected:
  void SetUp() override;
  int gpus_ = 0;
};

using cuda::DeviceBuffer;

// A device copy of a host tensor, and views of it.
struct DeviceTensor {
  DeviceBuffer buffer;
  DType dtype = DType::kBFloat16;
  int64_t tokens = 0, heads = 0, head_dim = 0;

  DeviceTensor() = default;
  DeviceTensor(DType dtype_, int64_t tokens_, int64_t heads_, int64_t head_dim_)
      : buffer(static_cast<size_t>(tokens_ * heads_ * head_dim_) * dtype_size(dtype_)), dtype(dtype_),
        tokens(tokens_), heads(heads_), head_dim(head_dim_) {}
  explicit DeviceTensor(const HostTensor& host)
      : DeviceTensor(host.dtype(), host.tokens(), host.heads(), host.head_dim()) {
    buffer.upload(host.data(), bytes());
  }
  size_t bytes() const { return static_cast<size_t>(tokens * heads * head_dim) * dtype_size(dtype); }
  ThdTensor view() { return ThdTensor{buffer.data(), dtype, tokens, heads, head_dim}; }
  ConstThdTensor cview() const { return ConstThdTensor(buffer.data(), dtype, tokens, heads, head_dim); }
  HostTensor download() const {
    HostTensor host(dtype, tokens, heads, head_dim);
    buffer.download(host.data(), bytes());
    return host;
  }
};

template <typename T>
std::vector<T> download_vector(const DeviceBuffer& buffer, size_t count) {
  std::vector<T> host(count);
  buffer.download(host.data(), count * sizeof(T));
  return host;
}

// A stream of the test's own (non-blocking: the legacy stream does not order it).
class Stream {
 public:
  Stream() { THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() { (void)cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// The GPUs this process sees and the fewest that any process of `world` sees (0 where CUDA
// cannot start): a collective, so every rank takes the same decision from `fewest` and none
// waits in a collective for one that left.
struct VisibleGpus {
  int here = 0;
  int fewest = 0;
};
VisibleGpus visible_gpus(Communicator& world);

// The GPU of this process among `gpus`: nccl::device_for_local_rank of the local rank its
// launcher gives (mpirun, srun), or of `fallback_rank` where it gives none.
int launched_device(int fallback_rank, int gpus);

}  // namespace thdcp::test
