// dK/dV on Hopper (sm_90a): dkv_kernel's deterministic algorithm with warpgroup MMAs. One
// warpgroup owns the block's 64 key rows of one KV head and loops over the query heads of
// the group and the query tiles that see the keys (64 queries per step):
//   S^T = K Q^T, dP^T = V dO^T   (m64n64k16, K/V and Q/dO read K-major from shared memory),
//   P^T, dS^T = P^T (dP^T - delta) in registers,
//   dV += P^T dO, dK += dS^T Q   (m64nDk16, P^T/dS^T from registers, dO/Q read MN-major from
//                                 the same tiles),
// with dK/dV in registers for the whole loop and added once into fp32 dK/dV at the end.
// dkv_kernel stages P^T and dS^T through shared memory so that its warps can share them;
// here the accumulator layout of S^T is already the A-operand layout of the next products.
// Head dims up to 128; above, dkv_wide_kernel_sm90 (attention_dkv_wide_sm90.cuh).
#pragma once

#include "attention_backward.cuh"
#include "wgmma.cuh"

namespace thdcp::cuda::detail {

// Head dims kDqk (q, k, dk) and kDv (v, dout, dv), at most 128 (one warpgroup holds dK and
// dV of every column; above, dkv_wide_kernel_sm90 splits them between two warpgroups).
template <int kDqk, int kDv>
struct DkvSm90Shape {
  static constexpr int kTileN = kDkvTileRows;  // keys per block: one warpgroup, 16 per warp
  static constexpr int kTileM = 64;            // queries per step
  static constexpr int kThreads = 128;
  static constexpr uint32_t kQkBytes = 64 * kDqk * 2;  // a K or Q tile
  static constexpr uint32_t kVBytes = 64 * kDv * 2;    // a V or dO tile
  static_assert(kDqk == kDv && kDqk <= 128, "dK and dV of every column in one warpgroup's registers");
  // K, V, two Q and two dO buffers (wgmma layout; the next step's Q/dO load while this one
  // computes), lse and delta of two steps, and the slack that aligns the tiles to 1024
  // bytes: 98 KiB at D = 128, two blocks per SM.
  static constexpr size_t kSmemBytes = 3 * (kQkBytes + kVBytes) + 4 * kTileM * sizeof(float) + 1024;
};

// The per-step arithmetic of the Hopper dK/dV warpgroups (dkv_kernel_sm90, and the
// consumers of dkvq_kernel_sm90), on the m64 x kM accumulators of one warpgroup: this
// thread holds key rows key_row and key_row + 8 from key index key0 of the segment, and query
// columns 8 nf + pair_col + {0, 1} from query index m0.
//
// S^T -> P^T in place: S^T = -inf (P = 0) where the mask hides a pair, unless the whole step
// is `unmasked`; a query row with lse = -inf (it saw no key) gets the offset +inf, hence
// P = 0.
template <int kM>
__device__ __forceinline__ void dkv_step_probabilities(float (&st)[kM / 8][4], const Segment& seg, const Mask& mask,
                                                       int key0, int key_row, int m0, int pair_col, bool unmasked,
                                                       const float* lse_tile, float scale_log2) {
  if (!unmasked) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      int lo = 0;
      int hi = 0;
      key_visible_queries<kM>(seg, mask, key0 + key_row + 8 * half, m0 + pair_col, lo, hi);
#pragma unroll
      for (int nf = 0; nf < kM / 8; ++nf) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int column = nf * 8 + c;
          if (column < lo || column >= hi) st[nf][2 * half + c] = -INFINITY;
        }
      }
    }
  }
#pragma unroll
  for (int nf = 0; nf < kM / 8; ++nf) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int column = nf * 8 + pair_col + c;
      const float lse = lse_tile[column];
      const float offset = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int e = 2 * half + c;
        st[nf][e] = fast_exp2(fmaf(st[nf][e], scale_log2, -offset));
      }
    }
  }
}

// dP^T -> dS^T = P^T (dP^T - delta) in place: 0 where P is, since dP^T is finite (V and dO
// rows past the valid ones are zero-filled, and so are their lse and delta).
template <int kM>
__device__ __forceinline__ void dkv_step_ds(float (&dpt)[kM / 8][4], const float (&pt)[kM / 8][4],
                                            const float* delta_tile, int pair_col) {
#pragma unroll
  for (int nf = 0; nf < kM / 8; ++nf) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const float row_delta = delta_tile[nf * 8 + pair_col + c];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int e = 2 * half + c;
        dpt[nf][e] = pt[nf][e] * (dpt[nf][e] - row_delta);
      }
    }
  }
}

