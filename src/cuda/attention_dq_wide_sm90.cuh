// dQ on Hopper (sm_90a) at head dim 256: dq_kernel_sm90's algorithm with its dP product
// moved to a second warpgroup. A block owns 64 query rows of one query head and loops over
// the key tiles they see (64 keys per step), like dq_kernel_sm90:
//   the score warpgroup (Q, K):      S = Q K^T, P = exp(S - lse), dS = P (dP - delta),
//                                    dQ += dS K;
//   the gradient warpgroup (dO, V):  dP = dO V^T, dP - delta handed over (fp32).
// Why: at 256 dq_kernel_sm90's one warpgroup per block is alone on its SM (its tiles take
// 193 KiB) and spills. Here the SM runs two warpgroups, and the dP product of a step runs
// beside the score warpgroup's dQ product of the step before. At 192 and 192/128 the one
// warpgroup measured faster (sm90_dq_wide), so this pass runs at 256 only.
//
// Each warpgroup loads the tiles it reads (cp.async, K and V double-buffered), so the only
// synchronisation between them is the hand-over of dP - delta, double-buffered: the gradient
// warpgroup writes the buffer of step s + 2 only after the barrier of step s + 1, which the
// score warpgroup reaches after it has read step s's. Same tiles, masks, step order and
// roundings as dq_kernel_sm90: the same bits.
#pragma once

#include "attention_backward.cuh"
#include "sm90_pipeline.cuh"
#include "wgmma.cuh"

namespace thdcp::cuda::detail {

// Head dims kDqk (q, k, dq) and kDv (v, dout).
template <int kDqk, int kDv>
struct DqWideSm90Shape {
  static constexpr int kTileM = kDqTileRows;  // 16 rows per warp of each warpgroup
  static constexpr int kTileN = 64;
  static constexpr int kThreads = 256;        // the score warpgroup, then the gradient one
  static constexpr uint32_t kQkBytes = 64 * kDqk * 2;  // a Q or K tile
  static constexpr uint32_t kVBytes = 64 * kDv * 2;    // a dO or V tile
  static constexpr uint32_t kDpBytes = 8 * 128 * 16;   // dP - delta: 32 floats a thread (store_hand_over)
  // Byte offsets from the 1024-aligned base: Q, dO, two K and two V buffers, two hand-over
  // buffers. 225 KiB at 256, 169 KiB at 192, 137 KiB at 192/128.
  static constexpr uint32_t kQ = 0;
  static constexpr uint32_t kDo = kQkBytes;
  static constexpr uint32_t kK = kDo + kVBytes;
  static constexpr uint32_t kV = kK + 2 * kQkBytes;
  static constexpr uint32_t kDp = kV + 2 * kVBytes;
  static constexpr size_t kSmemBytes = kDp + 2 * kDpBytes + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "one block per SM");
  // Named barriers (0 is __syncthreads): each warpgroup's own, and the hand-over.
  static constexpr int kScoreBarrier = 1;
  static constexpr int kGradientBarrier = 2;
  static constexpr int kDpReady = 3;
};

// What both warpgroups of a block know.
struct DqWideBlock {
  QueryTileWork work;
  int n_begin = 0, n_end = 0;                  // the key tiles the block's queries see
  int unmasked_begin = 0, unmasked_end = 0;    // those that need no per-element mask
  uint32_t base = 0;
  WarpgroupFragmentLane lane;  // this thread's query rows lane.row, + 8, and key columns
};

// One warpgroup's side of the block: the query tile it holds (Q or dO: kD columns) and the
// key tiles it reads (K or V, double-buffered).
struct DqWideSide {
  const void* queries;
  Strides query_strides;
  const void* keys;
  Strides key_strides;
  uint32_t query_tile;
  uint32_t key_tiles;  // two buffers of key_tile_bytes
  uint32_t key_tile_bytes;
  int barrier;  // the warpgroup's own named barrier
};

