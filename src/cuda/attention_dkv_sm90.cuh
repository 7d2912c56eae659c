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
#pragma once

#include "attention_backward.cuh"
#include "wgmma.cuh"

namespace thdcp::cuda::detail {

// Head dims kDqk (q, k, dk) and kDv (v, dout, dv). Above D_qk 128 the dK and dV registers of
// all columns would not fit: the grid's z has kSlices = 2 column slices, slice s owning dK
// columns [k_col0(s), +k_columns(s)) (128, then the rest) and dV columns [v_col0(s),
// +v_columns(s)) (halves where they are whole 64-column blocks, else 128 and the rest); each
// recomputes S^T and dP^T.
template <int kDqk, int kDv>
struct DkvSm90Shape {
  static constexpr int kTileN = kDkvTileRows;  // keys per block: one warpgroup, 16 per warp
  static constexpr int kTileM = 64;            // queries per step
  static constexpr int kThreads = 128;
  static constexpr uint32_t kQkBytes = 64 * kDqk * 2;  // a K or Q tile
  static constexpr uint32_t kVBytes = 64 * kDv * 2;    // a V or dO tile
  static constexpr int kSlices = kDqk > 128 ? 2 : 1;
  static constexpr int k_col0(int slice) { return 128 * slice; }
  static constexpr int k_columns(int slice) { return kSlices == 1 ? kDqk : slice == 0 ? 128 : kDqk - 128; }
  static constexpr int kVSplit = kSlices == 1 ? kDv : kDv / 2 % 64 == 0 ? kDv / 2 : 128;
  static constexpr int v_col0(int slice) { return slice * kVSplit; }
  static constexpr int v_columns(int slice) { return slice == 0 ? kVSplit : kDv - kVSplit; }
  static_assert(kSlices == 1 || (kDqk <= 256 && kDv <= 256 && kDv % 64 == 0), "slices of whole column blocks");
  // K, V, kStages Q and dO buffers (wgmma layout), lse and delta of kStages steps, and the
  // slack that aligns the tiles to 1024 bytes. Two stages (the next step's Q/dO loads while
  // this one computes) where two blocks still share an SM (98 KiB at D = 128) or where one
  // stage would not make room for a second block (193 KiB at 256); one stage where that
  // lets two blocks share the SM, each hiding the other's loads and waits: 81 KiB at 192/128
  // and 97 KiB at 192 (two stages: 121 and 145 KiB, one block of four warps per SM).
  static constexpr size_t smem_bytes(int stages) {
    return (1 + stages) * (kQkBytes + kVBytes) + 2 * stages * kTileM * sizeof(float) + 1024;
  }
  static constexpr size_t kTwoBlocksBytes = 227 * 1024 / 2 - 1024;  // per block, with the driver's reserve
  static constexpr int kStages = smem_bytes(2) > kTwoBlocksBytes && smem_bytes(1) <= kTwoBlocksBytes ? 1 : 2;
  static constexpr size_t kSmemBytes = smem_bytes(kStages);
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

// The end of a warpgroup's loop: its dK (times the softmax scale) and dV rows (of key_rows
// valid ones) stored into p.dk_out / p.dv_out when the host set them, else added into the
// fp32 accumulators, one fp32 addition per (segment, element): with at most two segments
// reaching a key row and the accumulator starting at zero, the result does not depend on
// their order. The warpgroup holds kKColumns columns of dK from k_col0 (of D_qk = kDqk) and
// kVColumns of dV from v_col0 (of D_v = kDv).
template <typename Storage, int kDqk, int kDv, int kKColumns, int kVColumns>
__device__ __forceinline__ void add_dkv_columns(const BackwardParams& p, const Segment& seg, int kv_head, int key0,
                                                int key_row, int key_rows, int pair_col, int k_col0, int v_col0,
                                                const float (&dk)[kKColumns / 8][4],
                                                const float (&dv)[kVColumns / 8][4]) {
  using Traits = StorageTraits<Storage>;
  using Element = typename Traits::Element;
  // Row strides of the outputs and the fp32 accumulators (contiguous).
  const int64_t k_stride = static_cast<int64_t>(p.kv_heads) * kDqk;
  const int64_t v_stride = static_cast<int64_t>(p.kv_heads) * kDv;
  constexpr int kWider = kKColumns > kVColumns ? kKColumns : kVColumns;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key_local = key_row + 8 * half;
    if (key_local >= key_rows) continue;
    const int64_t key = static_cast<int64_t>(seg.k_row) + key0 + key_local;
    if (p.dk_out != nullptr) {
      Element* dk_row = static_cast<Element*>(p.dk_out) + key * k_stride + static_cast<int64_t>(kv_head) * kDqk +
                        k_col0 + pair_col;
      Element* dv_row = static_cast<Element*>(p.dv_out) + key * v_stride + static_cast<int64_t>(kv_head) * kDv +
                        v_col0 + pair_col;
#pragma unroll
      for (int df = 0; df < kWider / 8; ++df) {
        if (df < kKColumns / 8) {
          *reinterpret_cast<uint32_t*>(dk_row + df * 8) =
              Traits::pack(dk[df][2 * half] * p.scale, dk[df][2 * half + 1] * p.scale);
        }
        if (df < kVColumns / 8) {
          *reinterpret_cast<uint32_t*>(dv_row + df * 8) = Traits::pack(dv[df][2 * half], dv[df][2 * half + 1]);
        }
      }
      continue;
    }
    const int64_t row = p.dkv_rows ? p.dkv_rows[key] : key;
    float* dk_accum = p.dk_accum + row * k_stride + static_cast<int64_t>(kv_head) * kDqk + k_col0 + pair_col;
    float* dv_accum = p.dv_accum + row * v_stride + static_cast<int64_t>(kv_head) * kDv + v_col0 + pair_col;
#pragma unroll
    for (int df = 0; df < kWider / 8; ++df) {
      if (df < kKColumns / 8) {
        atomicAdd(dk_accum + df * 8, dk[df][2 * half] * p.scale);
        atomicAdd(dk_accum + df * 8 + 1, dk[df][2 * half + 1] * p.scale);
      }
      if (df < kVColumns / 8) {
        atomicAdd(dv_accum + df * 8, dv[df][2 * half]);
        atomicAdd(dv_accum + df * 8 + 1, dv[df][2 * half + 1]);
      }
    }
  }
}

// All kD columns of dK and dV (D_qk = D_v = kD).
template <typename Storage, int kD>
__device__ __forceinline__ void add_dkv_rows(const BackwardParams& p, const Segment& seg, int kv_head, int key0,
                                             int key_row, int key_rows, int pair_col, const float (&dk)[kD / 8][4],
                                             const float (&dv)[kD / 8][4]) {
  add_dkv_columns<Storage, kD, kD, kD, kD>(p, seg, kv_head, key0, key_row, key_rows, pair_col, 0, 0, dk, dv);
}

// The block's work for column slice kSlice (see DkvSm90Shape).
template <typename Storage, int kDqk, int kDv, int kSlice>
__device__ __forceinline__ void dkv_sm90_block(const BackwardParams& p, const BackwardStrides& strides) {
  using Traits = StorageTraits<Storage>;
  using Element = typename Traits::Element;
  using Shape = DkvSm90Shape<kDqk, kDv>;
  constexpr int kN = Shape::kTileN;
  constexpr int kM = Shape::kTileM;
  constexpr int kKColumns = Shape::k_columns(kSlice);
  constexpr int kVColumns = Shape::v_columns(kSlice);
  // The slice's first columns of Q and dO (the B operands of dK and dV) in their tiles.
  constexpr uint32_t kQColumnBytes = Shape::k_col0(kSlice) / 64 * kM * 128;
  constexpr uint32_t kDoColumnBytes = Shape::v_col0(kSlice) / 64 * kM * 128;
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
  constexpr int kStages = Shape::kStages;
  const uint32_t k_tile = (raw_address + 1023u) & ~1023u;
  const uint32_t v_tile = k_tile + Shape::kQkBytes;
  const uint32_t q_tiles = v_tile + Shape::kVBytes;                 // kStages buffers
  const uint32_t do_tiles = q_tiles + kStages * Shape::kQkBytes;  // kStages buffers
  float* lse_rows = reinterpret_cast<float*>(smem_raw + (do_tiles + kStages * Shape::kVBytes - raw_address));
  float* delta_rows = lse_rows + kStages * kM;

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

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int group_row = lane >> 2;
  const int pair_col = (lane & 3) * 2;
  const int key_row = 16 * warp + group_row;  // this thread's key rows: key_row, key_row + 8

  float dk[kKColumns / 8][4];
  float dv[kVColumns / 8][4];
#pragma unroll
  for (int i = 0; i < (kKColumns > kVColumns ? kKColumns : kVColumns) / 8; ++i) {
    if (i < kKColumns / 8) dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = 0.0f;
    if (i < kVColumns / 8) dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
  }

  // Two stages: the steps are software-pipelined by one: step s's dV/dK products run on the
  // tensor cores while step s + 1 waits for its tiles and issues its S^T and dP^T, and P^T =
  // exp(S^T - lse) is computed while dP^T is still in flight. wgmma groups in flight at step
  // s's wait<1>: [dV/dK of s - 1, S^T of s, dP^T of s]; it returns when the first two have
  // landed, which also frees the other Q/dO buffer for the prefetch of step s + 1.
  // One stage: step s + 1's Q/dO load once step s's dV/dK have landed (the block on the
  // same SM runs meanwhile).
  int m_index = 0;
  int head_index = 0;
  for (int step = 0; step < steps; ++step) {
    const int buffer = kStages == 2 ? step & 1 : 0;
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
    wgmma_fence();
    wgmma_ss_k_major<Storage, kM, kN, kM, kDqk / 16>(st, k_tile, q_tile);
    wgmma_commit();
    wgmma_ss_k_major<Storage, kM, kN, kM, kDv / 16>(dpt, v_tile, do_tile);
    wgmma_commit();
    wgmma_wait<1>();  // the last step's dV/dK and this step's S^T have landed
    wgmma_fence_operands(flat(st));
    wgmma_fence_operands(flat(dv));
    wgmma_fence_operands(flat(dk));
    if constexpr (kStages == 2) {
      __syncthreads();  // every warp's: the other Q/dO buffer is free
      if (step + 1 < steps) load_q(next_m, next_head, buffer ^ 1);
      cp_async_commit();
    }

    uint32_t pt[kM / 16][4];
    uint32_t dst[kM / 16][4];
    dkv_step_products<Storage, kM, kKColumns, kVColumns>(
        st, dpt, dv, dk, pt, dst, seg, mask, n0, key_row, m0, pair_col,
        dkv_step_unmasked(seg, mask, n0, valid_k, kN, m0, kM), lse_tile, delta_tile, p.scale_log2,
        q_tile + kQColumnBytes, do_tile + kDoColumnBytes);
    if constexpr (kStages == 1) {
      wgmma_wait<0>();  // dV/dK of this step have read its Q/dO
      wgmma_fence_operands(flat(dv));
      wgmma_fence_operands(flat(dk));
      __syncthreads();  // every warp's
      if (step + 1 < steps) load_q(next_m, next_head, 0);
      cp_async_commit();
    }
    m_index = next_m;
    head_index = next_head;
  }
  wgmma_wait<0>();
  wgmma_fence_operands(flat(dv));
  wgmma_fence_operands(flat(dk));

  add_dkv_columns<Storage, kDqk, kDv, kKColumns, kVColumns>(p, seg, kv_head, n0, key_row, valid_k, pair_col,
                                                            Shape::k_col0(kSlice), Shape::v_col0(kSlice), dk, dv);
}

template <typename Storage, int kDqk, int kDv>
__global__ void __launch_bounds__(DkvSm90Shape<kDqk, kDv>::kThreads, 2)
    dkv_kernel_sm90(const BackwardParams p, const BackwardStrides strides) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (DkvSm90Shape<kDqk, kDv>::kSlices == 1) {
    dkv_sm90_block<Storage, kDqk, kDv, 0>(p, strides);
  } else if (blockIdx.z == 0) {
    dkv_sm90_block<Storage, kDqk, kDv, 0>(p, strides);
  } else {
    dkv_sm90_block<Storage, kDqk, kDv, 1>(p, strides);
  }
#endif
}

}  // namespace thdcp::cuda::detail
