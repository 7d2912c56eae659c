// dQ on Hopper (sm_90a): dq_kernel's algorithm with warpgroup MMAs instead of mma.sync.
// dq_kernel is bound by shared-memory reads through ldmatrix: each of its four warps reads
// every K and V fragment of a step, and Q and dO again at every step. Here one warpgroup
// owns the block's 64 query rows and the tensor cores read the tiles straight from shared
// memory (wgmma.cuh layout; K/V double-buffered with cp.async), each operand once per
// product for all 64 rows:
//   S = Q K^T, dP = dO V^T   (m64n64k16, Q/dO and K/V read K-major),
//   dS = P (dP - delta)      (registers; P computed while dP is still in flight),
//   dQ += dS K               (m64nDk16, dS from registers, K read MN-major from the same tile).
// Q and dO stay in shared memory rather than in registers as A fragments for the whole loop:
// ptxas (CUDA 13.0) reused the registers of such loop-invariant wgmma A operands for values
// computed inside the loop (seen at D = 64, where dS overwrote dO from the second key tile
// on), and reading A from shared memory costs the same shared-memory traffic as reloading it.
// Same block order, masks and epilogue as dq_kernel; the additions run in a fixed order, so
// the result is deterministic.
#pragma once

#include "attention_backward.cuh"
#include "wgmma.cuh"

namespace thdcp::cuda::detail {

// Head dims kDqk (q, k, dq) and kDv (v, dout).
template <int kDqk, int kDv>
struct DqSm90Shape {
  static constexpr int kTileM = kDqTileRows;  // one warpgroup: 16 rows per warp
  static constexpr int kTileN = 64;
  static constexpr int kThreads = 128;
  static constexpr uint32_t kQkBytes = 64 * kDqk * 2;  // a Q or K tile
  static constexpr uint32_t kVBytes = 64 * kDv * 2;    // a dO or V tile
  // Q, dO, two K and two V buffers (wgmma layout), and the slack that aligns them to 1024
  // bytes: 97 KiB at D = 128, 193 KiB at 256.
  static constexpr size_t kSmemBytes = 3 * (kQkBytes + kVBytes) + 1024;
  // Blocks per SM the registers are bounded for: at D = 64 three fit (49 KiB of shared memory
  // and up to 170 registers each); at D = 128 shared memory allows two; above, one.
  static constexpr int kMinBlocks = kDqk == 64 ? 3 : kDqk + kDv <= 256 ? 2 : 1;
};

template <typename Storage, int kDqk, int kDv>
__global__ void __launch_bounds__(DqSm90Shape<kDqk, kDv>::kThreads, DqSm90Shape<kDqk, kDv>::kMinBlocks)
    dq_kernel_sm90(const BackwardParams p, const BackwardStrides strides) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename StorageTraits<Storage>::Element;
  using Shape = DqSm90Shape<kDqk, kDv>;
  constexpr int kM = Shape::kTileM;
  constexpr int kN = Shape::kTileN;
  constexpr int kThreads = Shape::kThreads;
  static_assert(kM == 64 && kThreads == 128, "one warpgroup of 64 query rows");

  QueryTileWork work;
  if (!work.assign<kM>(p.q_tile_start, p.num_segments, p.segments, p.q_heads, p.kv_heads)) return;
  const Segment& seg = work.seg;
  const Mask mask{p.window_left, p.window_right};
  const VisibleKeyTiles<kN> key_tiles(seg, mask, work.m0, work.valid_q, kM);
  const int n_begin = key_tiles.begin;
  const int n_end = key_tiles.end;

  static_assert(kN == 64, "64-row wgmma tiles");
  extern __shared__ unsigned char smem_raw[];
  const uint32_t q_tile = (smem_address(smem_raw) + 1023u) & ~1023u;
  const uint32_t do_tile = q_tile + Shape::kQkBytes;
  const uint32_t k_base = do_tile + Shape::kVBytes;  // two K buffers, then two V buffers
  const uint32_t v_base = k_base + 2 * Shape::kQkBytes;

  const Element* k = static_cast<const Element*>(p.k);
  const Element* v = static_cast<const Element*>(p.v);

