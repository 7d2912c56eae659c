// The RoPE kernel: rotates q and k in place, one thread per (row, group of pairs), every head.
//
// A thread computes the cos/sin of its pairs once and applies them to all heads of q and k,
// so the sincosf cost is shared by Hq + Hkv heads and the kernel stays memory-bound. The
// block first finds the positions of the rows it touches (one binary search over
// cu_seqlens_padded per row, not per thread) and stages the inverse frequencies in shared
// memory. Heads go in batches whose loads are all issued before the first store: the
// stores are in place, so without the batching every load would wait for the previous store.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "rope_params.h"
#include "thdcp/cuda/check.h"
#include "thdcp/cuda/rope.h"
#include "thdcp/plan/rope.h"

namespace thdcp::cuda::detail {

namespace {

constexpr int kThreads = 256;
constexpr int kHeadBatch = 4;

template <bool kBf16>
__device__ __forceinline__ float to_float(uint32_t bits) {
  if constexpr (kBf16) {
    return __uint_as_float(bits << 16);
  } else {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  }
}

template <bool kBf16>
__device__ __forceinline__ uint32_t to_bits(float value) {
  if constexpr (kBf16) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(value));
  } else {
    return __half_as_ushort(__float2half_rn(value));
  }
}

// kVec elements at `src`: one 16-byte word when kVec == 8 (the caller checked alignment).
template <bool kBf16, int kVec>
__device__ __forceinline__ void load(const uint16_t* src, float (&out)[kVec]) {
  if constexpr (kVec == 8) {
    const uint4 word = *reinterpret_cast<const uint4*>(src);
    const uint32_t halves[4] = {word.x, word.y, word.z, word.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = to_float<kBf16>(halves[i] & 0xffffu);
      out[2 * i + 1] = to_float<kBf16>(halves[i] >> 16);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) out[i] = to_float<kBf16>(src[i]);
  }
}

template <bool kBf16, int kVec>
__device__ __forceinline__ void store(uint16_t* dst, const float (&in)[kVec]) {
  if constexpr (kVec == 8) {
    uint32_t halves[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) halves[i] = to_bits<kBf16>(in[2 * i]) | (to_bits<kBf16>(in[2 * i + 1]) << 16);
    *reinterpret_cast<uint4*>(dst) = make_uint4(halves[0], halves[1], halves[2], halves[3]);
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) dst[i] = static_cast<uint16_t>(to_bits<kBf16>(in[i]));
  }
}

// Rotates the thread's pairs in every head of `t` at `row`. Interleaved: the thread's kVec
// elements start at `lo` and hold kVec / 2 pairs. Half-split: kVec first elements at `lo`,
// their partners at `hi`.
template <bool kBf16, bool kInterleaved, int kVec, int kPairs>
__device__ __forceinline__ void rotate_heads(const RopeTensorParams& t, int64_t row, int64_t lo, int64_t hi,
                                             const float (&c)[kPairs], const float (&s)[kPairs]) {
  uint16_t* base = static_cast<uint16_t*>(t.data) + row * t.row_stride;
  for (int h0 = 0; h0 < t.heads; h0 += kHeadBatch) {
    float a[kHeadBatch][kVec];
    float b[kHeadBatch][kInterleaved ? 1 : kVec];
#pragma unroll
    for (int u = 0; u < kHeadBatch; ++u) {
      if (h0 + u >= t.heads) break;
      const uint16_t* head = base + (h0 + u) * t.head_stride;
      load<kBf16, kVec>(head + lo, a[u]);
      if constexpr (!kInterleaved) load<kBf16, kVec>(head + hi, b[u]);
    }
#pragma unroll
    for (int u = 0; u < kHeadBatch; ++u) {
      if (h0 + u >= t.heads) break;
      uint16_t* head = base + (h0 + u) * t.head_stride;
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        if constexpr (kInterleaved) {
          const RopeRotated y = rope_rotate(a[u][2 * j], a[u][2 * j + 1], c[j], s[j]);
          a[u][2 * j] = y.first;
          a[u][2 * j + 1] = y.second;
        } else {
          const RopeRotated y = rope_rotate(a[u][j], b[u][j], c[j], s[j]);
          a[u][j] = y.first;
          b[u][j] = y.second;
        }
      }
      store<kBf16, kVec>(head + lo, a[u]);
      if constexpr (!kInterleaved) store<kBf16, kVec>(head + hi, b[u]);
    }
  }
}

