// dq_kernel: the deterministic backward's dQ pass of the portable (mma.sync) kernels; the
// passes and shapes are described in attention_backward.cuh.
#pragma once

#include "attention_backward.cuh"
#include "kv_loader.cuh"

namespace thdcp::cuda::detail {

template <typename Storage, int kDqk, int kDv>
__global__ void __launch_bounds__(DqShape<kDqk, kDv>::kThreads)
    dq_kernel(const BackwardParams p, const BackwardStrides strides) {
  using Element = typename StorageTraits<Storage>::Element;
  using Shape = DqShape<kDqk, kDv>;
  constexpr int kM = Shape::kTileM;
  constexpr int kN = Shape::kTileN;
  constexpr int kQkRow = Shape::kQkRow;
  constexpr int kVRow = Shape::kVRow;
  constexpr int kThreads = Shape::kThreads;

  QueryTileWork work;
  if (!work.assign<kM>(p.q_tile_start, p.num_segments, p.segments, p.q_heads, p.kv_heads)) return;
  const Segment& seg = work.seg;
  const Mask mask{p.window_left, p.window_right};

  const VisibleKeyTiles<kN> key_tiles(seg, mask, work.m0, work.valid_q, kM);
  const int n_begin = key_tiles.begin;
  const int n_end = key_tiles.end;
  const int unmasked_begin = key_tiles.unmasked_begin;
  const int unmasked_end = key_tiles.unmasked_end;

  extern __shared__ __align__(128) unsigned char smem[];
  Element* q_tile = reinterpret_cast<Element*>(smem);
  Element* do_tile = q_tile + kM * kQkRow;
  Element* k_tiles = do_tile + kM * kVRow;
  Element* v_tiles = k_tiles + 2 * kN * kQkRow;

  const Element* q = static_cast<const Element*>(p.q);
  const Element* dout = static_cast<const Element*>(p.dout);
  const Element* k = static_cast<const Element*>(p.k);
  const Element* v = static_cast<const Element*>(p.v);

  // Rows past q_len are zero-filled: padding rows of dout may hold anything.
  load_tile_async<kM, kDqk, kThreads, kQkRow>(q_tile, q, seg.q_row + work.m0, work.valid_q, strides.q, work.head);
  load_tile_async<kM, kDv, kThreads, kVRow>(do_tile, dout, seg.q_row + work.m0, work.valid_q, strides.dout, work.head);
  const KvTileLoader<Element, kN, kDqk, kDv, kThreads> kv(k, v, strides.k, strides.v, seg, work.kv_head, k_tiles,
                                                          v_tiles);
  if (n_begin < n_end) kv.load(n_begin, 0);
  cp_async_commit();

  const auto& [warp, lane, group_row, pair_col] = FragmentLane{};
  const int warp_row0 = warp * 16;

  // ldmatrix addresses (bwd_step_addresses): Q and dO A-fragments, K and V B-fragments read
  // [key][dim], K B-fragments read transposed; K and V of buffer 0. Where the rows of Q and
  // dO (K and V) are alike, dO's (V's) are Q's (K's) plus a constant.
  uint32_t q_address[4];
  uint32_t do_address[4];
  uint32_t k_address[4];
  uint32_t v_address[4];
  uint32_t kt_address[4];
  bwd_step_addresses<kQkRow>(q_address, smem_address(q_tile), warp_row0 + (lane & 15), 0, lane >> 4);
  bwd_step_addresses<kQkRow>(k_address, smem_address(k_tiles), (lane & 7) + ((lane >> 4) << 3), 0, (lane >> 3) & 1);
  bwd_step_addresses<kQkRow>(kt_address, smem_address(k_tiles), (lane & 7) + (((lane >> 3) & 1) << 3), 0,
                             lane >> 4);
  if constexpr (kQkRow == kVRow) {
    constexpr uint32_t kDoBytes = kM * kQkRow * 2;     // dO tile past the Q tile
    constexpr uint32_t kVBytes = 2 * kN * kQkRow * 2;  // V buffers past the K buffers
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      do_address[i] = q_address[i] + kDoBytes;
      v_address[i] = k_address[i] + kVBytes;
    }
  } else {
    bwd_step_addresses<kVRow>(do_address, smem_address(do_tile), warp_row0 + (lane & 15), 0, lane >> 4);
    bwd_step_addresses<kVRow>(v_address, smem_address(v_tiles), (lane & 7) + ((lane >> 4) << 3), 0,
                              (lane >> 3) & 1);
  }