  // Rows past q_len and k_len are zero-filled: padding rows of dout may hold anything.
  load_wgmma_tile_async<kM, kDqk, kThreads>(q_tile, static_cast<const Element*>(p.q), seg.q_row + work.m0, work.valid_q,
                                            strides.q, work.head);
  load_wgmma_tile_async<kM, kDv, kThreads>(do_tile, static_cast<const Element*>(p.dout), seg.q_row + work.m0,
                                           work.valid_q, strides.dout, work.head);
  auto load_kv = [&](int n, int buffer) {
    const int rows = min(kN, seg.k_len - n * kN);
    const uint32_t k_bytes = static_cast<uint32_t>(buffer) * Shape::kQkBytes;
    const uint32_t v_bytes = static_cast<uint32_t>(buffer) * Shape::kVBytes;
    load_wgmma_tile_async<kN, kDqk, kThreads>(k_base + k_bytes, k, seg.k_row + n * kN, rows, strides.k, work.kv_head);
    load_wgmma_tile_async<kN, kDv, kThreads>(v_base + v_bytes, v, seg.k_row + n * kN, rows, strides.v, work.kv_head);
  };
  if (n_begin < n_end) load_kv(n_begin, 0);
  cp_async_commit();

  const auto& [warp, lane, group_row, pair_col] = FragmentLane{};
  const int warp_row0 = warp * 16;

  float lse_log2[2];
  float delta[2];
  load_row_statistics(p, seg, work.head, work.m0, warp_row0 + group_row, work.valid_q, lse_log2, delta);

  float dq[kDqk / 8][4];
  zero_fragments(dq);

  for (int n = n_begin; n < n_end; ++n) {
    const int buffer = (n - n_begin) & 1;
    prefetch_next_and_wait(n + 1 < n_end, [&] { load_kv(n + 1, buffer ^ 1); });
    fence_proxy_async_shared();  // this thread's cp.async data, visible to wgmma
    __syncthreads();
    const uint32_t k_tile = k_base + static_cast<uint32_t>(buffer) * Shape::kQkBytes;
    const uint32_t v_tile = v_base + static_cast<uint32_t>(buffer) * Shape::kVBytes;

    float s[kN / 8][4];
    float dp[kN / 8][4];
    wgmma_ss_k_major_pair<Storage, kN, kM, kN, kDqk / 16, kDv / 16>(s, q_tile, k_tile, dp, do_tile, v_tile);
    wgmma_wait<1>();  // S; dP is still in flight while P is computed
    wgmma_fence_operands(flat(s));
    if (n < key_tiles.unmasked_begin || n >= key_tiles.unmasked_end) {
      mask_row_keys<kN>(seg, mask, work.m0 + warp_row0 + group_row, n * kN, pair_col,
                        [&](int nf, int e) { s[nf][e] = -INFINITY; });
    }
#pragma unroll
    for (int nf = 0; nf < kN / 8; ++nf) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nf][e] = fast_exp2(fmaf(s[nf][e], p.scale_log2, -lse_log2[e >> 1]));
    }
    wgmma_wait<0>();
    wgmma_fence_operands(flat(dp));
    // dS = P (dP - delta): 0 where P is (dP and delta are finite: rows past the valid ones
    // are zero-filled, their statistics 0).
#pragma unroll
    for (int nf = 0; nf < kN / 8; ++nf) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nf][e] *= dp[nf][e] - delta[e >> 1];
    }

    // dQ += dS K (dS rounded to the storage type for the tensor cores).
    uint32_t ds[kN / 16][4];
    accumulator_to_a_fragments<Storage, kN>(s, ds);
    wgmma_fence();
    wgmma_rs_mn_major<Storage, kDqk, kN, kN / 16>(dq, ds, k_tile);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(flat(dq));
    __syncthreads();  // the buffer is refilled by the next step's prefetch
  }
  cp_async_wait<0>();
  store_dq_rows<Storage, kDqk>(p, strides.dq, seg, work.head, work.m0, warp_row0 + group_row, work.span_rows, pair_col,
                               dq);
#endif
}

}  // namespace thdcp::cuda::detail
