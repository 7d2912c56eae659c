// THDCP_CHECK_CUDA: turns a failed CUDA runtime call into thdcp::Error, naming the call, the
// CUDA error and the location (like TransformerEngine's NVTE_CHECK_CUDA). Every part that
// calls the CUDA runtime uses it: cuda, the device communicators, graph, the bindings.
//
// core builds without a CUDA toolkit, so this header includes none: the macro names
// cudaSuccess, cudaGetErrorName and cudaGetErrorString only where it is expanded, in a file
// that includes <cuda_runtime_api.h> itself.
#pragma once

#include "thdcp/core/error.h"

namespace thdcp::detail {

// Throws thdcp::Error "<call> failed: <name> (<text>)" at file:line, of kind kOutOfMemory for
// an allocation failure and kCuda otherwise.
[[noreturn]] void throw_cuda_error(const char* file, int line, const char* call, const char* error_name,
                                   const char* error_text, bool out_of_memory);

}  // namespace thdcp::detail

#define THDCP_CHECK_CUDA(expr)                                                                        \
  do {                                                                                                \
    const cudaError_t thdcp_cuda_status_ = (expr);                                                    \
    if (thdcp_cuda_status_ != cudaSuccess) {                                                          \
      ::thdcp::detail::throw_cuda_error(__FILE__, __LINE__, #expr, cudaGetErrorName(thdcp_cuda_status_), \
                                        cudaGetErrorString(thdcp_cuda_status_),                       \
                                        thdcp_cuda_status_ == cudaErrorMemoryAllocation);             \
    }                                                                                                 \
  } while (0)