// The rest of a step once S^T has landed and dP^T is in flight: P^T, then (after dP^T has
// landed) dS^T, and dV += P^T dO, dK += dS^T Q issued and committed (not waited for; they
// read P^T and dS^T from registers: `pt` and `dst` must stay as they are until they land).
// kD columns of dK (from q_tile's first column), kDvColumns of dV (from do_tile's).
template <typename Storage, int kM, int kD, int kDvColumns = kD>
__device__ __forceinline__ void dkv_step_products(float (&st)[kM / 8][4], float (&dpt)[kM / 8][4],
                                                  float (&dv)[kDvColumns / 8][4], float (&dk)[kD / 8][4],
                                                  uint32_t (&pt)[kM / 16][4], uint32_t (&dst)[kM / 16][4],
                                                  const Segment& seg, const Mask& mask, int key0, int key_row, int m0,
                                                  int pair_col, bool unmasked, const float* lse_tile,
                                                  const float* delta_tile, float scale_log2, uint32_t q_tile,
                                                  uint32_t do_tile) {
  dkv_step_probabilities<kM>(st, seg, mask, key0, key_row, m0, pair_col, unmasked, lse_tile, scale_log2);
  accumulator_to_a_fragments<Storage, kM>(st, pt);
  wgmma_wait<0>();  // dP^T
  wgmma_fence_operands(flat(dpt));
  dkv_step_ds<kM>(dpt, st, delta_tile, pair_col);
  accumulator_to_a_fragments<Storage, kM>(dpt, dst);
  wgmma_fence();
  wgmma_rs_mn_major<Storage, kDvColumns, kM, kM / 16>(dv, pt, do_tile);
  wgmma_rs_mn_major<Storage, kD, kM, kM / 16>(dk, dst, q_tile);
  wgmma_commit();
}

// The end of a warpgroup's loop for one gradient, dK (times the softmax scale) or dV: its
// rows (of key_rows valid ones) stored into `out` (p.dk_out / p.dv_out) when the host set
// it, else added into the fp32 accumulator `accum` (p.dk_accum / p.dv_accum), one fp32
// addition per (segment, element): with at most two segments reaching a key row and the
// accumulator starting at zero, the result does not depend on their order. kD columns.
template <typename Storage, int kD>
__device__ __forceinline__ void add_key_gradient_rows(const BackwardParams& p, void* out, float* accum, float scale,
                                                      const Segment& seg, int kv_head, int key0, int key_row,
                                                      int key_rows, int pair_col, const float (&g)[kD / 8][4]) {
  using Traits = StorageTraits<Storage>;
  using Element = typename Traits::Element;
  const int64_t row_stride = static_cast<int64_t>(p.kv_heads) * kD;  // the output's and the accumulator's
  const int64_t column0 = static_cast<int64_t>(kv_head) * kD + pair_col;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key_local = key_row + 8 * half;
    if (key_local >= key_rows) continue;
    const int64_t key = static_cast<int64_t>(seg.k_row) + key0 + key_local;
    if (out != nullptr) {
      Element* row = static_cast<Element*>(out) + key * row_stride + column0;
#pragma unroll
      for (int df = 0; df < kD / 8; ++df) {
        *reinterpret_cast<uint32_t*>(row + df * 8) = Traits::pack(g[df][2 * half] * scale, g[df][2 * half + 1] * scale);
      }
      continue;
    }
    float* row = accum + (p.dkv_rows ? p.dkv_rows[key] : key) * row_stride + column0;
#pragma unroll
    for (int df = 0; df < kD / 8; ++df) {
      atomicAdd(row + df * 8, g[df][2 * half] * scale);
      atomicAdd(row + df * 8 + 1, g[df][2 * half + 1] * scale);
    }
  }
}

