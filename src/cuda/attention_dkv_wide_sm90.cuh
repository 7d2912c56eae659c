// dK/dV on Hopper (sm_90a) above head dim 128: dkv_kernel_sm90's algorithm, its per-step
// products split between two warpgroups by operand instead of between two blocks by column.
// A block owns 64 key rows of one KV head and loops over the query heads of the group and
// the query tiles that see the keys (64 queries per step), like dkv_kernel_sm90:
//   the score warpgroup (K, Q):      S^T = K Q^T, P^T = exp(S^T - lse), dS^T = P^T (dP^T -
//                                    delta), dK += dS^T Q;
//   the gradient warpgroup (V, dO):  dP^T = V dO^T, dV += P^T dO.
// Each step they hand each other what the other's product needs through shared memory: the
// score warpgroup P^T (in storage precision, the A fragments of dV's product), the gradient
// warpgroup dP^T - delta (fp32, so that dS^T is the same fp32 product as in one warpgroup).
// Each thread of one warpgroup reads what the thread of the same index in the other wrote:
// the accumulator layouts of S^T and dP^T are the same.
//
// Why: above 128 columns one warpgroup cannot hold dK and dV of every column in registers.
// Column slices in separate blocks (the previous layout) recompute S^T and dP^T once per
// slice: 6 products of 64 x 64 x D per step against these 4, and their 145-199 KiB tiles
// left one warpgroup per SM. Here each warpgroup holds one gradient (dK: D_qk / 2 registers
// per thread, dV: D_v / 2) and the SM runs two warpgroups: the one waiting for the other's
// hand-over, or for its own products, leaves the tensor cores to the other.
//
// Each warpgroup loads the tiles it reads (cp.async, Q and dO double-buffered) and the
// statistic it needs (lse; delta), so that the only synchronisation between them is the
// hand-over. Same tiles, masks, step order and roundings as dkv_kernel_sm90: the same bits.
#pragma once

#include "attention_backward.cuh"
#include "attention_dkv_sm90.cuh"
#include "sm90_pipeline.cuh"
#include "wgmma.cuh"

namespace thdcp::cuda::detail {

// Head dims kDqk (q, k, dk) and kDv (v, dout, dv).
template <int kDqk, int kDv>
struct DkvWideSm90Shape {
  static constexpr int kTileN = kDkvTileRows;  // keys per block: 16 per warp of each warpgroup
  static constexpr int kTileM = 64;            // queries per step
  static constexpr int kThreads = 256;         // the score warpgroup, then the gradient one
  static constexpr uint32_t kQkBytes = 64 * kDqk * 2;  // a K or Q tile
  static constexpr uint32_t kVBytes = 64 * kDv * 2;    // a V or dO tile
  // The hand-over (store_hand_over): a thread's 4 A fragments of P^T (16 registers) and its
  // 8 accumulator fragments of dP^T - delta (32 floats).
  static constexpr uint32_t kPtBytes = 4 * 128 * 16;
  static constexpr uint32_t kDptBytes = 8 * 128 * 16;
  // Byte offsets from the 1024-aligned base: K, V, two Q and two dO buffers, the hand-over,
  // lse and delta of two steps. 217 KiB at 256, 169 KiB at 192, 145 KiB at 192/128.
  static constexpr uint32_t kK = 0;
  static constexpr uint32_t kV = kQkBytes;
  static constexpr uint32_t kQ = kV + kVBytes;
  static constexpr uint32_t kDo = kQ + 2 * kQkBytes;
  static constexpr uint32_t kPt = kDo + 2 * kVBytes;
  static constexpr uint32_t kDpt = kPt + kPtBytes;
  static constexpr uint32_t kStats = kDpt + kDptBytes;
  static constexpr size_t kSmemBytes = kStats + 4 * kTileM * sizeof(float) + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "one block per SM");
  // Named barriers (0 is __syncthreads): each warpgroup's own, and the two hand-overs.
  static constexpr int kScoreBarrier = 1;
  static constexpr int kGradientBarrier = 2;
  static constexpr int kPtReady = 3;
  static constexpr int kDptReady = 4;
};

