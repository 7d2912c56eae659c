// The forward kernel: one block per (query tile of a segment, query head), FA2-style.
//
// Four warps share a 128-row query tile; each owns 32 rows (two MMA fragments), or 16 rows of
// a 64-row tile above D_v 128. Key/value tiles of 64 rows stream through a double buffer
// filled by cp.async while the previous tile is used. Only
// the key tiles that the mask leaves visible to some row of the query tile are visited, and
// only tiles that straddle the mask's edge (or the segment's end) evaluate it per element.
#pragma once

#include <cmath>

#include "epilogue.cuh"
#include "softmax.cuh"
#include "tensor_core.cuh"
#include "kv_loader.cuh"
#include "tile_ranges.cuh"
#include "tile_shapes.h"
#include "thdcp/cuda/check.h"
#include "thdcp/plan/mask.h"
#include "thdcp/plan/segment.h"

namespace thdcp::cuda::detail {

// Shared-memory byte addresses of this lane's ldmatrix rows in a swizzled tile (the layout of
// tensor_core.cuh), for the four 16-column steps kl = 0..3 of each 64-column group: row
// `row` (row & 7 == lane & 7 for every fragment the forward reads), 16-byte chunk
// 2 * kl + half. Column step kk then reads at address[kk % 4] + 128 * (kk / 4) bytes and
// 16-row steps at + 32 * kRowElements bytes, constants the compiler folds into the loads.
template <int kRowElements>
__device__ __forceinline__ void swizzled_step_addresses(uint32_t (&address)[4], uint32_t tile, int row, int half) {
  const int x = static_cast<int>(threadIdx.x) & 7;
#pragma unroll
  for (int kl = 0; kl < 4; ++kl) {
    address[kl] = tile + static_cast<uint32_t>(row * kRowElements * 2 + (((2 * kl + half) ^ x) << 4));
  }
}

// Head dims kDqk (q, k) and kDv (v, out); shared-memory rows of kQkRow and kVRow elements.
template <int kDqk, int kDv>
struct ForwardShape {
  static constexpr int kTileM = forward_portable_tile_rows(kDv);
  static constexpr int kTileN = 64;
  // 32 query rows per warp: each K/V fragment read from shared memory feeds two MMAs; 16
  // above D_v 128.
  static constexpr int kFragmentsPerWarp = kTileM / 64;
  static constexpr int kWarps = kTileM / (16 * kFragmentsPerWarp);
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kQkRow = smem_row_elements(kDqk);
  static constexpr int kVRow = smem_row_elements(kDv);
  static constexpr size_t kSmemBytes = ((kTileM + 2 * kTileN) * kQkRow + 2 * kTileN * kVRow) * 2;
};

// Registers: at head_dim 128 this kernel needs a few more than the 255 a thread can have
// (two 16-row fragments of O and S per warp), and ptxas (CUDA 13.0) spills 40 bytes in the
// sm_80 cubin and 52 in the sm_90a one, all on the masked-tile path and outside the loop
// (none on the unmasked path). Kept: the 32-row-per-warp tile feeds two MMAs from each K/V
// fragment read and was measured faster than 16 rows per warp (bench/RESULTS.md); the
// instruction count per key tile, not the spill, limits it. Hopper runs
// forward_kernel_sm90 (no spill) unless THDCP_PORTABLE_KERNELS=1. Configure with
// -DTHDCP_WARN_SPILLS=ON to see ptxas's report.
template <typename Storage, int kDqk, int kDv>
__global__ void __launch_bounds__(ForwardShape<kDqk, kDv>::kThreads)
    forward_kernel(const ForwardParams p, const ForwardStrides strides) {
  using Element = typename StorageTraits<Storage>::Element;
  using Shape = ForwardShape<kDqk, kDv>;
  constexpr int kM = Shape::kTileM;
  constexpr int kN = Shape::kTileN;
  constexpr int kQkRow = Shape::kQkRow;
  constexpr int kVRow = Shape::kVRow;
  constexpr int kThreads = Shape::kThreads;
  constexpr int kMF = Shape::kFragmentsPerWarp;

  QueryTileWork work;
  if (!work.assign<kM>(p.tile_start, p.num_segments, p.segments, p.q_heads, p.kv_heads)) return;
  const Segment& seg = work.seg;
  const Mask mask{p.window_left, p.window_right};
  // Key tiles that some row of this tile sees, and those every row sees whole.
  const VisibleKeyTiles<kN> key_tiles(seg, mask, work.m0, work.valid_q, kM);
  const int n_begin = key_tiles.begin;
  const int n_end = key_tiles.end;

  extern __shared__ __align__(128) unsigned char smem[];
  Element* q_tile = reinterpret_cast<Element*>(smem);
  Element* k_tiles = q_tile + kM * kQkRow;
  Element* v_tiles = k_tiles + 2 * kN * kQkRow;

  const Element* q = static_cast<const Element*>(p.q);
  const Element* k = static_cast<const Element*>(p.k);
  const Element* v = static_cast<const Element*>(p.v);

  load_tile_async<kM, kDqk, kThreads, kQkRow>(q_tile, q, seg.q_row + work.m0, work.valid_q, strides.q, work.head);
  const KvTileLoader<Element, kN, kDqk, kDv, kThreads> kv(k, v, strides.k, strides.v, seg, work.kv_head, k_tiles,
                                                          v_tiles);
  if (n_begin < n_end) kv.load(n_begin, 0);
  cp_async_commit();

  const auto& [warp, lane, group_row, pair_col] = FragmentLane{};
  const int warp_row0 = warp * 16 * kMF;

  // ldmatrix addresses (see swizzled_step_addresses): Q A-fragments (rows warp_row0 +
  // lane % 16, chunk half lane / 16), K B-fragments (rows lane % 8 + 8 * (lane / 16), half
  // (lane / 8) % 2), V transposed B-fragments (rows lane % 16, half lane / 16); K and V of
  // buffer 0.
  uint32_t q_address[4];
  uint32_t k_address[4];
  uint32_t v_address[4];
  swizzled_step_addresses<kQkRow>(q_address, smem_address(q_tile), warp_row0 + (lane & 15), lane >> 4);
  swizzled_step_addresses<kQkRow>(k_address, smem_address(k_tiles), (lane & 7) + ((lane >> 4) << 3),
                                  (lane >> 3) & 1);
  swizzled_step_addresses<kVRow>(v_address, smem_address(v_tiles), lane & 15, lane >> 4);

  // Fragment mi of the warp covers tile rows warp_row0 + 16 * mi + [0, 16); of it this
  // thread holds rows group_row and group_row + 8 ("halves").
  float o[kMF][kDv / 8][4];
  float row_max[kMF][2];  // raw (unscaled) scores
  float row_sum[kMF][2];  // this thread's part of the denominator
#pragma unroll
  for (int mi = 0; mi < kMF; ++mi) {
    zero_fragments(o[mi]);
    row_max[mi][0] = row_max[mi][1] = -INFINITY;
    row_sum[mi][0] = row_sum[mi][1] = 0.0f;
  }

  for (int n = n_begin; n < n_end; ++n) {
    const int buffer = (n - n_begin) & 1;
    prefetch_next_and_wait(n + 1 < n_end, [&] { kv.load(n + 1, buffer ^ 1); });
    __syncthreads();
    const uint32_t k_buffer_bytes = static_cast<uint32_t>(buffer * kN * kQkRow * 2);
    const uint32_t v_buffer_bytes = static_cast<uint32_t>(buffer * kN * kVRow * 2);

    // S = Q K^T; each K fragment serves the warp's kMF query fragments.
    float s[kMF][kN / 8][4];
#pragma unroll
    for (int mi = 0; mi < kMF; ++mi) zero_fragments(s[mi]);
#pragma unroll
    for (int kk = 0; kk < kDqk / 16; ++kk) {
      uint32_t a[kMF][4];
#pragma unroll
      for (int mi = 0; mi < kMF; ++mi) {
        ldmatrix_x4(a[mi], q_address[kk & 3] + (kk >> 2) * 128 + mi * 16 * kQkRow * 2);
      }
      mma_k_step<Storage>(s, a, [&](uint32_t(&b)[4], int np) {
        ldmatrix_x4(b, k_address[kk & 3] + k_buffer_bytes + (kk >> 2) * 128 + np * 16 * kQkRow * 2);
      });
    }

    if (n < key_tiles.unmasked_begin || n >= key_tiles.unmasked_end) {
#pragma unroll
      for (int mi = 0; mi < kMF; ++mi) {
        mask_row_keys<kN>(seg, mask, work.m0 + warp_row0 + 16 * mi + group_row, n * kN, pair_col,
                          [&](int nf, int e) { s[mi][nf][e] = -INFINITY; });
      }
    }

#pragma unroll
    for (int mi = 0; mi < kMF; ++mi) online_softmax_step<kN, kDv>(s[mi], o[mi], row_max[mi], row_sum[mi], p.scale_log2);

    // O += P V, with P rounded to the storage type for the tensor cores; each V fragment
    // serves the warp's kMF fragments.
#pragma unroll
    for (int j = 0; j < kN / 16; ++j) {
      uint32_t a[kMF][4];
#pragma unroll
      for (int mi = 0; mi < kMF; ++mi) accumulator_to_a_fragment<Storage>(s[mi][2 * j], s[mi][2 * j + 1], a[mi]);
      mma_k_step<Storage>(o, a, [&](uint32_t(&b)[4], int dp) {
        ldmatrix_x4_trans(b, v_address[dp & 3] + v_buffer_bytes + (dp >> 2) * 128 + j * 16 * kVRow * 2);
      });
    }
    __syncthreads();  // the buffer is refilled by the next iteration
  }
  cp_async_wait<0>();

  float thread_max = -INFINITY;
#pragma unroll
  for (int mi = 0; mi < kMF; ++mi) {
    store_forward_rows<Storage, kDv>(p, strides.out, seg, work.head, work.m0, warp_row0 + 16 * mi + group_row,
                                     work.span_rows, pair_col, o[mi], row_max[mi], row_sum[mi], thread_max);
  }
  reduce_max_logit(p, work.head, thread_max);
}

}  // namespace thdcp::cuda::detail
