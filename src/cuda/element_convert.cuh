// Conversions between fp32 and the 16-bit storage elements on the device (round to nearest
// even), for the small kernels that read or write storage directly (row_delta.cu, casts.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace thdcp::cuda::detail {

__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

// Element: __nv_bfloat16, __half or float (then x itself).
template <typename Element>
__device__ __forceinline__ Element from_float(float x) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else if constexpr (std::is_same_v<Element, __half>) {
    return __float2half_rn(x);
  } else {
    static_assert(std::is_same_v<Element, float>, "a storage element or fp32");
    return x;
  }
}

}  // namespace thdcp::cuda::detail
