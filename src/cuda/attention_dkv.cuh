// dkv_kernel: the backward's dK/dV pass of the portable (mma.sync) kernels, with dQ fused
// into it when AttentionOptions::deterministic is false; the passes and shapes are described
// in attention_backward.cuh.
#pragma once

#include "attention_backward.cuh"
#include "epilogue.cuh"

namespace thdcp::cuda::detail {

// The portable dK/dV pass's per-step pieces, on a warp's 32 keys x 32 queries of S^T and dP^T
// (m16n8 layout: this thread's key rows key_row + 16 mi + group_row + {0, 8} of the segment,
// query columns 8 nf + {0, 1} from query index query).

// S^T -> P^T and dP^T -> dS^T = P^T (dP^T - delta) in place; `column0`: this thread's first
// query column of the step in lse_tile / delta_tile. A query row with lse = -inf (it saw no
// key) gets the offset +inf, hence P = 0.
__device__ __forceinline__ void dkv_probabilities(float (&st)[2][4][4], float (&dpt)[2][4][4], const float* lse_tile,
                                                  const float* delta_tile, int column0, float scale_log2) {
#pragma unroll
  for (int nf = 0; nf < 4; ++nf) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int column = column0 + nf * 8 + c;
      const float lse = lse_tile[column];
      const float offset = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
      const float row_delta = delta_tile[column];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int e = 2 * half + c;
          const float prob = fast_exp2(fmaf(st[mi][nf][e], scale_log2, -offset));
          st[mi][nf][e] = prob;
          dpt[mi][nf][e] = prob * (dpt[mi][nf][e] - row_delta);
        }
      }
    }
  }
}

// P^T and dS^T rounded to the storage type, into the swizzled stages (dS^T ds_bytes past
// P^T) that the block's products read across warps: this thread's rows at byte
// stage_row_bytes of pt_bytes, its 8-column blocks (query_col0 / 8 + nf) swizzled by group_row.
template <typename Storage, int kM>
__device__ __forceinline__ void stage_pt_ds(const float (&st)[2][4][4], const float (&dpt)[2][4][4],
                                            char* pt_bytes, int stage_row_bytes, int query_col0, int group_row,
                                            int ds_bytes) {
  using Traits = StorageTraits<Storage>;
#pragma unroll
  for (int nf = 0; nf < 4; ++nf) {
    const int chunk_bytes = ((((query_col0 >> 3) + nf) ^ group_row) & 7) << 4;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int offset = stage_row_bytes + chunk_bytes + (16 * mi + 8 * half) * kM * 2;
        *reinterpret_cast<uint32_t*>(pt_bytes + offset) = Traits::pack(st[mi][nf][2 * half], st[mi][nf][2 * half + 1]);
        *reinterpret_cast<uint32_t*>(pt_bytes + ds_bytes + offset) =
            Traits::pack(dpt[mi][nf][2 * half], dpt[mi][nf][2 * half + 1]);
      }
    }
  }
}

// The fused pass's dQ share of a step: this warp's 32 query rows from query index m0 of the
// segment (this thread's rows 16 mi + group_row + {0, 8}) x kCols columns from `column`, added
// into the fp32 accumulator p.dq_accum ([q_rows, q_heads, kDqk], row stride q_stride) with
// atomics (their order varies between runs); rows past q_len are left alone.
template <int kDqk, int kCols>
__device__ __forceinline__ void add_dq_rows(const BackwardParams& p, const Segment& seg, int head, int m0,
                                            int group_row, int column, int64_t q_stride,
                                            const float (&dq_part)[2][kCols / 8][4]) {
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int q_index = m0 + mi * 16 + group_row + half * 8;
      if (q_index >= seg.q_len) continue;
      float* dst = p.dq_accum + (static_cast<int64_t>(seg.q_row) + q_index) * q_stride +
                   static_cast<int64_t>(head) * kDqk + column;
#pragma unroll
      for (int nf = 0; nf < kCols / 8; ++nf) {
        atomicAdd(dst + nf * 8, dq_part[mi][nf][2 * half]);
        atomicAdd(dst + nf * 8 + 1, dq_part[mi][nf][2 * half + 1]);
      }
    }
  }
}