  float lse_log2[2];
  float delta[2];
  load_row_statistics(p, seg, work.head, work.m0, warp_row0 + group_row, work.valid_q, lse_log2, delta);

  float dq[kDqk / 8][4];
  zero_fragments(dq);

  for (int n = n_begin; n < n_end; ++n) {
    const int buffer = (n - n_begin) & 1;
    prefetch_next_and_wait(n + 1 < n_end, [&] { kv.load(n + 1, buffer ^ 1); });
    __syncthreads();
    const uint32_t k_buffer_bytes = static_cast<uint32_t>(buffer * kN * kQkRow * 2);
    const uint32_t v_buffer_bytes = static_cast<uint32_t>(buffer * kN * kVRow * 2);

    float s[kN / 8][4];
    float dp[kN / 8][4];
    zero_fragments(s);
    zero_fragments(dp);
    // S = Q K^T over D_qk and dP = dO V^T over D_v, in one loop over the wider.
#pragma unroll
    for (int kk = 0; kk < (kDqk > kDv ? kDqk : kDv) / 16; ++kk) {
      constexpr int kQkSteps = kDqk / 16;
      constexpr int kVSteps = kDv / 16;
      uint32_t a[4];
      uint32_t a_do[4];
      if (kk < kQkSteps) ldmatrix_x4(a, q_address[kk & 3] + (kk >> 2) * 128);
      if (kk < kVSteps) ldmatrix_x4(a_do, do_address[kk & 3] + (kk >> 2) * 128);
#pragma unroll
      for (int np = 0; np < kN / 16; ++np) {
        uint32_t b[4];
        if (kk < kQkSteps) {
          ldmatrix_x4(b, k_address[kk & 3] + k_buffer_bytes + (kk >> 2) * 128 + np * 16 * kQkRow * 2);
          mma_16816<Storage>(s[2 * np], a, b[0], b[1]);
          mma_16816<Storage>(s[2 * np + 1], a, b[2], b[3]);
        }
        if (kk < kVSteps) {
          ldmatrix_x4(b, v_address[kk & 3] + v_buffer_bytes + (kk >> 2) * 128 + np * 16 * kVRow * 2);
          mma_16816<Storage>(dp[2 * np], a_do, b[0], b[1]);
          mma_16816<Storage>(dp[2 * np + 1], a_do, b[2], b[3]);
        }
      }
    }

    const bool needs_mask = n < unmasked_begin || n >= unmasked_end;
    dq_softmax_gradient<kN>(s, dp, needs_mask, seg, mask, work.m0 + warp_row0 + group_row, n * kN, pair_col, lse_log2,
                            delta, p.scale_log2);

    // dQ += dS K (dS rounded to the storage type for the tensor cores).
#pragma unroll
    for (int j = 0; j < kN / 16; ++j) {
      uint32_t a[4];
      accumulator_to_a_fragment<Storage>(s[2 * j], s[2 * j + 1], a);
#pragma unroll
      for (int dp_col = 0; dp_col < kDqk / 16; ++dp_col) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, kt_address[dp_col & 3] + k_buffer_bytes + (dp_col >> 2) * 128 + j * 16 * kQkRow * 2);
        mma_16816<Storage>(dq[2 * dp_col], a, b[0], b[1]);
        mma_16816<Storage>(dq[2 * dp_col + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();
  }
  cp_async_wait<0>();
  store_dq_rows<Storage, kDqk>(p, strides.dq, seg, work.head, work.m0, warp_row0 + group_row, work.span_rows, pair_col,
                               dq);
}

}  // namespace thdcp::cuda::detail
