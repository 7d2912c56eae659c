// The forward on Hopper (sm_90a): forward_kernel's algorithm with warpgroup MMAs. One
// warpgroup owns a query tile of 64 rows (16 per warp); K/V tiles of 64 keys stream through a
// cp.async double buffer, and the tensor cores read Q, K and V straight from shared memory
// (wgmma.cuh layout):
//   S = Q K^T          (m64n64k16, Q and K read K-major),
//   online softmax     (registers, online_softmax_step),
//   O += P V           (m64nDk16, P from registers, V read MN-major).
// Same block order, masks and epilogue as forward_kernel.
#pragma once

#include "attention_forward.cuh"
#include "wgmma.cuh"

namespace thdcp::cuda::detail {

template <int kHeadDim>
struct ForwardSm90Shape {
  static constexpr int kTileM = kForwardSm90TileRows;  // one warpgroup: 16 rows per warp
  static constexpr int kTileN = 64;
  static constexpr int kThreads = 128;
  static constexpr uint32_t kTileBytes = 64 * kHeadDim * 2;
  // Q, two K and two V buffers (wgmma layout), and the slack that aligns them to 1024 bytes:
  // 81 KiB at D = 128, two blocks per SM.
  static constexpr size_t kSmemBytes = 5 * kTileBytes + 1024;
};

template <typename Storage, int kHeadDim>
__global__ void __launch_bounds__(ForwardSm90Shape<kHeadDim>::kThreads, 2)
    forward_kernel_sm90(const ForwardParams p, const ForwardStrides strides) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Traits = StorageTraits<Storage>;
  using Element = typename Traits::Element;
  using Shape = ForwardSm90Shape<kHeadDim>;
  constexpr int kM = Shape::kTileM;
  constexpr int kN = Shape::kTileN;
  constexpr int kD = kHeadDim;
  constexpr int kThreads = Shape::kThreads;
  static_assert(kM == 64 && kN == 64 && kThreads == 128, "one warpgroup, 64-row wgmma tiles");

  QueryTileWork work;
  if (!work.assign<kM>(p.tile_start, p.num_segments, p.segments, p.q_heads, p.kv_heads)) return;
  const Segment& seg = work.seg;
  const int head = work.head, kv_head = work.kv_head, m0 = work.m0, span_rows = work.span_rows, valid_q = work.valid_q;
  const Mask mask{p.window_left, p.window_right};
  const VisibleKeyTiles<kN> key_tiles(seg, mask, m0, valid_q, kM);
  const int n_begin = key_tiles.begin;
  const int n_end = key_tiles.end;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t q_tile = (smem_address(smem_raw) + 1023u) & ~1023u;
  const uint32_t k_base = q_tile + Shape::kTileBytes;  // two K buffers, then two V buffers
  const uint32_t v_base = k_base + 2 * Shape::kTileBytes;

  const Element* k = static_cast<const Element*>(p.k);
  const Element* v = static_cast<const Element*>(p.v);

  // Rows past q_len and k_len are zero-filled.
  load_wgmma_tile_async<kM, kD, kThreads>(q_tile, static_cast<const Element*>(p.q), seg.q_row + m0, valid_q,
                                          strides.q, head);
  auto load_kv = [&](int n, int buffer) {
    const int rows = min(kN, seg.k_len - n * kN);
    const uint32_t buffer_bytes = static_cast<uint32_t>(buffer) * Shape::kTileBytes;
    load_wgmma_tile_async<kN, kD, kThreads>(k_base + buffer_bytes, k, seg.k_row + n * kN, rows, strides.k, kv_head);
    load_wgmma_tile_async<kN, kD, kThreads>(v_base + buffer_bytes, v, seg.k_row + n * kN, rows, strides.v, kv_head);
  };
  if (n_begin < n_end) load_kv(n_begin, 0);
  cp_async_commit();

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int group_row = lane >> 2;
  const int pair_col = (lane & 3) * 2;
  const int warp_row0 = warp * 16;

  float o[kD / 8][4];
  float row_max[2] = {-INFINITY, -INFINITY};  // raw (unscaled) scores
  float row_sum[2] = {0.0f, 0.0f};            // this thread's part of the denominator
#pragma unroll
  for (int i = 0; i < kD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;

  for (int n = n_begin; n < n_end; ++n) {
    const int buffer = (n - n_begin) & 1;
    prefetch_next_and_wait(n + 1 < n_end, [&] { load_kv(n + 1, buffer ^ 1); });
    fence_proxy_async_shared();  // this thread's cp.async data, visible to wgmma
    __syncthreads();
    const uint32_t k_tile = k_base + static_cast<uint32_t>(buffer) * Shape::kTileBytes;
    const uint32_t v_tile = v_base + static_cast<uint32_t>(buffer) * Shape::kTileBytes;

    float s[kN / 8][4];
    wgmma_fence();
    wgmma_ss_k_major<Storage, kN, kM, kN, kD / 16>(s, q_tile, k_tile);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(flat(s));

    if (n < key_tiles.unmasked_begin || n >= key_tiles.unmasked_end) {
      mask_row_keys<kN>(seg, mask, m0 + warp_row0 + group_row, n * kN, pair_col,
                        [&](int nf, int e) { s[nf][e] = -INFINITY; });
    }
    online_softmax_step<kN, kD>(s, o, row_max, row_sum, p.scale_log2);

    // O += P V, with P rounded to the storage type for the tensor cores.
    uint32_t pa[kN / 16][4];
    accumulator_to_a_fragments<Storage, kN>(s, pa);
    wgmma_fence();
    wgmma_rs_mn_major<Storage, kD, kN, kN / 16>(o, pa, v_tile);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(flat(o));
    __syncthreads();  // the buffer is refilled by the next iteration's prefetch
  }
  cp_async_wait<0>();

  float thread_max = -INFINITY;
  store_forward_rows<Storage, kD>(p, strides.out, seg, head, m0, warp_row0 + group_row, span_rows, pair_col, o,
                                  row_max, row_sum, thread_max);
  reduce_max_logit(p, head, thread_max);
#endif
}

}  // namespace thdcp::cuda::detail