// Both, D_qk = D_v = kD, in one pass over the rows: dK's and dV's stores of a row together.
template <typename Storage, int kD>
__device__ __forceinline__ void add_dkv_rows(const BackwardParams& p, const Segment& seg, int kv_head, int key0,
                                             int key_row, int key_rows, int pair_col, const float (&dk)[kD / 8][4],
                                             const float (&dv)[kD / 8][4]) {
  using Traits = StorageTraits<Storage>;
  using Element = typename Traits::Element;
  const int64_t stride = static_cast<int64_t>(p.kv_heads) * kD;  // of the outputs and the accumulators
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key_local = key_row + 8 * half;
    if (key_local >= key_rows) continue;
    const int64_t key = static_cast<int64_t>(seg.k_row) + key0 + key_local;
    if (p.dk_out != nullptr) {
      Element* dk_row = static_cast<Element*>(p.dk_out) + key * stride + static_cast<int64_t>(kv_head) * kD + pair_col;
      Element* dv_row = static_cast<Element*>(p.dv_out) + key * stride + static_cast<int64_t>(kv_head) * kD + pair_col;
#pragma unroll
      for (int df = 0; df < kD / 8; ++df) {
        *reinterpret_cast<uint32_t*>(dk_row + df * 8) =
            Traits::pack(dk[df][2 * half] * p.scale, dk[df][2 * half + 1] * p.scale);
        *reinterpret_cast<uint32_t*>(dv_row + df * 8) = Traits::pack(dv[df][2 * half], dv[df][2 * half + 1]);
      }
      continue;
    }
    const int64_t row = p.dkv_rows ? p.dkv_rows[key] : key;
    float* dk_accum = p.dk_accum + row * stride + static_cast<int64_t>(kv_head) * kD + pair_col;
    float* dv_accum = p.dv_accum + row * stride + static_cast<int64_t>(kv_head) * kD + pair_col;
#pragma unroll
    for (int df = 0; df < kD / 8; ++df) {
      atomicAdd(dk_accum + df * 8, dk[df][2 * half] * p.scale);
      atomicAdd(dk_accum + df * 8 + 1, dk[df][2 * half + 1] * p.scale);
      atomicAdd(dv_accum + df * 8, dv[df][2 * half]);
      atomicAdd(dv_accum + df * 8 + 1, dv[df][2 * half + 1]);
    }
  }
}

