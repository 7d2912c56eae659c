// An owned device allocation, for tools and tests (the library itself never allocates on a
// run path: callers size workspaces up front and pass them in).
#pragma once

#include <cstddef>
#include <utility>

#include <cuda_runtime_api.h>

#include "thdcp/core/cuda_check.h"

namespace thdcp::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes_ > 0) THDCP_CHECK_CUDA(cudaMalloc(&data_, bytes_));
  }
  ~DeviceBuffer() {
    if (data_) cudaFree(data_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept : data_(other.data_), bytes_(other.bytes_) {
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

  // Synchronous copies of `bytes` bytes from/to host memory.
  void upload(const void* host, size_t bytes) {
    if (bytes) THDCP_CHECK_CUDA(cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice));
  }
  void download(void* host, size_t bytes) const {
    if (bytes) THDCP_CHECK_CUDA(cudaMemcpy(host, data_, bytes, cudaMemcpyDeviceToHost));
  }
  // Every byte 0xff: NaN in fp32, fp16 and bf16, so an unwritten element cannot pass a check.
  void poison() {
    if (bytes_) THDCP_CHECK_CUDA(cudaMemset(data_, 0xff, bytes_));
  }

  // The same, ordered on `stream` and complete when they return. cudaMemcpy and cudaMemset
  // run on the legacy default stream, which work on a cudaStreamNonBlocking stream does not
  // wait for: a copy from pageable memory may still be in flight when cudaMemcpy returns,
  // and cudaMemset to device memory is asynchronous; these cannot race a later launch on
  // `stream`.
  void upload(const void* host, size_t bytes, cudaStream_t stream) {
    if (bytes) THDCP_CHECK_CUDA(cudaMemcpyAsync(data_, host, bytes, cudaMemcpyHostToDevice, stream));
    THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
  }
  void poison(cudaStream_t stream) {
    if (bytes_) THDCP_CHECK_CUDA(cudaMemsetAsync(data_, 0xff, bytes_, stream));
    THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace thdcp::cuda
