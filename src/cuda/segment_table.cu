// Device segment-table builders and the small kernels around the attention launches
// (tile schedule, delta = rowsum(dO * O), fp32 -> 16-bit casts, flat and strided).
//
// The builders call the same __host__ __device__ functions as the host builders
// (single_device_segment, cp_segment in thdcp/segment.h): the index math exists once.
#include <algorithm>

#include <cub/block/block_scan.cuh>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "launch.h"
#include "thdcp/cuda/check.h"
#include "thdcp/plan/segment.h"

namespace thdcp::cuda::detail {

namespace {

constexpr int kBuildThreads = 128;
constexpr int kScheduleThreads = 1024;

__global__ void build_single_table_kernel(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded, int max_seqs,
                                          Segment* segments) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= max_seqs) return;
  const int64_t start = cu_seqlens_padded[b];
  segments[b] = single_device_segment(start, cu_seqlens_padded[b + 1] - start, cu_seqlens[b + 1] - cu_seqlens[b]);
}

__global__ void build_cp_table_kernel(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded, int max_seqs,
                                      int cp, int rank, Mask mask, Segment* segments) {
  const int index = blockIdx.x * blockDim.x + threadIdx.x;
  if (index >= 2 * max_seqs) return;
  const int b = index / 2;
  const int slot = index % 2;
  const int64_t start = cu_seqlens_padded[b];
  const int64_t padded_len = cu_seqlens_padded[b + 1] - start;
  const int64_t length = cu_seqlens[b + 1] - cu_seqlens[b];
  segments[index] = cp_segment(start, padded_len, length, cp, rank, slot, mask);
}

// One block: exclusive prefix sums of the tiles of every segment.
__global__ void __launch_bounds__(kScheduleThreads)
    schedule_kernel(const Segment* segments, int num_segments, int q_tile_rows, int* q_start, int k_tile_rows,
                    int* k_start, float* max_logit, int q_heads, int* work_counter) {
  using Scan = cub::BlockScan<int, kScheduleThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  int q_carry = 0;
  int k_carry = 0;
  if (threadIdx.x == 0) {
    q_start[0] = 0;
    if (k_start) k_start[0] = 0;
    if (work_counter) *work_counter = 0;
  }
  for (int base = 0; base < num_segments; base += kScheduleThreads) {
    const int s = base + static_cast<int>(threadIdx.x);
    int q_tiles = 0;
    int k_tiles = 0;
    if (s < num_segments) {
      const Segment seg = segments[s];
      q_tiles = (seg.q_span + q_tile_rows - 1) / q_tile_rows;
      k_tiles = seg.q_len > 0 ? (seg.k_len + k_tile_rows - 1) / k_tile_rows : 0;
    }
    int q_inclusive = 0;
    int q_total = 0;
    Scan(scan_storage).InclusiveSum(q_tiles, q_inclusive, q_total);
    __syncthreads();
    int k_inclusive = 0;
    int k_total = 0;
    Scan(scan_storage).InclusiveSum(k_tiles, k_inclusive, k_total);
    __syncthreads();
    if (s < num_segments) {
      q_start[s + 1] = q_carry + q_inclusive;
      if (k_start) k_start[s + 1] = k_carry + k_inclusive;
    }
    q_carry += q_total;
    k_carry += k_total;
  }
  if (max_logit) {
    for (int h = threadIdx.x; h < q_heads; h += kScheduleThreads) max_logit[h] = -INFINITY;
  }
}

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

unsigned blocks_for(int64_t items, int threads) { return static_cast<unsigned>((items + threads - 1) / threads); }

}  // namespace

void launch_build_single_table(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded, int max_seqs,
                               Segment* segments, cudaStream_t stream) {
  if (max_seqs == 0) return;
  build_single_table_kernel<<<blocks_for(max_seqs, kBuildThreads), kBuildThreads, 0, stream>>>(
      cu_seqlens, cu_seqlens_padded, max_seqs, segments);
  THDCP_CHECK_CUDA(cudaGetLastError());
}

void launch_build_cp_table(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded, int max_seqs, int cp,
                           int rank, Mask mask, Segment* segments, cudaStream_t stream) {
  if (max_seqs == 0) return;
  build_cp_table_kernel<<<blocks_for(2 * static_cast<int64_t>(max_seqs), kBuildThreads), kBuildThreads, 0,
                          stream>>>(cu_seqlens, cu_seqlens_padded, max_seqs, cp, rank, mask, segments);
  THDCP_CHECK_CUDA(cudaGetLastError());
}

void launch_schedule(const Segment* segments, int num_segments, int q_tile_rows, int* q_start, int k_tile_rows,
                     int* k_start, float* max_logit, int q_heads, int* work_counter, cudaStream_t stream) {
  schedule_kernel<<<1, kScheduleThreads, 0, stream>>>(segments, num_segments, q_tile_rows, q_start, k_tile_rows,
                                                      k_start, max_logit, q_heads, work_counter);
  THDCP_CHECK_CUDA(cudaGetLastError());
}

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
