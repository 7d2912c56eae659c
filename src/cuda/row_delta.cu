// The backward's row statistic delta = rowsum(dO * O) per (query row, head), which every
// backward kernel reads (dS = P (dP - delta)) and the sinks' gradient sums.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

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

// kLanes = head_dim / 8 threads per (head, row) pair, 16 bytes of out and of dout each; the
// pairs in head-major order, so that consecutive pairs store consecutive delta entries.
// (Rows and heads start on 16-byte boundaries: attention_checks.)
template <typename Element, int kLanes>
__global__ void delta_kernel(const Element* out, int64_t out_row_stride, int64_t out_head_stride, const Element* dout,
                             int64_t dout_row_stride, int64_t dout_head_stride, float* delta, int64_t rows,
                             int heads) {
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t pair = thread / kLanes;
  const int part = static_cast<int>(thread % kLanes);
  const bool active = pair < rows * heads;  // every lane stays for the shuffles
  const int head = active ? static_cast<int>(pair / rows) : 0;
  const int64_t row = active ? pair - head * rows : 0;
  float sum = 0.0f;
  if (active) {
    sum = dot8(out + row * out_row_stride + static_cast<int64_t>(head) * out_head_stride + part * 8,
               dout + row * dout_row_stride + static_cast<int64_t>(head) * dout_head_stride + part * 8);
  }
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (active && part == 0) delta[pair] = sum;
}

}  // namespace

template <typename Element, int kLanes>
void launch_delta_lanes(const void* out, int64_t out_row_stride, int64_t out_head_stride, const void* dout,
                        int64_t dout_row_stride, int64_t dout_head_stride, int64_t rows, int heads, float* delta,
                        cudaStream_t stream) {
  constexpr int kThreads = 256;
  delta_kernel<Element, kLanes><<<blocks_for(rows * heads * kLanes, kThreads), kThreads, 0, stream>>>(
      static_cast<const Element*>(out), out_row_stride, out_head_stride, static_cast<const Element*>(dout),
      dout_row_stride, dout_head_stride, delta, rows, heads);
}

void launch_delta(const void* out, int64_t out_row_stride, int64_t out_head_stride, const void* dout,
                  int64_t dout_row_stride, int64_t dout_head_stride, DType dtype, int64_t rows, int heads,
                  int head_dim, float* delta, cudaStream_t stream) {
  if (rows * heads == 0) return;
  THDCP_CHECK(head_dim == 64 || head_dim == 128, "launch_delta: head_dim=" << head_dim << " is not 64 or 128");
  const bool bf16 = dtype == DType::kBFloat16;
  const auto launch = head_dim == 64 ? (bf16 ? launch_delta_lanes<__nv_bfloat16, 8> : launch_delta_lanes<__half, 8>)
                                     : (bf16 ? launch_delta_lanes<__nv_bfloat16, 16> : launch_delta_lanes<__half, 16>);
  launch(out, out_row_stride, out_head_stride, dout, dout_row_stride, dout_head_stride, rows, heads, delta, stream);
  THDCP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace thdcp::cuda::detail
