// The K/V tile loader of the portable kernels (forward_kernel, dq_kernel): K and V tiles of
// kN keys, double-buffered in swizzled shared memory (load_tile_async's layout and zero
// fill), from per-thread row pointers. This thread copies chunk `chunk` of rows
// row0 + kRowStep * i of each tile, so each tile costs one 32x32->64-bit multiply per tensor
// (row_offset) and each row pass one 64-bit step of each pointer, and the shared-memory
// offsets are constants past the first.
#pragma once

#include <cstdint>

#include "tensor_core.cuh"

namespace thdcp::cuda::detail {

template <typename Element, int kN, int kD, int kThreads>
struct KvTileLoader {
  static constexpr int kChunks = kD / 8;
  static constexpr int kRowStep = kThreads / kChunks;
  static constexpr int kPasses = kN * kChunks / kThreads;
  static_assert(kN * kChunks % kThreads == 0 && kRowStep % 8 == 0, "K/V passes keep the swizzle phase");

  // k_tiles, v_tiles: two buffers of kN x kD elements each.
  __device__ __forceinline__ KvTileLoader(const Element* k_, const Element* v_, const Strides& k_strides_,
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

}  // namespace thdcp::cuda::detail