// The portable dK/dV pass's shared memory (DkvShape::kSmemBytes): K and V of the block's
// keys, two buffers each of Q and dO, the lse and delta rows of two steps, and P^T then dS^T
// ([key][query], storage type).
template <typename Element, typename Shape>
struct DkvTiles {
  __device__ __forceinline__ explicit DkvTiles(unsigned char* smem)
      : k(reinterpret_cast<Element*>(smem)),
        v(k + Shape::kTileN * Shape::kQkRow),
        q(v + Shape::kTileN * Shape::kVRow),
        dout(q + 2 * Shape::kTileM * Shape::kQkRow),
        lse(reinterpret_cast<float*>(dout + 2 * Shape::kTileM * Shape::kVRow)),
        delta(lse + 2 * Shape::kTileM),
        pt(reinterpret_cast<Element*>(delta + 2 * Shape::kTileM)) {}
  Element* k;
  Element* v;
  Element* q;
  Element* dout;
  float* lse;
  float* delta;
  Element* pt;
};

// A step's Q and dO tiles, lse and delta rows, into buffer 0 or 1 (cp.async, not committed):
// step s covers query tile m_begin + m_index of head kv_head * group + head_index. Where Q
// and dO have one head dim whose chunks tile the threads in row passes (64, 128), from
// per-thread row pointers: this thread copies chunk `q_chunk` of rows q_row0 + kRowStep * i
// of each tile, so one 32x32->64-bit multiply per tensor per step (row_offset) and one 64-bit
// step per row pass address them, and the shared-memory offsets past the first are
// constants. Otherwise as load_tile_async copies a tile.
template <typename Element, typename Shape, int kDqk, int kDv>
struct DkvQdoLoader {
  static constexpr int kM = Shape::kTileM;
  static constexpr int kQkRow = Shape::kQkRow;
  static constexpr int kVRow = Shape::kVRow;
  static constexpr int kThreads = Shape::kThreads;
  static constexpr bool kRowPasses = kDqk == kDv && kQkRow == kDqk && row_passes_fit<kM, kDqk, kThreads>();
  static constexpr int kQChunks = kDqk / 8;
  static constexpr int kQRowStep = kThreads / kQChunks;
  static constexpr int kQPasses = kM * kQChunks / kThreads;
  static constexpr uint32_t kDoBytes = 2 * kM * kQkRow * 2;  // the dO buffers past the Q buffers

  __device__ __forceinline__ DkvQdoLoader(const BackwardParams& p_, const BackwardStrides& strides_,
                                          const Segment& seg_, const DkvTiles<Element, Shape>& tiles_, int kv_head,
                                          int group, int m_begin_)
      : p(p_),
        strides(strides_),
        seg(seg_),
        tiles(tiles_),
        first_head(kv_head * group),
        m_begin(m_begin_),
        q_chunk(static_cast<int>(threadIdx.x) % kQChunks),
        q_row0(static_cast<int>(threadIdx.x) / kQChunks),
        q_smem(smem_address(tiles_.q + swizzled_offset<kQkRow>(q_row0, q_chunk))) {}

  __device__ __forceinline__ void load(int m_index, int head_index, int buffer) const {
    const Element* q = static_cast<const Element*>(p.q);
    const Element* dout = static_cast<const Element*>(p.dout);
    const int head = first_head + head_index;
    const int m0 = (m_begin + m_index) * kM;
    const int rows = max(0, min(kM, seg.q_len - m0));
    if constexpr (kRowPasses) {
      const int thread_rows = rows - q_row0;  // rows this thread may read
      const uint32_t row = static_cast<uint32_t>(seg.q_row + m0) + q_row0;
      const Element* q_src = q + row_offset(strides.q, row, head, q_chunk);
      const Element* do_src = dout + row_offset(strides.dout, row, head, q_chunk);
      const uint32_t buffer_bytes = static_cast<uint32_t>(buffer * kM * kQkRow * 2);
#pragma unroll
      for (int i = 0; i < kQPasses; ++i) {
        const bool valid = kQRowStep * i < thread_rows;
        const uint32_t dst = q_smem + buffer_bytes + static_cast<uint32_t>(kQRowStep * i * kQkRow * 2);
        cp_async_16(dst, valid ? q_src : q, valid);
        cp_async_16(dst + kDoBytes, valid ? do_src : dout, valid);
        q_src += pass_step<kQRowStep>(strides.q);
        do_src += pass_step<kQRowStep>(strides.dout);
      }
    } else {
      const int64_t first_row = static_cast<int64_t>(seg.q_row) + m0;
      load_tile_async<kM, kDqk, kThreads, kQkRow>(tiles.q + buffer * kM * kQkRow, q, first_row, rows, strides.q,
                                                  head);
      load_tile_async<kM, kDv, kThreads, kVRow>(tiles.dout + buffer * kM * kVRow, dout, first_row, rows,
                                                strides.dout, head);
    }
    load_row_statistics_async<kM, true>(p, seg, head, m0, rows, tiles.lse, tiles.delta, buffer);
  }

