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
  int t = 0;               // thread of the warpgroup
  int key_row = 0;         // this thread's key rows: key_row, key_row + 8
  int pair_col = 0;        // and query columns 8 nf + pair_col + {0, 1}
};

// The score warpgroup: S^T, P^T handed over, dS^T from the handed-over dP^T - delta, dK.
template <typename Storage, int kDqk, int kDv>
__device__ __forceinline__ void dkv_wide_score(const BackwardParams& p, const BackwardStrides& strides,
                                               const DkvWideBlock& b) {
  using Element = typename StorageTraits<Storage>::Element;
  using Shape = DkvWideSm90Shape<kDqk, kDv>;
  constexpr int kN = Shape::kTileN;
  constexpr int kM = Shape::kTileM;
  const Segment& seg = b.work.seg;
  const KeyTileWork& w = b.work;
  const Mask mask{p.window_left, p.window_right};
  const uint32_t k_tile = b.base + Shape::kK;
  const uint32_t q_tiles = b.base + Shape::kQ;
  float* lse_rows = b.stats;

  load_wgmma_tile_async_from<kN, kDqk, 128>(k_tile, static_cast<const Element*>(p.k), seg.k_row + w.n0, w.valid_k,
                                            strides.k, w.kv_head, b.t);
  const auto load_q = [&](const DkvStepWalk& at, int buffer) {
    const int head = w.kv_head * b.group + at.head_index;
    const int m0 = (w.m_begin + at.m_index) * kM;
    const int rows = max(0, min(kM, seg.q_len - m0));
    load_wgmma_tile_async_from<kM, kDqk, 128>(q_tiles + static_cast<uint32_t>(buffer) * Shape::kQkBytes,
                                              static_cast<const Element*>(p.q), seg.q_row + m0, rows, strides.q, head,
                                              b.t);
    load_statistic_rows_async<kM>(p.lse, p.q_rows, seg, head, m0, rows, lse_rows + buffer * kM, b.t);
  };
  DkvStepWalk at(w.m_count);
  load_q(at, 0);
  cp_async_commit();

  float dk[kDqk / 8][4];
#pragma unroll
  for (int i = 0; i < kDqk / 8; ++i) dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = 0.0f;
  const uint32_t pt_slot = b.base + Shape::kPt + static_cast<uint32_t>(b.t) * 16;
  const uint32_t dpt_slot = b.base + Shape::kDpt + static_cast<uint32_t>(b.t) * 16;

  // wgmma groups in flight at step s's wait: [dK of s - 1, S^T of s]; once both have landed
  // the other Q buffer is free for the prefetch of step s + 1.
  for (int step = 0; step < b.steps; ++step) {
    const int buffer = step & 1;
    const DkvStepWalk next = at.next();
    cp_async_wait<0>();          // this step's Q and lse (and on step 0 K)
    fence_proxy_async_shared();  // this thread's cp.async data, visible to wgmma
    named_barrier_sync(Shape::kScoreBarrier, 128);
    const uint32_t q_tile = q_tiles + static_cast<uint32_t>(buffer) * Shape::kQkBytes;
    const float* lse_tile = lse_rows + buffer * kM;
    const int m0 = (w.m_begin + at.m_index) * kM;

    float st[kM / 8][4];
    wgmma_fence();
    wgmma_ss_k_major<Storage, kM, kN, kM, kDqk / 16>(st, k_tile, q_tile);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operands(flat(st));
    wgmma_fence_operands(flat(dk));
    named_barrier_sync(Shape::kScoreBarrier, 128);  // every warp's: the other Q buffer is free
    if (step + 1 < b.steps) load_q(next, buffer ^ 1);
    cp_async_commit();

    dkv_step_probabilities<kM>(st, seg, mask, w.n0, b.key_row, m0, b.pair_col,
                               dkv_step_unmasked(seg, mask, w.n0, w.valid_k, kN, m0, kM), lse_tile, p.scale_log2);
    uint32_t pt[kM / 16][4];
    accumulator_to_a_fragments<Storage, kM>(st, pt);
    store_hand_over(pt_slot, pt);
    named_barrier_sync_across(Shape::kPtReady, 256);

    // dS^T = P^T (dP^T - delta), P^T in fp32 from st.
    named_barrier_sync_across(Shape::kDptReady, 256);
    uint32_t dpt[kM / 8][4];
    load_hand_over(dpt_slot, dpt);
#pragma unroll
    for (int nf = 0; nf < kM / 8; ++nf) {
#pragma unroll
      for (int e = 0; e < 4; ++e) st[nf][e] *= __uint_as_float(dpt[nf][e]);
    }
    uint32_t dst[kM / 16][4];
    accumulator_to_a_fragments<Storage, kM>(st, dst);
    wgmma_fence();
    wgmma_rs_mn_major<Storage, kDqk, kM, kM / 16>(dk, dst, q_tile);
    wgmma_commit();
    at = next;
  }
  wgmma_wait<0>();
  wgmma_fence_operands(flat(dk));
  add_key_gradient_rows<Storage, kDqk>(p, p.dk_out, p.dk_accum, p.scale, seg, w.kv_head, w.n0, b.key_row, w.valid_k,
                                       b.pair_col, dk);
}

