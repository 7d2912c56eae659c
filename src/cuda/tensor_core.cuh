// Warp-level building blocks of the attention kernels (sm_80+): cp.async tile loads into a
// swizzled shared-memory layout, ldmatrix, mma.sync m16n8k16 with fp32 accumulators.
//
// Shared-memory tiles hold rows of kHeadDim 16-bit elements as 16-byte chunks; chunk c of
// row r is stored at chunk position c ^ (r & 7). The eight rows an ldmatrix reads in one
// phase then hit eight different bank groups, so the loads are free of bank conflicts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "attention_params.h"
#include "storage_tags.h"

namespace thdcp::cuda::detail {

// The 32 bits of a pair of 16-bit elements (the first in the low half): how mma fragments
// and packed stores hold them.
template <typename Pair>
__device__ __forceinline__ uint32_t pair_bits(const Pair& pair) {
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// Element: the storage element type; pack(lo, hi): two fp32 values rounded to a pair of them.
template <typename Storage>
struct StorageTraits;

template <>
struct StorageTraits<Bf16Tag> {
  using Element = __nv_bfloat16;
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    return pair_bits(__floats2bfloat162_rn(lo, hi));
  }
};

template <>
struct StorageTraits<Fp16Tag> {
  using Element = __half;
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) { return pair_bits(__floats2half2_rn(lo, hi)); }
};

// Inline asm takes its instruction as a string literal only, so an instruction on 16-bit
// operands is written as a macro ASM over their PTX type, and this expands it with the type
// of Storage ("bf16" for Bf16Tag, "f16" for Fp16Tag). Used here and in wgmma_ops.cuh.
#define THDCP_ASM_FOR_STORAGE(Storage, ASM)                                  \
  if constexpr (std::is_same_v<Storage, Bf16Tag>) {                          \
    ASM("bf16");                                                             \
  } else {                                                                   \
    static_assert(std::is_same_v<Storage, Fp16Tag>, "bf16 or fp16 storage"); \
    ASM("f16");                                                              \
  }

// Two neighbouring n8 blocks of an m16n8 accumulator (fp32), lo and hi, as the m16n8k16 A
// fragment (storage type) of the k-step that reduces over their 16 columns (as for P V in
// FlashAttention-2, and for the wgmma A operand from registers).
template <typename Storage>
__device__ __forceinline__ void accumulator_to_a_fragment(const float (&lo)[4], const float (&hi)[4],
                                                          uint32_t (&a)[4]) {
  a[0] = StorageTraits<Storage>::pack(lo[0], lo[1]);
  a[1] = StorageTraits<Storage>::pack(lo[2], lo[3]);
  a[2] = StorageTraits<Storage>::pack(hi[0], hi[1]);
  a[3] = StorageTraits<Storage>::pack(hi[2], hi[3]);
}

// The same for a warp's 16 rows x kColumns: the A fragments of the kColumns / 16 k-steps.
template <typename Storage, int kColumns>
__device__ __forceinline__ void accumulator_to_a_fragments(const float (&acc)[kColumns / 8][4],
                                                           uint32_t (&a)[kColumns / 16][4]) {
#pragma unroll
  for (int j = 0; j < kColumns / 16; ++j) accumulator_to_a_fragment<Storage>(acc[2 * j], acc[2 * j + 1], a[j]);
}

// c += a * b for one m16n8k16 tile (row-major A, column-major B).
#define THDCP_MMA_M16N8K16(PTX_TYPE)                                          \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PTX_TYPE "." PTX_TYPE \
               ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n" \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])               \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
template <typename Storage>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  THDCP_ASM_FOR_STORAGE(Storage, THDCP_MMA_M16N8K16)
}
#undef THDCP_MMA_M16N8K16

// This thread's warp and lane, and its elements of the m16n8 accumulator layout of the
// warp's fragments: rows group_row and group_row + 8 of each 16-row fragment (a row within
// each 8-row half), columns pair_col and pair_col + 1 of each 8-column block. The kernels
// bind it by reference (const auto& [warp, lane, group_row, pair_col] = FragmentLane{}): bound
// by value, dq_kernel_sm90 compiled to other register numbers than its four plain ints gave.
struct FragmentLane {
  int warp = threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  int group_row = lane >> 2;
  int pair_col = (lane & 3) * 2;
};

// The same for a thread of a warpgroup whose four warps own 16 rows each of a 64-row
// accumulator (the wide Hopper kernels, where one warpgroup of 128 threads stands beside
// another): its thread t of the warpgroup, its first row (and row + 8) and its columns
// 8 nf + pair_col + {0, 1}.
struct WarpgroupFragmentLane {
  int t = 0;
  int row = 0;
  int pair_col = 0;
};

__device__ __forceinline__ WarpgroupFragmentLane warpgroup_fragment_lane() {
  WarpgroupFragmentLane at;
  at.t = static_cast<int>(threadIdx.x) % 128;
  const int lane = at.t % 32;
  at.row = 16 * (at.t / 32) + (lane >> 2);
  at.pair_col = (lane & 3) * 2;
  return at;
}