  const BackwardParams& p;
  const BackwardStrides& strides;
  const Segment& seg;
  const DkvTiles<Element, Shape>& tiles;
  const int first_head;
  const int m_begin;
  const int q_chunk;
  const int q_row0;
  const uint32_t q_smem;
};

// A warp's ldmatrix addresses (bwd_step_addresses) for its products: K and V A-fragments; Q
// and dO B-fragments read [query][dim] (qn, don), and read transposed from the warp's
// columns of dK and dV (qt, dot); P^T A-fragments of the stage (dS^T at + kN kM elements).
// Q and dO of buffer 0. Where the rows of K and V (Q and dO) are alike, V's (dO's) are K's
// (Q's) plus a constant.
template <typename Element, typename Shape, int kDqk, int kDv>
struct DkvWarpAddresses {
  static constexpr int kQkRow = Shape::kQkRow;
  static constexpr int kVRow = Shape::kVRow;
  static constexpr int kN = Shape::kTileN;
  static constexpr int kM = Shape::kTileM;
  static_assert(kM / 16 <= 4, "one address per 16-column step");

  __device__ __forceinline__ DkvWarpAddresses(const DkvTiles<Element, Shape>& tiles, int lane, int key_row0,
                                              int query_col0, int dk_col0, int dv_col0) {
    constexpr uint32_t kDoBytes = DkvQdoLoader<Element, Shape, kDqk, kDv>::kDoBytes;
    const int qn_row = query_col0 + (lane & 7) + ((lane >> 4) << 3);
    const int qt_row = (lane & 7) + (((lane >> 3) & 1) << 3);
    bwd_step_addresses<kQkRow>(kv, smem_address(tiles.k), key_row0 + (lane & 15), 0, lane >> 4);
    bwd_step_addresses<kQkRow>(qn, smem_address(tiles.q), qn_row, 0, (lane >> 3) & 1);
    bwd_step_addresses<kQkRow>(qt, smem_address(tiles.q), qt_row, dk_col0 >> 3, lane >> 4);
    if constexpr (kDqk == kDv) {
      constexpr uint32_t kVBytes = kN * kQkRow * 2;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        v[i] = kv[i] + kVBytes;
        don[i] = qn[i] + kDoBytes;
        dot[i] = qt[i] + kDoBytes;
      }
    } else {
      bwd_step_addresses<kVRow>(v, smem_address(tiles.v), key_row0 + (lane & 15), 0, lane >> 4);
      bwd_step_addresses<kVRow>(don, smem_address(tiles.dout), qn_row, 0, (lane >> 3) & 1);
      bwd_step_addresses<kVRow>(dot, smem_address(tiles.dout), qt_row, dv_col0 >> 3, lane >> 4);
    }
    bwd_step_addresses<kM>(stage, smem_address(tiles.pt), key_row0 + (lane & 15), 0, lane >> 4);
  }

  uint32_t kv[4];
  uint32_t v[4];
  uint32_t qn[4];
  uint32_t don[4];
  uint32_t qt[4];
  uint32_t dot[4];
  uint32_t stage[4];
};

// S^T = K Q^T (over D_qk) and dP^T = V dO^T (over D_v) for the warp's 32 keys x 32 queries,
// in one loop over the wider; q_bytes, do_bytes: the step's Q and dO buffers.
template <typename Storage, typename Addresses, int kDqk, int kDv>
__device__ __forceinline__ void dkv_scores(float (&st)[2][4][4], float (&dpt)[2][4][4], const Addresses& a,
                                           uint32_t q_bytes, uint32_t do_bytes) {
  constexpr int kQkSteps = kDqk / 16;
  constexpr int kVSteps = kDv / 16;
  constexpr int kQkRow = Addresses::kQkRow;
  constexpr int kVRow = Addresses::kVRow;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
    zero_fragments(st[mi]);
    zero_fragments(dpt[mi]);
  }