// The gradient warpgroup: dP^T - delta handed over, P^T taken over, dV.
template <typename Storage, int kDqk, int kDv>
__device__ __forceinline__ void dkv_wide_gradient(const BackwardParams& p, const BackwardStrides& strides,
                                                  const DkvWideBlock& b) {
  using Element = typename StorageTraits<Storage>::Element;
  using Shape = DkvWideSm90Shape<kDqk, kDv>;
  constexpr int kN = Shape::kTileN;
  constexpr int kM = Shape::kTileM;
  const Segment& seg = b.work.seg;
  const KeyTileWork& w = b.work;
  const uint32_t v_tile = b.base + Shape::kV;
  const uint32_t do_tiles = b.base + Shape::kDo;
  float* delta_rows = b.stats + 2 * kM;

  load_wgmma_tile_async_from<kN, kDv, 128>(v_tile, static_cast<const Element*>(p.v), seg.k_row + w.n0, w.valid_k,
                                           strides.v, w.kv_head, b.t);
  const auto load_do = [&](const DkvStepWalk& at, int buffer) {
    const int head = w.kv_head * b.group + at.head_index;
    const int m0 = (w.m_begin + at.m_index) * kM;
    const int rows = max(0, min(kM, seg.q_len - m0));
    load_wgmma_tile_async_from<kM, kDv, 128>(do_tiles + static_cast<uint32_t>(buffer) * Shape::kVBytes,
                                             static_cast<const Element*>(p.dout), seg.q_row + m0, rows, strides.dout,
                                             head, b.t);
    load_statistic_rows_async<kM>(p.delta, p.q_rows, seg, head, m0, rows, delta_rows + buffer * kM, b.t);
  };
  DkvStepWalk at(w.m_count);
  load_do(at, 0);
  cp_async_commit();

  float dv[kDv / 8][4];
#pragma unroll
  for (int i = 0; i < kDv / 8; ++i) dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
  const uint32_t pt_slot = b.base + Shape::kPt + static_cast<uint32_t>(b.t) * 16;
  const uint32_t dpt_slot = b.base + Shape::kDpt + static_cast<uint32_t>(b.t) * 16;

  for (int step = 0; step < b.steps; ++step) {
    const int buffer = step & 1;
    const DkvStepWalk next = at.next();
    cp_async_wait<0>();          // this step's dO and delta (and on step 0 V)
    fence_proxy_async_shared();  // this thread's cp.async data, visible to wgmma
    named_barrier_sync(Shape::kGradientBarrier, 128);
    const uint32_t do_tile = do_tiles + static_cast<uint32_t>(buffer) * Shape::kVBytes;
    const float* delta_tile = delta_rows + buffer * kM;

    float dpt[kM / 8][4];
    wgmma_fence();
    wgmma_ss_k_major<Storage, kM, kN, kM, kDv / 16>(dpt, v_tile, do_tile);
    wgmma_commit();
    wgmma_wait<0>();  // dP^T, and the last step's dV (the other dO buffer is free)
    wgmma_fence_operands(flat(dpt));
    wgmma_fence_operands(flat(dv));
    named_barrier_sync(Shape::kGradientBarrier, 128);
    if (step + 1 < b.steps) load_do(next, buffer ^ 1);
    cp_async_commit();

#pragma unroll
    for (int nf = 0; nf < kM / 8; ++nf) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float row_delta = delta_tile[nf * 8 + b.pair_col + c];
        dpt[nf][c] -= row_delta;
        dpt[nf][2 + c] -= row_delta;
      }
    }
    // The hand-over, both barriers over both warpgroups: P^T is read here between kPtReady
    // and kDptReady, and the score warpgroup writes the next one after kDptReady; dP^T -
    // delta is read there between kDptReady and the next kPtReady, after which this one
    // writes the next. So one buffer of each suffices. (The score warpgroup waits at
    // kPtReady for what it would wait for at kDptReady anyway, and this one at kDptReady
    // for a warpgroup that is already there.)
    named_barrier_sync_across(Shape::kPtReady, 256);
    uint32_t pt[kM / 16][4];
    load_hand_over(pt_slot, pt);
    store_hand_over(dpt_slot, reinterpret_cast<const uint32_t(&)[kM / 8][4]>(dpt));
    named_barrier_sync_across(Shape::kDptReady, 256);

    wgmma_fence();
    wgmma_rs_mn_major<Storage, kDv, kM, kM / 16>(dv, pt, do_tile);
    wgmma_commit();
    at = next;
  }
  wgmma_wait<0>();
  wgmma_fence_operands(flat(dv));
  add_key_gradient_rows<Storage, kDv>(p, p.dv_out, p.dv_accum, 1.0f, seg, w.kv_head, w.n0, b.key_row, w.valid_k,
                                      b.pair_col, dv);
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
  b.t = static_cast<int>(threadIdx.x) % 128;
  const int lane = b.t % 32;
  b.key_row = 16 * (b.t / 32) + (lane >> 2);
  b.pair_col = (lane & 3) * 2;
  if (threadIdx.x < 128) {
    dkv_wide_score<Storage, kDqk, kDv>(p, strides, b);
  } else {
    dkv_wide_gradient<Storage, kDqk, kDv>(p, strides, b);
  }
#endif
}

}  // namespace thdcp::cuda::detail