template <typename Storage, int kDqk, int kDv>
__global__ void __launch_bounds__(DkvSm90Shape<kDqk, kDv>::kThreads, 2)
    dkv_kernel_sm90(const BackwardParams p, const BackwardStrides strides) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Traits = StorageTraits<Storage>;
  using Element = typename Traits::Element;
  using Shape = DkvSm90Shape<kDqk, kDv>;
  constexpr int kN = Shape::kTileN;
  constexpr int kM = Shape::kTileM;
  constexpr int kThreads = Shape::kThreads;
  static_assert(kN == 64 && kM == 64 && kThreads == 128, "one warpgroup of 64 keys, 64 queries per step");

  const Mask mask{p.window_left, p.window_right};
  KeyTileWork work;
  if (!work.assign<kN, kM>(p.k_tile_start, p.num_segments, p.segments, p.kv_heads, mask)) return;
  const Segment& seg = work.seg;
  const int kv_head = work.kv_head, n0 = work.n0, valid_k = work.valid_k, m_begin = work.m_begin,
            m_count = work.m_count;
  const int group = p.q_heads / p.kv_heads;
  const int steps = m_count * group;
  if (steps == 0) return;  // no query sees these keys: their gradients stay 0

  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_address = smem_address(smem_raw);
  const uint32_t k_tile = (raw_address + 1023u) & ~1023u;
  const uint32_t v_tile = k_tile + Shape::kQkBytes;
  const uint32_t q_tiles = v_tile + Shape::kVBytes;          // two buffers
  const uint32_t do_tiles = q_tiles + 2 * Shape::kQkBytes;  // two buffers
  float* lse_rows = reinterpret_cast<float*>(smem_raw + (do_tiles + 2 * Shape::kVBytes - raw_address));
  float* delta_rows = lse_rows + 2 * kM;

  const Element* q = static_cast<const Element*>(p.q);
  const Element* dout = static_cast<const Element*>(p.dout);

  load_wgmma_tile_async<kN, kDqk, kThreads>(k_tile, static_cast<const Element*>(p.k), seg.k_row + n0, valid_k,
                                            strides.k, kv_head);
  load_wgmma_tile_async<kN, kDv, kThreads>(v_tile, static_cast<const Element*>(p.v), seg.k_row + n0, valid_k,
                                           strides.v, kv_head);
  // Step s covers query tile m_begin + s % m_count of head kv_head * group + s / m_count,
  // kept as two counters (m_index, head_index) instead of a division per step.
  auto load_q = [&](int m_index, int head_index, int buffer) {
    const int head = kv_head * group + head_index;
    const int m0 = (m_begin + m_index) * kM;
    const int rows = max(0, min(kM, seg.q_len - m0));
    const uint32_t q_bytes = static_cast<uint32_t>(buffer) * Shape::kQkBytes;
    const uint32_t do_bytes = static_cast<uint32_t>(buffer) * Shape::kVBytes;
    load_wgmma_tile_async<kM, kDqk, kThreads>(q_tiles + q_bytes, q, seg.q_row + m0, rows, strides.q, head);
    load_wgmma_tile_async<kM, kDv, kThreads>(do_tiles + do_bytes, dout, seg.q_row + m0, rows, strides.dout, head);
    load_row_statistics_async<kM, false>(p, seg, head, m0, rows, lse_rows, delta_rows, buffer);
  };
  load_q(0, 0, 0);
  cp_async_commit();

  const auto& [warp, lane, group_row, pair_col] = FragmentLane{};
  const int key_row = 16 * warp + group_row;  // this thread's key rows: key_row, key_row + 8

  float dk[kDqk / 8][4];
  float dv[kDv / 8][4];
  zero_fragments(dk);
  zero_fragments(dv);

  // The steps are software-pipelined by one: step s's dV/dK products run on the tensor cores
  // while step s + 1 waits for its tiles and issues its S^T and dP^T, and P^T = exp(S^T - lse)
  // is computed while dP^T is still in flight. wgmma groups in flight at step s's wait<1>:
  // [dV/dK of s - 1, S^T of s, dP^T of s]; it returns when the first two have landed, which
  // also frees the other Q/dO buffer for the prefetch of step s + 1.
  int m_index = 0;
  int head_index = 0;
  for (int step = 0; step < steps; ++step) {
    const int buffer = step & 1;
    int next_m = m_index + 1;
    int next_head = head_index;
    if (next_m == m_count) {
      next_m = 0;
      ++next_head;
    }
    cp_async_wait<0>();          // this step's Q/dO (and on step 0 K/V): loaded during the last one
    fence_proxy_async_shared();  // this thread's cp.async data, visible to wgmma
    __syncthreads();
    const uint32_t q_tile = q_tiles + static_cast<uint32_t>(buffer) * Shape::kQkBytes;
    const uint32_t do_tile = do_tiles + static_cast<uint32_t>(buffer) * Shape::kVBytes;
    const float* lse_tile = lse_rows + buffer * kM;
    const float* delta_tile = delta_rows + buffer * kM;
    const int m0 = (m_begin + m_index) * kM;

    float st[kM / 8][4];
    float dpt[kM / 8][4];
    wgmma_ss_k_major_pair<Storage, kM, kN, kM, kDqk / 16, kDv / 16>(st, k_tile, q_tile, dpt, v_tile, do_tile);
    wgmma_wait<1>();  // the last step's dV/dK and this step's S^T have landed
    wgmma_fence_operands(flat(st));
    wgmma_fence_operands(flat(dv));
    wgmma_fence_operands(flat(dk));
    __syncthreads();  // every warp's: the other Q/dO buffer is free
    if (step + 1 < steps) load_q(next_m, next_head, buffer ^ 1);
    cp_async_commit();

    uint32_t pt[kM / 16][4];
    uint32_t dst[kM / 16][4];
    dkv_step_products<Storage, kM, kDqk, kDv>(st, dpt, dv, dk, pt, dst, seg, mask, n0, key_row, m0, pair_col,
                                              dkv_step_unmasked(seg, mask, n0, valid_k, kN, m0, kM), lse_tile,
                                              delta_tile, p.scale_log2, q_tile, do_tile);
    m_index = next_m;
    head_index = next_head;
  }
  wgmma_wait<0>();
  wgmma_fence_operands(flat(dv));
  wgmma_fence_operands(flat(dk));

  add_dkv_rows<Storage, kDqk>(p, seg, kv_head, n0, key_row, valid_k, pair_col, dk, dv);
#endif
}

}  // namespace thdcp::cuda::detail