// The steps of a dK/dV block: step s covers query tile m_begin + s % m_count of head
// kv_head * group + s / m_count, kept as two counters instead of a division per step.
struct DkvStepWalk {
  int m_index = 0;
  int head_index = 0;
  int m_count = 0;

  __device__ __forceinline__ explicit DkvStepWalk(int query_tiles) : m_count(query_tiles) {}
  __device__ __forceinline__ DkvStepWalk next() const {
    DkvStepWalk n = *this;
    if (++n.m_index == m_count) {
      n.m_index = 0;
      ++n.head_index;
    }
    return n;
  }
};

// Threads t < kM of a warpgroup enqueue (cp.async) one row statistic (lse or delta, [Hq,
// q_rows] floats) of query rows [m0, m0 + kM) of `head` into dst[0, kM); rows at and past
// `rows` are zero-filled.
template <int kM>
__device__ __forceinline__ void load_statistic_rows_async(const float* values, int64_t q_rows, const Segment& seg,
                                                          int head, int m0, int rows, float* dst, int t) {
  if (t >= kM) return;
  const bool valid = t < rows;
  const int64_t index = static_cast<int64_t>(head) * q_rows + seg.q_row + m0 + (valid ? t : 0);
  cp_async_4(smem_address(dst + t), values + index, valid);
}

// What both warpgroups of a block know: the block's keys and steps, and shared memory.
struct DkvWideBlock {
  KeyTileWork work;
  int group = 1;   // query heads per KV head
  int steps = 0;   // m_count * group
  uint32_t base = 0;
  float* stats = nullptr;  // lse[2][64], then delta[2][64]
  WarpgroupFragmentLane lane;  // this thread's key rows lane.row, + 8, and query columns
};

// One warpgroup's side of the block: the key tile it holds (K or V: kD columns), the step's
// query tile it reads (Q or dO, double-buffered), the row statistic it needs (lse or delta)
// and the gradient it accumulates (dK or dV).
struct DkvWideSide {
  const void* keys;
  Strides key_strides;
  const void* queries;
  Strides query_strides;
  const float* statistic;
  uint32_t key_tile;
  uint32_t query_tiles;  // two buffers of query_tile_bytes
  uint32_t query_tile_bytes;
  float* statistic_rows;  // two steps of 64
  int barrier;            // the warpgroup's own named barrier
  void* out;              // p.dk_out / p.dv_out
  float* accum;           // p.dk_accum / p.dv_accum
  float scale;            // the softmax scale for dK, 1 for dV
};

