// Checks of device pointers at plan time, and (through thdcp/core/cuda_check.h)
// THDCP_CHECK_CUDA for the CUDA part's own runtime calls.
#pragma once

#include <cuda_runtime_api.h>

#include "thdcp/core/cuda_check.h"

namespace thdcp::cuda {

// Throws thdcp::Error unless `pointer` is non-null, aligned to `alignment` bytes and device
// (or managed) memory of `device`, naming `name` and what to change. A pointer query
// (cudaPointerGetAttributes): plan time only, never on a path that may be captured.
void check_device_pointer(const char* name, const void* pointer, int device, size_t alignment);

}  // namespace thdcp::cuda
