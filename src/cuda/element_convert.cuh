// Conversions between fp32 and the 16-bit storage elements on the device (round to nearest
// even), for the small kernels that read or write storage directly (row_delta.cu, casts.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace thdcp::cuda::detail {

template <typename Element>
__device__ __forceinline__ float to_float(Element x);
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <>
__device__ __forceinline__ float to_float(__half x) {
  return __half2float(x);
}

template <typename Element>
__device__ __forceinline__ Element from_float(float x);
template <>
__device__ __forceinline__ float from_float(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float(float x) {
  return __float2half_rn(x);
}

}  // namespace thdcp::cuda::detail