// A warpgroup's loop: each step's X = (query tile) (key tile)^T (S or dP), handed to
// `middle` with the step's key tile; `drain` runs before the step's barrier (the score
// warpgroup waits there for its last dQ product, which read the buffer the prefetch refills).
// lse (log2) and delta of this thread's rows go to middle too.
template <typename Storage, int kD, typename Drain, typename Middle>
__device__ __forceinline__ void dq_wide_side(const BackwardParams& p, const DqWideBlock& b, const DqWideSide& side,
                                             Drain&& drain, Middle&& middle) {
  using Element = typename StorageTraits<Storage>::Element;
  constexpr int kM = kDqTileRows;
  constexpr int kN = 64;
  const QueryTileWork& w = b.work;
  const Segment& seg = w.seg;

  // Rows past q_len and k_len are zero-filled (padding rows of dout may hold anything).
  load_wgmma_tile_async_from<kM, kD, 128>(side.query_tile, static_cast<const Element*>(side.queries),
                                          seg.q_row + w.m0, w.valid_q, side.query_strides, w.head, b.lane.t);
  const auto load_keys = [&](int n, int buffer) {
    load_wgmma_tile_async_from<kN, kD, 128>(side.key_tiles + static_cast<uint32_t>(buffer) * side.key_tile_bytes,
                                            static_cast<const Element*>(side.keys), seg.k_row + n * kN,
                                            min(kN, seg.k_len - n * kN), side.key_strides, w.kv_head, b.lane.t);
  };
  if (b.n_begin < b.n_end) load_keys(b.n_begin, 0);
  cp_async_commit();

  float lse_log2[2];
  float delta[2];
  load_row_statistics(p, seg, w.head, w.m0, b.lane.row, w.valid_q, lse_log2, delta);

  for (int n = b.n_begin; n < b.n_end; ++n) {
    const int buffer = (n - b.n_begin) & 1;
    cp_async_wait<0>();          // this step's key tile (and on the first the query tile)
    fence_proxy_async_shared();  // this thread's cp.async data, visible to wgmma
    drain();
    // Every warp's: the key tile is in, and the last step's products (which read the other
    // buffer) have landed in each.
    named_barrier_sync(side.barrier, 128);
    if (n + 1 < b.n_end) load_keys(n + 1, buffer ^ 1);
    cp_async_commit();
    const uint32_t key_tile = side.key_tiles + static_cast<uint32_t>(buffer) * side.key_tile_bytes;

    float x[kN / 8][4];
    wgmma_fence();
    wgmma_ss_k_major<Storage, kN, kM, kN, kD / 16>(x, side.query_tile, key_tile);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(flat(x));
    middle(x, n, buffer, key_tile, lse_log2, delta);
  }
}

// The score warpgroup: S -> P, dS = P (dP - delta) from the handed-over dP - delta, dQ;
// stores dQ. It waits for dQ of step n - 1 before it issues S: then the other K buffer is
// free and the prefetch of step n + 1 has the whole step to land (issued after S had landed,
// it arrived late at 192 columns).
template <typename Storage, int kDqk, int kDv>
__device__ __forceinline__ void dq_wide_score(const BackwardParams& p, const BackwardStrides& strides,
                                              const DqWideBlock& b) {
  using Shape = DqWideSm90Shape<kDqk, kDv>;
  constexpr int kN = Shape::kTileN;
  const QueryTileWork& w = b.work;
  const Segment& seg = w.seg;
  const Mask mask{p.window_left, p.window_right};
  const DqWideSide side{p.q,         strides.q,          p.k,        strides.k, b.base + Shape::kQ,
                        b.base + Shape::kK, Shape::kQkBytes, Shape::kScoreBarrier};
  float dq[kDqk / 8][4];
  zero_fragments(dq);
  const uint32_t dp_slot = b.base + Shape::kDp + static_cast<uint32_t>(b.lane.t) * 16;

  const auto drain = [&] {
    wgmma_wait<0>();  // dQ of the last step
    wgmma_fence_operands(flat(dq));
  };
  dq_wide_side<Storage, kDqk>(p, b, side, drain, [&](float(&s)[kN / 8][4], int n, int buffer, uint32_t k_tile,
                                                     const float(&lse_log2)[2], const float(&)[2]) {
    if (n < b.unmasked_begin || n >= b.unmasked_end) {
      mask_row_keys<kN>(seg, mask, w.m0 + b.lane.row, n * kN, b.lane.pair_col,
                        [&](int nf, int e) { s[nf][e] = -INFINITY; });
    }
#pragma unroll
    for (int nf = 0; nf < kN / 8; ++nf) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nf][e] = fast_exp2(fmaf(s[nf][e], p.scale_log2, -lse_log2[e >> 1]));
    }
    // dS = P (dP - delta): 0 where P is (dP and delta are finite).
    named_barrier_sync_across(Shape::kDpReady, 256);
    uint32_t dp[kN / 8][4];
    load_hand_over(dp_slot + static_cast<uint32_t>(buffer) * Shape::kDpBytes, dp);
#pragma unroll
    for (int nf = 0; nf < kN / 8; ++nf) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nf][e] *= __uint_as_float(dp[nf][e]);
    }
    // dQ += dS K (dS rounded to the storage type for the tensor cores).
    uint32_t ds[kN / 16][4];
    accumulator_to_a_fragments<Storage, kN>(s, ds);
    wgmma_fence();
    wgmma_rs_mn_major<Storage, kDqk, kN, kN / 16>(dq, ds, k_tile);
    wgmma_commit();
  });
  drain();
  cp_async_wait<0>();
  store_dq_rows<Storage, kDqk>(p, strides.dq, seg, w.head, w.m0, b.lane.row, w.span_rows, b.lane.pair_col, dq);
}

