// The backward's row statistic delta = rowsum(dO * O) per (query row, head), which every
// backward kernel reads (dS = P (dP - delta)) and the sinks' gradient sums.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>
#include <type_traits>

#include "backward_support.h"
#include "element_convert.cuh"
#include "grid.h"
#include "thdcp/core/error.h"
#include "thdcp/cuda/check.h"

namespace thdcp::cuda::detail {

namespace {

// Eight elements of a 16-bit dtype, loaded as one 16-byte vector, dotted in fp32.
template <typename Element>
__device__ __forceinline__ float dot8(const Element* a, const Element* b) {
  const uint4 va = __ldg(reinterpret_cast<const uint4*>(a));
  const uint4 vb = __ldg(reinterpret_cast<const uint4*>(b));
  Element ea[8];
  Element eb[8];
  memcpy(ea, &va, sizeof(va));
  memcpy(eb, &vb, sizeof(vb));
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) sum = fmaf(to_float(ea[i]), to_float(eb[i]), sum);
  return sum;
}

// kLanes threads per (head, row) pair (head_dim / 8 rounded down to a power of two, 8 to 32),
// each 16-byte chunks c = lane, lane + kLanes, ... of the kChunks = head_dim / 8 of out and of
// dout; the pairs in head-major order, so that consecutive pairs store consecutive delta
// entries. (Rows and heads start on 16-byte boundaries: attention_checks.)
template <int kChunks>
constexpr int delta_lanes() {
  return kChunks >= 32 ? 32 : kChunks >= 16 ? 16 : 8;
}

template <typename Element, int kChunks>
__global__ void delta_kernel(const Element* out, int64_t out_row_stride, int64_t out_head_stride, const Element* dout,
                             int64_t dout_row_stride, int64_t dout_head_stride, float* delta, int64_t rows,
                             int heads) {
  constexpr int kLanes = delta_lanes<kChunks>();
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t pair = thread / kLanes;
  const int part = static_cast<int>(thread % kLanes);
  const bool active = pair < rows * heads;  // every lane stays for the shuffles
  const int head = active ? static_cast<int>(pair / rows) : 0;
  const int64_t row = active ? pair - head * rows : 0;
  float sum = 0.0f;
  if (active) {
    const Element* out_row = out + row * out_row_stride + static_cast<int64_t>(head) * out_head_stride;
    const Element* dout_row = dout + row * dout_row_stride + static_cast<int64_t>(head) * dout_head_stride;
#pragma unroll
    for (int c = part; c < kChunks; c += kLanes) sum += dot8(out_row + c * 8, dout_row + c * 8);
  }
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (active && part == 0) delta[pair] = sum;
}

}  // namespace

template <typename Element, int kChunks>
void launch_delta_chunks(const void* out, int64_t out_row_stride, int64_t out_head_stride, const void* dout,
                        int64_t dout_row_stride, int64_t dout_head_stride, int64_t rows, int heads, float* delta,
                        cudaStream_t stream) {
  constexpr int kThreads = 256;
  delta_kernel<Element, kChunks><<<blocks_for(rows * heads * delta_lanes<kChunks>(), kThreads), kThreads, 0, stream>>>(
      static_cast<const Element*>(out), out_row_stride, out_head_stride, static_cast<const Element*>(dout),
      dout_row_stride, dout_head_stride, delta, rows, heads);
}

void launch_delta(const void* out, int64_t out_row_stride, int64_t out_head_stride, const void* dout,
                  int64_t dout_row_stride, int64_t dout_head_stride, DType dtype, int64_t rows, int heads,
                  int head_dim, float* delta, cudaStream_t stream) {
  if (rows * heads == 0) return;
  const bool bf16 = dtype == DType::kBFloat16;
  auto pick = [bf16](auto chunks) {
    constexpr int kChunks = decltype(chunks)::value;
    return bf16 ? launch_delta_chunks<__nv_bfloat16, kChunks> : launch_delta_chunks<__half, kChunks>;
  };
  decltype(pick(std::integral_constant<int, 8>{})) launch = nullptr;
  switch (head_dim) {
    case 64: launch = pick(std::integral_constant<int, 8>{}); break;
    case 96: launch = pick(std::integral_constant<int, 12>{}); break;
    case 128: launch = pick(std::integral_constant<int, 16>{}); break;
    case 192: launch = pick(std::integral_constant<int, 24>{}); break;
    case 256: launch = pick(std::integral_constant<int, 32>{}); break;
    default: THDCP_FAIL("launch_delta: v_head_dim=" << head_dim << " is not one of the kernels' 64, 96, 128, 192, 256");
  }
  launch(out, out_row_stride, out_head_stride, dout, dout_row_stride, dout_head_stride, rows, heads, delta, stream);
  THDCP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace thdcp::cuda::detail