// A warpgroup's loop: each step's X = (key tile) (query tile)^T (S^T or dP^T), then `middle`
// (the hand-over) turns X into the A fragments of gradient += A (query tile) (dS^T Q or P^T
// dO); the gradient's rows are added at the end. wgmma groups in flight at step s's wait:
// [the product of s - 1, X of s]; once both have landed the other query buffer is free for the
// prefetch of step s + 1.
template <typename Storage, int kD, typename Middle>
__device__ __forceinline__ void dkv_wide_side(const BackwardParams& p, const DkvWideBlock& b, const DkvWideSide& side,
                                              Middle&& middle) {
  using Element = typename StorageTraits<Storage>::Element;
  constexpr int kN = kDkvTileRows;
  constexpr int kM = 64;
  const Segment& seg = b.work.seg;
  const KeyTileWork& w = b.work;

  load_wgmma_tile_async_from<kN, kD, 128>(side.key_tile, static_cast<const Element*>(side.keys), seg.k_row + w.n0,
                                          w.valid_k, side.key_strides, w.kv_head, b.lane.t);
  const auto load_queries = [&](const DkvStepWalk& at, int buffer) {
    const int head = w.kv_head * b.group + at.head_index;
    const int m0 = (w.m_begin + at.m_index) * kM;
    const int rows = max(0, min(kM, seg.q_len - m0));
    load_wgmma_tile_async_from<kM, kD, 128>(side.query_tiles + static_cast<uint32_t>(buffer) * side.query_tile_bytes,
                                            static_cast<const Element*>(side.queries), seg.q_row + m0, rows,
                                            side.query_strides, head, b.lane.t);
    load_statistic_rows_async<kM>(side.statistic, p.q_rows, seg, head, m0, rows, side.statistic_rows + buffer * kM,
                                  b.lane.t);
  };
  DkvStepWalk at(w.m_count);
  load_queries(at, 0);
  cp_async_commit();

  float gradient[kD / 8][4];
  zero_fragments(gradient);

  for (int step = 0; step < b.steps; ++step) {
    const int buffer = step & 1;
    const DkvStepWalk next = at.next();
    cp_async_wait<0>();          // this step's query tile and statistic (and on step 0 the keys)
    fence_proxy_async_shared();  // this thread's cp.async data, visible to wgmma
    named_barrier_sync(side.barrier, 128);
    const uint32_t query_tile = side.query_tiles + static_cast<uint32_t>(buffer) * side.query_tile_bytes;

    float x[kM / 8][4];
    wgmma_fence();
    wgmma_ss_k_major<Storage, kM, kN, kM, kD / 16>(x, side.key_tile, query_tile);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(flat(x));
    wgmma_fence_operands(flat(gradient));
    named_barrier_sync(side.barrier, 128);  // every warp's: the other query buffer is free
    if (step + 1 < b.steps) load_queries(next, buffer ^ 1);
    cp_async_commit();

    uint32_t a[kM / 16][4];
    middle(x, a, side.statistic_rows + buffer * kM, (w.m_begin + at.m_index) * kM);
    wgmma_fence();
    wgmma_rs_mn_major<Storage, kD, kM, kM / 16>(gradient, a, query_tile);
    wgmma_commit();
    at = next;
  }
  wgmma_wait<0>();
  wgmma_fence_operands(flat(gradient));
  add_key_gradient_rows<Storage, kD>(p, side.out, side.accum, side.scale, seg, w.kv_head, w.n0, b.lane.row, w.valid_k,
                                     b.lane.pair_col, gradient);
}

// The score warpgroup: S^T -> P^T, handed over; dS^T = P^T (dP^T - delta) from the
// handed-over dP^T - delta; dK.
template <typename Storage, int kDqk, int kDv>
__device__ __forceinline__ void dkv_wide_score(const BackwardParams& p, const BackwardStrides& strides,
                                               const DkvWideBlock& b) {
  using Shape = DkvWideSm90Shape<kDqk, kDv>;
  constexpr int kN = Shape::kTileN;
  constexpr int kM = Shape::kTileM;
  const Segment& seg = b.work.seg;
  const KeyTileWork& w = b.work;
  const Mask mask{p.window_left, p.window_right};
  const DkvWideSide side{p.k,       strides.k,    p.q,      strides.q, p.lse,      b.base + Shape::kK,
                         b.base + Shape::kQ,      Shape::kQkBytes,     b.stats,   Shape::kScoreBarrier,
                         p.dk_out,  p.dk_accum,   p.scale};
  const uint32_t pt_slot = b.base + Shape::kPt + static_cast<uint32_t>(b.lane.t) * 16;
  const uint32_t dpt_slot = b.base + Shape::kDpt + static_cast<uint32_t>(b.lane.t) * 16;
  dkv_wide_side<Storage, kDqk>(p, b, side, [&](float(&st)[kM / 8][4], uint32_t(&dst)[kM / 16][4],
                                               const float* lse_tile, int m0) {
    dkv_step_probabilities<kM>(st, seg, mask, w.n0, b.lane.row, m0, b.lane.pair_col,
                               dkv_step_unmasked(seg, mask, w.n0, w.valid_k, kN, m0, kM), lse_tile, p.scale_log2);
    uint32_t pt[kM / 16][4];
    accumulator_to_a_fragments<Storage, kM>(st, pt);
    store_hand_over(pt_slot, pt);
    named_barrier_sync_across(Shape::kPtReady, 256);
    named_barrier_sync_across(Shape::kDptReady, 256);
    uint32_t dpt[kM / 8][4];
    load_hand_over(dpt_slot, dpt);
#pragma unroll
    for (int nf = 0; nf < kM / 8; ++nf) {
#pragma unroll
      for (int e = 0; e < 4; ++e) st[nf][e] *= __uint_as_float(dpt[nf][e]);
    }
    accumulator_to_a_fragments<Storage, kM>(st, dst);
  });
}