// Item = (row, group): a group is kVec consecutive elements (interleaved: kVec / 2 pairs) or
// kVec consecutive pairs (half-split). __grid_constant__: the inverse frequencies are read
// with a thread-dependent index straight from the parameter space, without a local copy.
template <bool kBf16, bool kInterleaved, int kVec>
__global__ void __launch_bounds__(kThreads) rope_kernel(const __grid_constant__ RopeParams p, int groups) {
  constexpr int kPairs = kInterleaved ? kVec / 2 : kVec;
  __shared__ float inv_freq[kRopeMaxPairs];
  __shared__ int64_t positions[kThreads];  // a block touches at most kThreads rows
  const bool from_table = p.cos_table != nullptr;
  const int64_t first_item = static_cast<int64_t>(blockIdx.x) * kThreads;
  const int64_t first_row = first_item / groups;
  if (!from_table) {
    for (int i = threadIdx.x; i < p.pairs; i += kThreads) inv_freq[i] = p.inv_freq[i];
  }
  const int64_t own_row = first_row + threadIdx.x;
  if (own_row < p.rows && own_row * groups < first_item + kThreads) {
    int64_t position =
        rope_position(p.cu_seqlens, p.cu_seqlens_padded, p.max_seqs, p.cp, p.rank, own_row, p.start_offsets,
                      p.cp_layout);
    if (from_table && (position < 0 || position >= p.table_rows)) {
      // The caller broke the table contract (RopeShape::with_start_offsets): clamp, never read
      // out of bounds, and say so.
      position = position < 0 ? 0 : p.table_rows - 1;
      if (p.status != nullptr) atomicOr(p.status, kRopeStatusPositionOutsideTable);
    }
    positions[threadIdx.x] = position;
  }
  __syncthreads();

  const int64_t item = first_item + threadIdx.x;
  if (item >= p.rows * groups) return;
  const int64_t row = item / groups;
  const int group = static_cast<int>(item - row * groups);
  const int64_t position = positions[row - first_row];
  const int first_pair = group * kPairs;
  float c[kPairs], s[kPairs];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    if (from_table) {
      const int64_t at = position * p.pairs + first_pair + j;
      c[j] = __ldg(p.cos_table + at);
      s[j] = __ldg(p.sin_table + at);
    } else {
      sincosf(rope_angle(position, inv_freq[first_pair + j]), &s[j], &c[j]);
    }
    s[j] *= p.sin_sign;
  }
  const int64_t lo = kInterleaved ? 2 * first_pair : first_pair;
  const int64_t hi = p.pairs + first_pair;
  rotate_heads<kBf16, kInterleaved, kVec, kPairs>(p.q, row, lo, hi, c, s);
  rotate_heads<kBf16, kInterleaved, kVec, kPairs>(p.k, row, lo, hi, c, s);
}

template <bool kBf16, bool kInterleaved, int kVec>
void launch(const RopeParams& params, cudaStream_t stream) {
  constexpr int kPairs = kInterleaved ? kVec / 2 : kVec;
  const int groups = params.pairs / kPairs;
  const int64_t items = params.rows * groups;
  if (items == 0) return;
  const int64_t blocks = (items + kThreads - 1) / kThreads;
  rope_kernel<kBf16, kInterleaved, kVec><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(params, groups);
  THDCP_CHECK_CUDA(cudaGetLastError());
}

template <bool kBf16>
void launch_dtype(const RopeParams& params, bool interleaved, bool vectorized, cudaStream_t stream) {
  if (interleaved) {
    vectorized ? launch<kBf16, true, 8>(params, stream) : launch<kBf16, true, 2>(params, stream);
  } else {
    vectorized ? launch<kBf16, false, 8>(params, stream) : launch<kBf16, false, 1>(params, stream);
  }
}

}  // namespace

void launch_rope(const RopeParams& params, bool bf16, bool interleaved, bool vectorized, cudaStream_t stream) {
  bf16 ? launch_dtype<true>(params, interleaved, vectorized, stream)
       : launch_dtype<false>(params, interleaved, vectorized, stream);
}

}  // namespace thdcp::cuda::detail
