// Hopper (sm_90a) warpgroup MMA support: the shared-memory layout wgmma reads, its matrix
// descriptors, and the fences around the asynchronous instructions. The wrappers of the
// instructions themselves are generated (wgmma_ops.cuh).
//
// Layout ("128-byte swizzle", the canonical one of the PTX ISA): a tile of kRows rows of
// 16-bit elements is stored as column blocks of 64 elements; block b holds, for every row r,
// the 128 bytes of columns [64 b, 64 b + 64) at byte (b kRows + r) 128, with the 16-byte chunk
// c of that row at chunk position c ^ (r & 7). Eight rows make one 1024-byte swizzle atom,
// so the tile base must be 1024-byte aligned. Read as
//   - K-major (rows are M or N, columns the reduction dimension): descriptor start at the
//     k-step's 32-byte offset inside its column block, stride 1024 bytes per 8 rows;
//   - MN-major (rows are the reduction dimension, columns N): start at the k-step's first row,
//     1024 bytes per 8 rows of K, kRows * 128 bytes from one 64-column block to the next.
#pragma once

#include <cstdint>

#include "tensor_core.cuh"
#include "wgmma_ops.cuh"

namespace thdcp::cuda::detail {

// Element offset of (row, 16-byte chunk) in a wgmma tile of kRows rows (see above).
template <int kRows>
__device__ __forceinline__ int wgmma_tile_offset(int row, int chunk) {
  return ((chunk >> 3) * kRows + row) * 64 + (((chunk & 7) ^ (row & 7)) << 3);
}

// Copies rows [0, kRows) of head `head` of a THD tensor, from `first_row` on, into a wgmma
// tile at shared address `tile`; rows >= valid_rows are zero-filled (never read). Addresses
// as load_tile_async's (row_offset, pass_step). `thread` = 0 .. kThreads - 1: the kThreads
// threads that share the copy.
// Where the chunks of a row do not tile the threads in row passes that keep the swizzle
// phase (D 192, 256 at 128 threads), each thread copies chunks thread, thread + kThreads, ...
// of the tile in row-major order.
template <int kRows, int kHeadDim, int kThreads, typename Element>
__device__ __forceinline__ void load_wgmma_tile_async_from(uint32_t tile, const Element* tensor, int64_t first_row,
                                                           int valid_rows, const Strides& strides, int head,
                                                           int thread) {
  constexpr int kChunks = kHeadDim / 8;
  constexpr int kRowStep = kThreads / kChunks;
  if constexpr (kThreads % kChunks != 0 || kRowStep % 8 != 0) {
    static_assert(kRows * kChunks % kThreads == 0, "chunks split evenly over the threads");
#pragma unroll
    for (int i = 0; i < kRows * kChunks / kThreads; ++i) {
      const int index = i * kThreads + thread;
      const int row = index / kChunks;
      const int chunk = index % kChunks;
      const bool valid = row < valid_rows;
      const Element* src =
          valid ? tensor + row_offset(strides, static_cast<uint32_t>(first_row + row), head, chunk) : tensor;
      cp_async_16(tile + static_cast<uint32_t>(wgmma_tile_offset<kRows>(row, chunk) * 2), src, valid);
    }
  } else {
    static_assert(kRows * kChunks % kThreads == 0, "row passes cover the tile");
    const int chunk = thread % kChunks;
    const int row0 = thread / kChunks;
    const uint32_t dst0 = tile + static_cast<uint32_t>(wgmma_tile_offset<kRows>(row0, chunk) * 2);
    const Element* src = tensor + row_offset(strides, static_cast<uint32_t>(first_row) + row0, head, chunk);
#pragma unroll
    for (int i = 0; i < kRows / kRowStep; ++i) {
      const bool valid = row0 + kRowStep * i < valid_rows;
      cp_async_16(dst0 + static_cast<uint32_t>(kRowStep * i * 128), valid ? src : tensor, valid);
      src += pass_step<kRowStep>(strides);
    }
  }
}

// The same, shared by the block's first kThreads threads (threadIdx.x).
template <int kRows, int kHeadDim, int kThreads, typename Element>
__device__ __forceinline__ void load_wgmma_tile_async(uint32_t tile, const Element* tensor, int64_t first_row,
                                                      int valid_rows, const Strides& strides, int head) {
  load_wgmma_tile_async_from<kRows, kHeadDim, kThreads>(tile, tensor, first_row, valid_rows, strides, head,
                                                        static_cast<int>(threadIdx.x));
}

// The descriptor fields: start address, leading-dimension and stride-dimension byte offsets
// (all in 16-byte units), layout type 1 = 128-byte swizzle in bits 62-63.
__device__ __forceinline__ uint64_t wgmma_descriptor(uint32_t address, uint32_t leading_bytes,
                                                     uint32_t stride_bytes) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) | (static_cast<uint64_t>(leading_bytes >> 4) << 16) |
         (static_cast<uint64_t>(stride_bytes >> 4) << 32) | (uint64_t{1} << 62);
}

