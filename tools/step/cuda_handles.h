// Streams and events owned by the tool's code, destroyed with the object.
#pragma once

#include <cuda_runtime_api.h>

#include "thdcp/core/cuda_check.h"

namespace thdcp::tools {

// An owned CUDA handle.
template <typename Handle, cudaError_t (*destroy)(Handle)>
class Owned {
 public:
  explicit Owned(Handle handle) : handle_(handle) {}
  ~Owned() {
    if (handle_) destroy(handle_);
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  Handle get() const { return handle_; }

 private:
  Handle handle_;
};

// A non-blocking stream of the current device.
class Stream : public Owned<cudaStream_t, cudaStreamDestroy> {
 public:
  Stream() : Owned(create()) {}

 private:
  static cudaStream_t create() {
    cudaStream_t stream = nullptr;
    THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    return stream;
  }
};

// A CUDA event, with timing unless `timing` is false.
class Event : public Owned<cudaEvent_t, cudaEventDestroy> {
 public:
  explicit Event(bool timing = true) : Owned(create(timing)) {}

 private:
  static cudaEvent_t create(bool timing) {
    cudaEvent_t event = nullptr;
    THDCP_CHECK_CUDA(cudaEventCreateWithFlags(&event, timing ? cudaEventDefault : cudaEventDisableTiming));
    return event;
  }
};

}  // namespace thdcp::tools