#pragma unroll
  for (int kk = 0; kk < (kQkSteps > kVSteps ? kQkSteps : kVSteps); ++kk) {
    uint32_t a_k[2][4];
    uint32_t a_v[2][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      if (kk < kQkSteps) ldmatrix_x4(a_k[mi], a.kv[kk & 3] + (kk >> 2) * 128 + mi * 16 * kQkRow * 2);
      if (kk < kVSteps) ldmatrix_x4(a_v[mi], a.v[kk & 3] + (kk >> 2) * 128 + mi * 16 * kVRow * 2);
    }
#pragma unroll
    for (int np = 0; np < 2; ++np) {
      uint32_t b[4];
      if (kk < kQkSteps) {
        ldmatrix_x4(b, a.qn[kk & 3] + q_bytes + (kk >> 2) * 128 + np * 16 * kQkRow * 2);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          mma_16816<Storage>(st[mi][2 * np], a_k[mi], b[0], b[1]);
          mma_16816<Storage>(st[mi][2 * np + 1], a_k[mi], b[2], b[3]);
        }
      }
      if (kk < kVSteps) {
        ldmatrix_x4(b, a.don[kk & 3] + do_bytes + (kk >> 2) * 128 + np * 16 * kVRow * 2);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          mma_16816<Storage>(dpt[mi][2 * np], a_v[mi], b[0], b[1]);
          mma_16816<Storage>(dpt[mi][2 * np + 1], a_v[mi], b[2], b[3]);
        }
      }
    }
  }
}

// The mask on a step's S^T and dP^T: per key row, the queries that see it form one range;
// relative to this thread's first column of the step (query0) and clamped to [0, kM], each
// element needs two compares. A masked entry gets S^T = -inf (P = 0) and dP^T = 0, so nothing
// leaks into dS. key0: this thread's first key row (key_row0 + group_row from the block's).
template <int kM>
__device__ __forceinline__ void dkv_mask_scores(float (&st)[2][4][4], float (&dpt)[2][4][4], const Segment& seg,
                                                const Mask& mask, int key0, int query0) {
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      int lo = 0;
      int hi = 0;
      key_visible_queries<kM>(seg, mask, key0 + 16 * mi + half * 8, query0, lo, hi);
#pragma unroll
      for (int nf = 0; nf < 4; ++nf) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int column = nf * 8 + c;
          if (column < lo || column >= hi) {
            st[mi][nf][2 * half + c] = -INFINITY;
            dpt[mi][nf][2 * half + c] = 0.0f;
          }
        }
      }
    }
  }
}

// dV += P^T dO and dK += dS^T Q for the warp's 32 keys x its kDvCols and kDkCols columns
// (reduction over the step's kM queries), P^T and dS^T from the stage.
template <typename Storage, typename Addresses, int kDkCols, int kDvCols>
__device__ __forceinline__ void dkv_accumulate(float (&dk)[2][kDkCols / 8][4], float (&dv)[2][kDvCols / 8][4],
                                               const Addresses& a, uint32_t q_bytes, uint32_t do_bytes) {
  constexpr int kM = Addresses::kM;
  constexpr uint32_t kDsBytes = Addresses::kN * kM * 2;
#pragma unroll
  for (int j = 0; j < kM / 16; ++j) {
    uint32_t a_p[2][4];
    uint32_t a_ds[2][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      const uint32_t address = a.stage[j] + mi * 16 * kM * 2;
      ldmatrix_x4(a_p[mi], address);
      ldmatrix_x4(a_ds[mi], address + kDsBytes);
    }
#pragma unroll
    for (int dcol = 0; dcol < (kDkCols > kDvCols ? kDkCols : kDvCols) / 16; ++dcol) {
      uint32_t b[4];
      if (dcol < kDvCols / 16) {
        ldmatrix_x4_trans(b, a.dot[dcol] + do_bytes + j * 16 * Addresses::kVRow * 2);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          mma_16816<Storage>(dv[mi][2 * dcol], a_p[mi], b[0], b[1]);
          mma_16816<Storage>(dv[mi][2 * dcol + 1], a_p[mi], b[2], b[3]);
        }
      }
      if (dcol < kDkCols / 16) {
        ldmatrix_x4_trans(b, a.qt[dcol] + q_bytes + j * 16 * Addresses::kQkRow * 2);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          mma_16816<Storage>(dk[mi][2 * dcol], a_ds[mi], b[0], b[1]);
          mma_16816<Storage>(dk[mi][2 * dcol + 1], a_ds[mi], b[2], b[3]);
        }
      }
    }
  }
}

