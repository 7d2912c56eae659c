// The K/V tile loader of the portable kernels (forward_kernel, dq_kernel): K and V tiles of
// kN keys, double-buffered in swizzled shared memory (load_tile_async's layout and zero
// fill). KvTileLoader picks one of two:
// - KvRowPassLoader, where K and V have one head dim whose 16-byte chunks tile the block's
//   threads into row passes that keep the swizzle phase (64 and 128 at 128 threads): from
//   per-thread row pointers. This thread copies chunk `chunk` of rows row0 + kRowStep * i of
//   each tile, so each tile costs one 32x32->64-bit multiply per tensor (row_offset) and each
//   row pass one 64-bit step of each pointer, and the shared-memory offsets are constants
//   past the first.
// - KvAnyDimLoader otherwise (D_qk != D_v, 96, 192, 256): each tensor as load_tile_async
//   copies a tile, into rows of smem_row_elements(D) elements.
#pragma once

#include <cstdint>
#include <type_traits>

#include "tensor_core.cuh"
#include "tile_shapes.h"

namespace thdcp::cuda::detail {

// Whether kThreads threads copy kN rows of kD elements in row passes of one 16-byte chunk
// each that keep the swizzle phase (a pass spans a multiple of 8 rows).
template <int kN, int kD, int kThreads>
constexpr bool row_passes_fit() {
  constexpr int kChunks = kD / 8;
  return kThreads % kChunks == 0 && (kThreads / kChunks) % 8 == 0 && (kN * kChunks) % kThreads == 0;
}

template <typename Element, int kN, int kD, int kThreads>
struct KvRowPassLoader {
  static constexpr int kChunks = kD / 8;
  static constexpr int kRowStep = kThreads / kChunks;
  static constexpr int kPasses = kN * kChunks / kThreads;
  static_assert(kN * kChunks % kThreads == 0 && kRowStep % 8 == 0, "K/V passes keep the swizzle phase");

  // k_tiles, v_tiles: two buffers of kN x kD elements each.
  __device__ __forceinline__ KvRowPassLoader(const Element* k_, const Element* v_, const Strides& k_strides_,
                                          const Strides& v_strides_, const Segment& seg_, int kv_head_,
                                          Element* k_tiles, Element* v_tiles)
      : k(k_),
        v(v_),
        k_strides(k_strides_),
        v_strides(v_strides_),
        seg(seg_),
        kv_head(kv_head_),
        chunk(static_cast<int>(threadIdx.x) % kChunks),
        row0(static_cast<int>(threadIdx.x) / kChunks),
        first_row(static_cast<uint32_t>(seg_.k_row) + row0),
        k_smem(smem_address(k_tiles + swizzled_offset<kD>(row0, chunk))),
        v_smem(smem_address(v_tiles + swizzled_offset<kD>(row0, chunk))) {}

  // Enqueues (cp.async) key tile n of the segment into `buffer` (0 or 1); rows past k_len
  // are zero-filled.
  __device__ __forceinline__ void load(int n, int buffer) const {
    const int rows = min(kN, seg.k_len - n * kN) - row0;  // rows this thread may read
    const uint32_t row = first_row + static_cast<uint32_t>(n * kN);
    const Element* k_src = k + row_offset(k_strides, row, kv_head, chunk);
    const Element* v_src = v + row_offset(v_strides, row, kv_head, chunk);
    const uint32_t buffer_bytes = static_cast<uint32_t>(buffer * kN * kD * 2);
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const bool valid = kRowStep * i < rows;
      const uint32_t dst = buffer_bytes + static_cast<uint32_t>(kRowStep * i * kD * 2);
      cp_async_16(k_smem + dst, valid ? k_src : k, valid);
      cp_async_16(v_smem + dst, valid ? v_src : v, valid);
      k_src += pass_step<kRowStep>(k_strides);
      v_src += pass_step<kRowStep>(v_strides);
    }
  }

  const Element* k;
  const Element* v;
  const Strides& k_strides;
  const Strides& v_strides;
  const Segment& seg;  // a reference, as the kernels' lambdas read it: the same SASS
  int kv_head;
  int chunk;
  int row0;
  uint32_t first_row;
  uint32_t k_smem;
  uint32_t v_smem;
};

template <typename Element, int kN, int kDk, int kDv, int kThreads>
struct KvAnyDimLoader {
  static constexpr int kKRow = smem_row_elements(kDk);
  static constexpr int kVRow = smem_row_elements(kDv);

  // k_tiles: two buffers of kN x kKRow elements; v_tiles: two of kN x kVRow.
  __device__ __forceinline__ KvAnyDimLoader(const Element* k_, const Element* v_, const Strides& k_strides_,
                                            const Strides& v_strides_, const Segment& seg_, int kv_head_,
                                            Element* k_tiles_, Element* v_tiles_)
      : k(k_), v(v_), k_strides(k_strides_), v_strides(v_strides_), seg(seg_), kv_head(kv_head_),
        k_tiles(k_tiles_), v_tiles(v_tiles_) {}

  __device__ __forceinline__ void load(int n, int buffer) const {
    const int rows = min(kN, seg.k_len - n * kN);
    const int64_t first_row = static_cast<int64_t>(seg.k_row) + n * kN;
    load_tile_async<kN, kDk, kThreads, kKRow>(k_tiles + buffer * kN * kKRow, k, first_row, rows, k_strides, kv_head);
    load_tile_async<kN, kDv, kThreads, kVRow>(v_tiles + buffer * kN * kVRow, v, first_row, rows, v_strides, kv_head);
  }

  const Element* k;
  const Element* v;
  const Strides& k_strides;
  const Strides& v_strides;
  const Segment& seg;
  int kv_head;
  Element* k_tiles;
  Element* v_tiles;
};

template <typename Element, int kN, int kDk, int kDv, int kThreads>
using KvTileLoader =
    std::conditional_t<kDk == kDv && smem_row_elements(kDk) == kDk && row_passes_fit<kN, kDk, kThreads>(),
                       KvRowPassLoader<Element, kN, kDk, kThreads>, KvAnyDimLoader<Element, kN, kDk, kDv, kThreads>>;

}  // namespace thdcp::cuda::detail
