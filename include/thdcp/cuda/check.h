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
      ::thdcp::detail::throw_error(__FILE__, __LINE__, thdcp_cuda_stream_.str());               \
    }                                                                                            \
  } while (0)
