// fp32 -> storage dtype casts of the backward's accumulators (dK, dV, dQ) into the caller's
// tensors, flat or strided, scaled on the way where the softmax scale is applied last.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>

#include "backward_support.h"
#include "element_convert.cuh"
#include "grid.h"
#include "thdcp/core/error.h"
#include "thdcp/cuda/check.h"

namespace thdcp::cuda::detail {

namespace {

template <typename Element>
__global__ void cast_kernel(const float* src, Element* dst, int64_t n, float scale) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = from_float<Element>(scale * src[i]);
  }
}

// The same, four elements per thread and iteration (src 16-byte aligned, dst aligned to four
// elements, n a multiple of 4).
template <typename Element>
__global__ void cast4_kernel(const float4* src, Element* dst, int64_t n4, float scale) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 v = src[i];
    Element e[4] = {from_float<Element>(scale * v.x), from_float<Element>(scale * v.y),
                    from_float<Element>(scale * v.z), from_float<Element>(scale * v.w)};
    if constexpr (sizeof(Element) == 2) {
      uint2 packed;
      memcpy(&packed, e, sizeof(packed));
      reinterpret_cast<uint2*>(dst)[i] = packed;
    } else {
      reinterpret_cast<float4*>(dst)[i] = make_float4(e[0], e[1], e[2], e[3]);
    }
  }
}

// One warp per (row, head) pair of a contiguous fp32 source, into a strided destination.
template <typename Element>
__global__ void cast_strided_kernel(const float* src, Element* dst, int64_t pairs, int heads, int head_dim,
                                    int64_t row_stride, int64_t head_stride, float scale) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t pair = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; pair < pairs;
       pair += warps) {
    const int64_t row = pair / heads;
    const int head = static_cast<int>(pair - row * heads);
    const float* s = src + pair * head_dim;
    Element* d = dst + row * row_stride + static_cast<int64_t>(head) * head_stride;
    for (int i = lane; i < head_dim; i += 32) d[i] = from_float<Element>(scale * s[i]);
  }
}

}  // namespace

template <typename Element>
void launch_cast_as(const float* src, void* dst, int64_t n, float scale, cudaStream_t stream) {
  constexpr int kThreads = 256;
  Element* out = static_cast<Element*>(dst);
  const bool vector = n % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(dst) % (4 * sizeof(Element)) == 0;
  if (vector) {
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(blocks_for(n / 4, kThreads), 65536));
    cast4_kernel<<<blocks, kThreads, 0, stream>>>(reinterpret_cast<const float4*>(src), out, n / 4, scale);
  } else {
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(blocks_for(n, kThreads), 65536));
    cast_kernel<<<blocks, kThreads, 0, stream>>>(src, out, n, scale);
  }
}

void launch_cast(const float* src, void* dst, DType dtype, int64_t n, float scale, cudaStream_t stream) {
  if (n == 0) return;
  if (dtype == DType::kBFloat16) {
    launch_cast_as<__nv_bfloat16>(src, dst, n, scale, stream);
  } else if (dtype == DType::kFloat16) {
    launch_cast_as<__half>(src, dst, n, scale, stream);
  } else {
    launch_cast_as<float>(src, dst, n, scale, stream);
  }
  THDCP_CHECK_CUDA(cudaGetLastError());
}

void launch_cast(const float* src, void* dst, DType dtype, int64_t n, cudaStream_t stream) {
  launch_cast(src, dst, dtype, n, 1.0f, stream);
}

void launch_cast_strided(const float* src, void* dst, DType dtype, int64_t rows, int heads, int head_dim,
                         int64_t row_stride, int64_t head_stride, float scale, cudaStream_t stream) {
  if (row_stride == static_cast<int64_t>(heads) * head_dim && head_stride == head_dim) {
    launch_cast(src, dst, dtype, rows * heads * head_dim, scale, stream);
    return;
  }
  const int64_t pairs = rows * heads;
  if (pairs == 0 || head_dim == 0) return;
  constexpr int kThreads = 256;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(blocks_for(pairs * 32, kThreads), 65536));
  if (dtype == DType::kBFloat16) {
    cast_strided_kernel<<<blocks, kThreads, 0, stream>>>(src, static_cast<__nv_bfloat16*>(dst), pairs, heads,
                                                         head_dim, row_stride, head_stride, scale);
  } else if (dtype == DType::kFloat16) {
    cast_strided_kernel<<<blocks, kThreads, 0, stream>>>(src, static_cast<__half*>(dst), pairs, heads, head_dim,
                                                         row_stride, head_stride, scale);
  } else {
    cast_strided_kernel<<<blocks, kThreads, 0, stream>>>(src, static_cast<float*>(dst), pairs, heads, head_dim,
                                                         row_stride, head_stride, scale);
  }
  THDCP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace thdcp::cuda::detail