// A or B operand, K-major: k-step kk (columns [16 kk, 16 kk + 16)) of a tile at `tile` (shared
// address). The leading offset is unused for swizzled K-major layouts (1 by convention).
template <int kRows>
__device__ __forceinline__ uint64_t wgmma_desc_k_major(uint32_t tile, int kk) {
  return wgmma_descriptor(tile + static_cast<uint32_t>((kk >> 2) * kRows * 128 + (kk & 3) * 32), 16, 1024);
}

// B operand, MN-major: k-step kk (rows [16 kk, 16 kk + 16)) of a tile at `tile`. (With N = 64,
// one column block, the leading offset is not read.)
template <int kRows>
__device__ __forceinline__ uint64_t wgmma_desc_mn_major(uint32_t tile, int kk) {
  return wgmma_descriptor(tile + static_cast<uint32_t>(kk * 16 * 128), kRows * 128, 1024);
}

// The m16n8 accumulator arrays of the kernels as the flat register lists of the wgmma
// wrappers (same order: fragment-major, then the four values of a fragment).
template <int kFragments>
__device__ __forceinline__ float (&flat(float (&x)[kFragments][4]))[kFragments * 4] {
  return reinterpret_cast<float(&)[kFragments * 4]>(x);
}

// The first kLeading fragments of an array of fragments: an accumulator's first 8 kLeading
// columns, or the first kLeading k-steps of A fragments.
template <int kLeading, typename T, int kAll>
__device__ __forceinline__ T (&leading(T (&x)[kAll][4]))[kLeading][4] {
  static_assert(kLeading <= kAll, "a part of the array");
  return reinterpret_cast<T(&)[kLeading][4]>(x);
}

// acc = A B^T over kSteps k-steps of 16 columns, A and B K-major tiles (kRowsA and kRowsB
// rows; B's first kN rows are the N of the product) at shared addresses a_tile, b_tile.
// Issued, not committed.
template <typename Storage, int kN, int kRowsA, int kRowsB, int kSteps>
__device__ __forceinline__ void wgmma_ss_k_major(float (&acc)[kN / 8][4], uint32_t a_tile, uint32_t b_tile) {
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    WgmmaSs<Storage, kN>::template run<0, 0>(flat(acc), wgmma_desc_k_major<kRowsA>(a_tile, kk),
                                             wgmma_desc_k_major<kRowsB>(b_tile, kk), kk);
  }
}

// acc += A B over kSteps k-steps: A from registers (accumulator_to_a_fragments), B the rows
// [16 kk, 16 kk + 16) of an MN-major tile of kRowsB rows, kN columns. Above 128 columns, one
// instruction per piece of 128 columns (64 where kN is not a multiple of 128), piece h from
// the column block h kPieceN / 64 into acc's fragments [h kPieceN / 8, +kPieceN / 8).
// Issued, not committed.
template <typename Storage, int kN, int kRowsB, int kSteps>
__device__ __forceinline__ void wgmma_rs_mn_major(float (&acc)[kN / 8][4], const uint32_t (&a)[kSteps][4],
                                                  uint32_t b_tile) {
  constexpr int kPieceN = kN <= 128 ? kN : kN % 128 == 0 ? 128 : 64;
  static_assert(kN % kPieceN == 0, "whole pieces of 128 or 64 columns");
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
#pragma unroll
    for (int h = 0; h < kN / kPieceN; ++h) {
      float(&piece)[kPieceN / 8][4] = reinterpret_cast<float(&)[kPieceN / 8][4]>(acc[h * kPieceN / 8]);
      WgmmaRs<Storage, kPieceN>::template run<1>(
          flat(piece), a[kk],
          wgmma_desc_mn_major<kRowsB>(b_tile + static_cast<uint32_t>(h * (kPieceN / 64) * kRowsB * 128), kk), 1);
    }
  }
}

// Orders this thread's register writes before the wgmma instructions that read them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Shared-memory writes of the generic proxy (st.shared, cp.async) become visible to the
// async proxy that wgmma reads through.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from moving reads or writes of accumulator registers across a wait:
// an empty asm that "modifies" each register.
template <int kCount>
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// A backward step's two score products of one shape, first = A B^T over kFirstSteps k-steps
// and second = A' B'^T over kSecondSteps (as wgmma_ss_k_major: S and dP, or S^T and dP^T),
// fenced and committed as two groups, so that wgmma_wait<1> lands the first while the second
// is still in flight.
template <typename Storage, int kN, int kRowsA, int kRowsB, int kFirstSteps, int kSecondSteps>
__device__ __forceinline__ void wgmma_ss_k_major_pair(float (&first)[kN / 8][4], uint32_t first_a, uint32_t first_b,
                                                      float (&second)[kN / 8][4], uint32_t second_a,
                                                      uint32_t second_b) {
  wgmma_fence();
  wgmma_ss_k_major<Storage, kN, kRowsA, kRowsB, kFirstSteps>(first, first_a, first_b);
  wgmma_commit();
  wgmma_ss_k_major<Storage, kN, kRowsA, kRowsB, kSecondSteps>(second, second_a, second_b);
  wgmma_commit();
}

}  // namespace thdcp::cuda::detail