// The fused pass's dQ share of a step: dQ[q, d] += sum over the block's keys of dS[q, key]
// K[key, d]. With W warps, warp w takes queries [32 (w / (W / 2)), +32) and columns
// [(w % (W / 2)) 2D / W, +2D / W); A = dS read transposed from the key-major stage, B = K read
// transposed from its row-major tile; added by add_dq_rows (atomics).
template <typename Storage, typename Shape, int kDqk, typename Element>
__device__ __forceinline__ void dkv_fused_dq(const BackwardParams& p, const Segment& seg,
                                             const DkvTiles<Element, Shape>& tiles, int head, int m0, int warp,
                                             int lane, int group_row, int pair_col, int64_t q_stride) {
  constexpr int kN = Shape::kTileN;
  constexpr int kM = Shape::kTileM;
  constexpr int kQkRow = Shape::kQkRow;
  constexpr int kColumnGroups = Shape::kWarps / 2;
  constexpr int kCols = kDqk / kColumnGroups;
  static_assert(kCols / 16 <= 4, "one address per 16-column step");
  const int q_row0 = (warp / kColumnGroups) * 32;
  const int col0 = (warp % kColumnGroups) * kCols;
  // ldmatrix addresses: dS^T read transposed (key rows lane % 8 + 8 (lane / 16), query
  // chunk q_row0 / 8 + 2 mi + (lane / 8) % 2), K read transposed (key rows lane % 8 +
  // 8 ((lane / 8) % 2), chunk col0 / 8 + 2 np + lane / 16).
  uint32_t dst_address[4];
  uint32_t kt_address[4];
  bwd_step_addresses<kM>(dst_address, smem_address(tiles.pt) + kN * kM * 2, (lane & 7) + ((lane >> 4) << 3),
                         q_row0 >> 3, (lane >> 3) & 1);
  bwd_step_addresses<kQkRow>(kt_address, smem_address(tiles.k), (lane & 7) + (((lane >> 3) & 1) << 3), col0 >> 3,
                             lane >> 4);
  float dq_part[2][kCols / 8][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) zero_fragments(dq_part[mi]);
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk) {
    uint32_t a[2][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      ldmatrix_x4_trans(a[mi], dst_address[mi] + kk * 16 * kM * 2);
    }
#pragma unroll
    for (int np = 0; np < kCols / 16; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, kt_address[np] + kk * 16 * kQkRow * 2);
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        mma_16816<Storage>(dq_part[mi][2 * np], a[mi], b[0], b[1]);
        mma_16816<Storage>(dq_part[mi][2 * np + 1], a[mi], b[2], b[3]);
      }
    }
  }
  add_dq_rows<kDqk, kCols>(p, seg, head, m0 + q_row0, group_row, col0 + pair_col, q_stride, dq_part);
}