// The gradient warpgroup: dP^T - delta, handed over; P^T taken over; dV. The hand-over,
// both barriers over both warpgroups: P^T is read here between kPtReady and kDptReady, and
// the score warpgroup writes the next one after kDptReady; dP^T - delta is read there between
// kDptReady and the next kPtReady, after which this one writes the next. So one buffer of
// each suffices. (The score warpgroup waits at kPtReady for what it would wait for at
// kDptReady anyway, and this one at kDptReady for a warpgroup that is already there.)
template <typename Storage, int kDqk, int kDv>
__device__ __forceinline__ void dkv_wide_gradient(const BackwardParams& p, const BackwardStrides& strides,
                                                  const DkvWideBlock& b) {
  using Shape = DkvWideSm90Shape<kDqk, kDv>;
  constexpr int kM = Shape::kTileM;
  const DkvWideSide side{p.v,        strides.v,     p.dout,   strides.dout, p.delta, b.base + Shape::kV,
                         b.base + Shape::kDo,       Shape::kVBytes,         b.stats + 2 * kM, Shape::kGradientBarrier,
                         p.dv_out,   p.dv_accum,    1.0f};
  const uint32_t pt_slot = b.base + Shape::kPt + static_cast<uint32_t>(b.lane.t) * 16;
  const uint32_t dpt_slot = b.base + Shape::kDpt + static_cast<uint32_t>(b.lane.t) * 16;
  dkv_wide_side<Storage, kDv>(p, b, side, [&](float(&dpt)[kM / 8][4], uint32_t(&pt)[kM / 16][4],
                                              const float* delta_tile, int /*m0*/) {
#pragma unroll
    for (int nf = 0; nf < kM / 8; ++nf) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float row_delta = delta_tile[nf * 8 + b.lane.pair_col + c];
        dpt[nf][c] -= row_delta;
        dpt[nf][2 + c] -= row_delta;
      }
    }
    named_barrier_sync_across(Shape::kPtReady, 256);
    load_hand_over(pt_slot, pt);
    store_hand_over(dpt_slot, reinterpret_cast<const uint32_t(&)[kM / 8][4]>(dpt));
    named_barrier_sync_across(Shape::kDptReady, 256);
  });
}

template <typename Storage, int kDqk, int kDv>
__global__ void __launch_bounds__(DkvWideSm90Shape<kDqk, kDv>::kThreads, 1)
    dkv_wide_kernel_sm90(const BackwardParams p, const BackwardStrides strides) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Shape = DkvWideSm90Shape<kDqk, kDv>;
  DkvWideBlock b;
  const Mask mask{p.window_left, p.window_right};
  if (!b.work.assign<Shape::kTileN, Shape::kTileM>(p.k_tile_start, p.num_segments, p.segments, p.kv_heads, mask)) {
    return;
  }
  b.group = p.q_heads / p.kv_heads;
  b.steps = b.work.m_count * b.group;
  if (b.steps == 0) return;  // no query sees these keys: their gradients stay 0

  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_address = smem_address(smem_raw);
  b.base = (raw_address + 1023u) & ~1023u;
  b.stats = reinterpret_cast<float*>(smem_raw + (b.base + Shape::kStats - raw_address));
  b.lane = warpgroup_fragment_lane();
  if (threadIdx.x < 128) {
    dkv_wide_score<Storage, kDqk, kDv>(p, strides, b);
  } else {
    dkv_wide_gradient<Storage, kDqk, kDv>(p, strides, b);
  }
#endif
}

}  // namespace thdcp::cuda::detail