// The gradient warpgroup: dP - delta of each step, handed over.
template <typename Storage, int kDqk, int kDv>
__device__ __forceinline__ void dq_wide_gradient(const BackwardParams& p, const BackwardStrides& strides,
                                                 const DqWideBlock& b) {
  using Shape = DqWideSm90Shape<kDqk, kDv>;
  constexpr int kN = Shape::kTileN;
  const DqWideSide side{p.dout,      strides.dout,       p.v,       strides.v, b.base + Shape::kDo,
                        b.base + Shape::kV, Shape::kVBytes, Shape::kGradientBarrier};
  const uint32_t dp_slot = b.base + Shape::kDp + static_cast<uint32_t>(b.lane.t) * 16;
  dq_wide_side<Storage, kDv>(p, b, side, [] {}, [&](float(&dp)[kN / 8][4], int, int buffer, uint32_t,
                                                   const float(&)[2], const float(&delta)[2]) {
#pragma unroll
    for (int nf = 0; nf < kN / 8; ++nf) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[nf][e] -= delta[e >> 1];
    }
    store_hand_over(dp_slot + static_cast<uint32_t>(buffer) * Shape::kDpBytes,
                    reinterpret_cast<const uint32_t(&)[kN / 8][4]>(dp));
    named_barrier_sync_across(Shape::kDpReady, 256);
  });
  cp_async_wait<0>();
}

template <typename Storage, int kDqk, int kDv>
__global__ void __launch_bounds__(DqWideSm90Shape<kDqk, kDv>::kThreads, 1)
    dq_wide_kernel_sm90(const BackwardParams p, const BackwardStrides strides) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Shape = DqWideSm90Shape<kDqk, kDv>;
  constexpr int kM = Shape::kTileM;
  constexpr int kN = Shape::kTileN;
  DqWideBlock b;
  if (!b.work.assign<kM>(p.q_tile_start, p.num_segments, p.segments, p.q_heads, p.kv_heads)) return;
  const VisibleKeyTiles<kN> key_tiles(b.work.seg, Mask{p.window_left, p.window_right}, b.work.m0, b.work.valid_q, kM);
  b.n_begin = key_tiles.begin;
  b.n_end = key_tiles.end;
  b.unmasked_begin = key_tiles.unmasked_begin;
  b.unmasked_end = key_tiles.unmasked_end;

  extern __shared__ unsigned char smem_raw[];
  b.base = (smem_address(smem_raw) + 1023u) & ~1023u;
  b.lane = warpgroup_fragment_lane();
  if (threadIdx.x < 128) {
    dq_wide_score<Storage, kDqk, kDv>(p, strides, b);
  } else {
    dq_wide_gradient<Storage, kDqk, kDv>(p, strides, b);
  }
#endif
}

}  // namespace thdcp::cuda::detail