// kFuseDq: also accumulate dQ += dS K into p.dq_accum with fp32 atomics (the order of the
// additions, hence the last bits, varies between runs). Without it dq_kernel computes dQ.
template <typename Storage, int kDqk, int kDv, bool kFuseDq>
__global__ void __launch_bounds__(DkvShape<kDqk, kDv, kFuseDq>::kThreads, DkvShape<kDqk, kDv, kFuseDq>::kMinBlocks)
    dkv_kernel(const BackwardParams p, const BackwardStrides strides) {
  using Element = typename StorageTraits<Storage>::Element;
  using Shape = DkvShape<kDqk, kDv, kFuseDq>;
  constexpr int kN = Shape::kTileN;
  constexpr int kM = Shape::kTileM;
  constexpr int kQkRow = Shape::kQkRow;
  constexpr int kVRow = Shape::kVRow;
  constexpr int kDkCols = Shape::kDkCols;
  constexpr int kDvCols = Shape::kDvCols;
  constexpr int kThreads = Shape::kThreads;
  const int slice = Shape::kSlices > 1 ? static_cast<int>(blockIdx.z) : 0;

  const Mask mask{p.window_left, p.window_right};
  KeyTileWork work;
  if (!work.assign<kN, kM>(p.k_tile_start, p.num_segments, p.segments, p.kv_heads, mask)) return;
  const Segment& seg = work.seg;
  const int kv_head = work.kv_head, n0 = work.n0, valid_k = work.valid_k, m_begin = work.m_begin,
            m_count = work.m_count;
  const int group = p.q_heads / p.kv_heads;
  const int steps = m_count * group;

  extern __shared__ __align__(128) unsigned char smem[];
  const DkvTiles<Element, Shape> tiles(smem);
  // The accumulators (dQ's in the workspace, dK/dV's in the workspace or fp32 dk/dv) are
  // contiguous.
  const int64_t q_stride = static_cast<int64_t>(p.q_heads) * kDqk;
  const int64_t dk_stride = static_cast<int64_t>(p.kv_heads) * kDqk;
  const int64_t dv_stride = static_cast<int64_t>(p.kv_heads) * kDv;

  if (steps == 0) return;  // no query sees these keys: their gradients stay 0

  load_tile_async<kN, kDqk, kThreads, kQkRow>(tiles.k, static_cast<const Element*>(p.k), seg.k_row + n0, valid_k,
                                              strides.k, kv_head);
  load_tile_async<kN, kDv, kThreads, kVRow>(tiles.v, static_cast<const Element*>(p.v), seg.k_row + n0, valid_k,
                                            strides.v, kv_head);
  const DkvQdoLoader<Element, Shape, kDqk, kDv> qdo(p, strides, seg, tiles, kv_head, group, m_begin);
  qdo.load(0, 0, 0);
  cp_async_commit();

  const auto& [warp, lane, group_row, pair_col] = FragmentLane{};
  const int key_row0 = (warp >> 1) * 32;   // the warp's 32 keys (every product)
  const int query_col0 = (warp & 1) * 32;  // its 32 queries of S^T and dP^T
  // Its columns of dK and dV: half of the block's slice of each.
  const int dk_col0 = slice * (kDqk / Shape::kSlices) + (warp & 1) * kDkCols;
  const int dv_col0 = slice * (kDv / Shape::kSlices) + (warp & 1) * kDvCols;
  const DkvWarpAddresses<Element, Shape, kDqk, kDv> addresses(tiles, lane, key_row0, query_col0, dk_col0, dv_col0);
  // Byte offset in the stage of this thread's fragment rows (key_row0 + group_row, + 8, ...)
  // at column pair_col; the swizzled chunk is added per 8-column block.
  const int stage_row_bytes = (key_row0 + group_row) * kM * 2 + pair_col * 2;

  float dk[2][kDkCols / 8][4];
  float dv[2][kDvCols / 8][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
    zero_fragments(dk[mi]);
    zero_fragments(dv[mi]);
  }

  // Step s covers query tile m_begin + s % m_count of head kv_head * group + s / m_count,
  // kept as two counters (m_index, head_index) instead of a division per step.
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
    prefetch_next_and_wait(step + 1 < steps, [&] { qdo.load(next_m, next_head, buffer ^ 1); });
    __syncthreads();
    const uint32_t q_bytes = static_cast<uint32_t>(buffer * kM * kQkRow * 2);
    const uint32_t do_bytes = static_cast<uint32_t>(buffer * kM * kVRow * 2);
    const float* lse_tile = tiles.lse + buffer * kM;
    const float* delta_tile = tiles.delta + buffer * kM;
    const int m0 = (m_begin + m_index) * kM;
    const bool unmasked = dkv_step_unmasked(seg, mask, n0, valid_k, kN, m0, kM);

    {
      float st[2][4][4];
      float dpt[2][4][4];
      dkv_scores<Storage, decltype(addresses), kDqk, kDv>(st, dpt, addresses, q_bytes, do_bytes);
      if (!unmasked) {
        dkv_mask_scores<kM>(st, dpt, seg, mask, n0 + key_row0 + group_row, m0 + query_col0 + pair_col);
      }
      // P^T and dS^T = P^T (dP^T - delta), staged in the storage type for the products
      // below (which read them across warps).
      dkv_probabilities(st, dpt, lse_tile, delta_tile, query_col0 + pair_col, p.scale_log2);
      stage_pt_ds<Storage, kM>(st, dpt, reinterpret_cast<char*>(tiles.pt), stage_row_bytes, query_col0, group_row,
                               kN * kM * 2);
    }
    __syncthreads();  // every warp's P^T and dS^T rows are staged

    dkv_accumulate<Storage, decltype(addresses), kDkCols, kDvCols>(dk, dv, addresses, q_bytes, do_bytes);
    if constexpr (kFuseDq) {
      dkv_fused_dq<Storage, Shape, kDqk>(p, seg, tiles, kv_head * group + head_index, m0, warp, lane, group_row,
                                         pair_col, q_stride);
    }
    m_index = next_m;
    head_index = next_head;
    __syncthreads();  // the Q/dO buffer and the stages are refilled by the next step
  }

  add_dkv_rows<kDqk, kDv, kDkCols, kDvCols>(p, seg, kv_head, n0, key_row0, valid_k, dk_col0, dv_col0, dk_stride,
                                            dv_stride, dk, dv);
}

}  // namespace thdcp::cuda::detail
