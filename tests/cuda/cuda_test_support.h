// Helpers of the GPU tests: skipping without a device, owned device buffers, NaN poisoning.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "thdcp/core/cuda_check.h"
#include "thdcp/testing/device_buffer.h"
#include "thdcp/core/tensor.h"

namespace thdcp::test {

// Every GPU test derives from this fixture: without a usable device the test is reported
// as skipped, with the reason, never as passed.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      GTEST_SKIP() << "no CUDA device: cudaGetDeviceCount failed with " << cudaGetErrorName(status) << " ("
                   << cudaGetErrorString(status) << ")";
    }
    if (count == 0) GTEST_SKIP() << "no CUDA device: cudaGetDeviceCount reports 0 devices";
  }
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

}  // namespace thdcp::test
