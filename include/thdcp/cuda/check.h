// THDCP_CHECK_CUDA: turns a failed CUDA runtime call into thdcp::Error, naming the call,
// the CUDA error and the location (like TransformerEngine's NVTE_CHECK_CUDA).
#pragma once

#include <cuda_runtime_api.h>

#include "thdcp/core/error.h"

#define THDCP_CHECK_CUDA(expr)                                                                   \
  do {                                                                                           \
    const cudaError_t thdcp_cuda_status_ = (expr);                                               \
    if (thdcp_cuda_status_ != cudaSuccess) {                                                     \
      std::ostringstream thdcp_cuda_stream_;                                                     \
      thdcp_cuda_stream_ << #expr << " failed: " << cudaGetErrorName(thdcp_cuda_status_) << " (" \
                         << cudaGetErrorString(thdcp_cuda_status_) << ")";                      \
      ::thdcp::detail::throw_error(__FILE__, __LINE__, thdcp_cuda_stream_.str(),                \
                                   thdcp_cuda_status_ == cudaErrorMemoryAllocation              \
                                       ? ::thdcp::ErrorKind::kOutOfMemory                       \
                                       : ::thdcp::ErrorKind::kCuda);                            \
    }                                                                                            \
  } while (0)

namespace thdcp::cuda {

// Throws thdcp::Error unless `pointer` is non-null, aligned to `alignment` bytes and device
// (or managed) memory of `device`, naming `name` and what to change. A pointer query
// (cudaPointerGetAttributes): plan time only, never on a path that may be captured.
void check_device_pointer(const char* name, const void* pointer, int device, size_t alignment);

}  // namespace thdcp::cuda