// Sets every element of an array of m16n8 accumulator fragments to 0.
template <int kFragments>
__device__ __forceinline__ void zero_fragments(float (&acc)[kFragments][4]) {
#pragma unroll
  for (int i = 0; i < kFragments; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
}

// c[mi] += a[mi] B for one 16-deep k-step of a warp's kMF 16-row A fragments, with B's
// kFragments n8 blocks read as kFragments / 2 ldmatrix_x4 fragments, each read once for all
// kMF products: load_b(b, np) reads the one of columns [16 np, 16 np + 16).
template <typename Storage, int kMF, int kFragments, typename LoadB>
__device__ __forceinline__ void mma_k_step(float (&c)[kMF][kFragments][4], const uint32_t (&a)[kMF][4],
                                           LoadB&& load_b) {
#pragma unroll
  for (int np = 0; np < kFragments / 2; ++np) {
    uint32_t b[4];
    load_b(b, np);
#pragma unroll
    for (int mi = 0; mi < kMF; ++mi) {
      mma_16816<Storage>(c[mi][2 * np], a[mi], b[0], b[1]);
      mma_16816<Storage>(c[mi][2 * np + 1], a[mi], b[2], b[3]);
    }
  }
}

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// 16-byte global -> shared copy; with valid == false the destination is zero-filled and
// nothing is read.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// 4-byte variant (lse and delta rows).
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// The head of a step of a double-buffered loop: when there is a next step, starts its loads
// (load_next, into the other buffer) as a new cp.async group; then waits until this thread's
// loads of the current step have landed (the caller still synchronises the block).
template <typename LoadNext>
__device__ __forceinline__ void prefetch_next_and_wait(bool has_next, LoadNext&& load_next) {
  if (has_next) {
    load_next();
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
}

// Element offset of (row, 16-byte chunk) in a swizzled tile of kHeadDim-element rows.
template <int kHeadDim>
__device__ __forceinline__ int swizzled_offset(int row, int chunk) {
  return row * kHeadDim + ((chunk ^ (row & 7)) << 3);
}

// Element offset of 16-byte chunk `chunk` of head `head` in row `row` of a THD tensor. The
// host keeps strides below kMaxRowStride and rows below 2^31, so the offset inside the row
// is 32-bit and the row's a single 32x32->64-bit multiply.
__device__ __forceinline__ uint64_t row_offset(const Strides& strides, uint32_t row, int head, int chunk) {
  return static_cast<uint64_t>(row) * static_cast<uint32_t>(strides.row) +
         (static_cast<uint32_t>(head) * static_cast<uint32_t>(strides.head) + static_cast<uint32_t>(chunk) * 8);
}

// Elements from one row to the row kRows further on (32-bit: kRows * strides.row <
// 32 * kMaxRowStride = 2^31).
template <int kRows>
__device__ __forceinline__ int pass_step(const Strides& strides) {
  static_assert(kRows <= 32, "kMaxRowStride allows steps of up to 32 rows");
  return static_cast<int>(strides.row) * kRows;
}

// Copies rows [0, kRows) of head `head` of a THD tensor, starting at `first_row`, into a
// swizzled shared tile of kRowElements-element rows (kHeadDim of them loaded); rows >=
// valid_rows are zero-filled (never read).
template <int kRows, int kHeadDim, int kThreads, int kRowElements = kHeadDim, typename Element>
__device__ __forceinline__ void load_tile_async(Element* tile, const Element* tensor, int64_t first_row,
                                                int valid_rows, const Strides& strides, int head) {
  constexpr int kChunks = kHeadDim / 8;
  constexpr int kTotal = kRows * kChunks;
  static_assert(kTotal % kThreads == 0, "tile chunks must split evenly over the threads");
#pragma unroll
  for (int i = 0; i < kTotal / kThreads; ++i) {
    const int index = i * kThreads + static_cast<int>(threadIdx.x);
    const int row = index / kChunks;
    const int chunk = index % kChunks;
    const bool valid = row < valid_rows;
    const Element* src =
        valid ? tensor + row_offset(strides, static_cast<uint32_t>(first_row + row), head, chunk) : tensor;
    cp_async_16(smem_address(tile + swizzled_offset<kRowElements>(row, chunk)), src, valid);
  }
}

// The segment whose tile range holds `tile`: the largest s with start[s] <= tile.
__device__ __forceinline__ int find_segment(const int* start, int num_segments, int tile) {
  int lo = 0;
  int hi = num_segments - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (__ldg(start + mid) <= tile) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// 2^x by the hardware's approximation (ex2.approx.ftz: relative error about 2^-22,
// results below 2^-126 flushed to 0, 2^-inf = 0); exp2f adds a range fix-up around it.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Max of two floats through the integer order of their bits (no NaN reaches here).
__device__ __forceinline__ void atomic_max_float(float* address, float value) {
  if (value >= 0.0f) {
    atomicMax(reinterpret_cast<int*>(address), __float_as_int(value));
  } else {
    atomicMin(reinterpret_cast<unsigned int*>(address), __float_as_uint(value));
  }
}

}  // namespace thdcp::cuda::detail
