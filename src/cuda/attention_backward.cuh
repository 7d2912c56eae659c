// The backward kernels (FA2-style recomputation from lse). Deterministic mode runs two
// passes with no atomics whose order could vary:
//   dq_kernel:  one block per (query tile, query head); loops over the visible key tiles:
//               S = Q K^T, P = exp(S - lse), dP = dO V^T, dS = P (dP - delta), dQ += dS K.
//   dkv_kernel: one block per (key tile of a segment, KV head); loops over the query heads
//               of the group and the query tiles that see the key tile:
//               dV += P^T dO, dK += dS^T Q, accumulated in registers, then added once into
//               fp32 dK/dV (one addition per segment that reaches the key row).
// AttentionOptions::deterministic == false fuses dQ into dkv_kernel instead (dQ += dS K, fp32
// atomics into a workspace), which skips dq_kernel's recomputation of S and dP.
// dkv_kernel is bound by shared-memory reads (ldmatrix) more than by the tensor cores, so it
// splits each product over its warps in two dimensions (FlashAttention-2's layout) to feed
// more MMAs from each fragment read than "one warp owns 16 keys and all of dK/dV" did:
// 32 keys x 32 queries of S^T and dP^T per warp, P^T and dS^T staged in shared memory, then
// 32 keys x D/2 columns of dV and dK per warp. Blocks hold 64 keys (4 warps, two blocks per
// SM) in the deterministic mode and 128 keys (8 warps) when dQ is fused, which halves the
// dQ atomics; the other choice measured slower for each (bench/RESULTS.md).
// dq_kernel: each warp owns 16 query rows (measured faster than 32 rows per warp, whose
// 128-row tiles leave one block per SM or spill).
#pragma once

#include <cmath>

#include "tensor_core.cuh"
#include "tile_ranges.cuh"
#include "tile_shapes.h"
#include "thdcp/cuda/check.h"
#include "thdcp/plan/mask.h"
#include "thdcp/plan/segment.h"

namespace thdcp::cuda::detail {

template <int kHeadDim>
struct DqShape {
  static constexpr int kTileM = kDqTileRows;
  static constexpr int kTileN = 64;
  static constexpr int kWarps = kTileM / 16;
  static constexpr int kThreads = kWarps * 32;
  static constexpr size_t kSmemBytes = (2 * kTileM + 4 * kTileN) * kHeadDim * 2;
};

// kFuseDq selects the tile of the fused-dQ path (see kDkvFusedTileRows in launch.h).
template <int kHeadDim, bool kFuseDq>
struct DkvShape {
  static constexpr int kTileN = kFuseDq ? kDkvFusedTileRows : kDkvTileRows;  // keys per block
  static constexpr int kTileM = 64;            // queries per step
  static constexpr int kWarps = kTileN / 16;
  static constexpr int kThreads = kWarps * 32;
  // Blocks per SM the registers and shared memory allow (one 8-warp block of 128 keys; two
  // 4-warp blocks of 64 keys, which overlap each other's barriers).
  static constexpr int kMinBlocks = kWarps <= 4 ? 2 : 1;
  // Warp w: keys [32 (w / 2), +32); queries [32 (w % 2), +32) of S^T and dP^T, and head-dim
  // columns [(w % 2) D / 2, +D / 2) of dV and dK.
  static_assert(kTileN == 32 * (kWarps / 2) && kTileM == 64, "warp layout");
  // P^T and dS^T staged in storage precision: kTileN key rows of kTileM queries, swizzled
  // like the other tiles: the 16-byte chunk c of row r sits at c ^ (r & 7), so the eight rows
  // an ldmatrix phase reads and the eight rows a fragment store writes fall in different
  // banks. At D = 128: 113 KiB for 64 keys (two blocks fill an
  // H100/H200 SM's 228 KiB), 161 KiB for 128 keys (within sm_80's 163 KiB).
  static constexpr size_t kSmemBytes =
      (2 * kTileN + 4 * kTileM) * kHeadDim * 2 + 4 * kTileM * sizeof(float) + 2 * kTileN * kTileM * 2;
};

// Shared-memory byte addresses of this lane's ldmatrix rows for the four 16-column steps
// kl = 0..3 of a swizzled tile of kRowElements-element rows, starting at 16-byte chunk
// `chunk0` (row & 7 == lane & 7 for every fragment read here): chunk chunk0 + 2 kl + half.
// A step of 64 columns adds 128 bytes, a step of 16 rows 32 kRowElements bytes: constants
// the compiler folds into the loads.
template <int kRowElements>
__device__ __forceinline__ void bwd_step_addresses(uint32_t (&address)[4], uint32_t tile, int row, int chunk0,
                                                   int half) {
  const int x = static_cast<int>(threadIdx.x) & 7;
#pragma unroll
  for (int kl = 0; kl < 4; ++kl) {
    address[kl] = tile + static_cast<uint32_t>(row * kRowElements * 2 + (((chunk0 + 2 * kl + half) ^ x) << 4));
  }
}

// The lse (as a log2 offset) and delta of the two accumulator rows of this thread
// (first_row and first_row + 8 of the segment's query rows; rows >= valid_q get 0). A row
// with lse = -inf saw no key: every P of it is 0, which the mask already gives.
__device__ __forceinline__ void load_row_statistics(const BackwardParams& p, const Segment& seg, int head,
                                                    int m0, int tile_row, int valid_q, float (&lse_log2)[2],
                                                    float (&delta)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = tile_row + half * 8;
    lse_log2[half] = 0.0f;
    delta[half] = 0.0f;
    if (r < valid_q) {
      const int64_t index = static_cast<int64_t>(head) * p.q_rows + seg.q_row + m0 + r;
      const float lse = p.lse[index];
      lse_log2[half] = lse == -INFINITY ? 0.0f : lse * 1.4426950408889634f;
      delta[half] = p.delta[index];
    }
  }
}

// S -> dS = P (dP - delta) in place for a warp's 16 query rows x kN keys in the m16n8
// accumulator layout (this thread: rows q_index and q_index + 8 of the segment, columns
// 8 nf + pair_col + {0, 1} from key index key0). With needs_mask, a masked entry
// (mask_row_keys) gets S = -inf (P = 0) and dP = 0, so nothing leaks into dS.
template <int kN>
__device__ __forceinline__ void dq_softmax_gradient(float (&s)[kN / 8][4], float (&dp)[kN / 8][4], bool needs_mask,
                                                    const Segment& seg, const Mask& mask, int q_index, int key0,
                                                    int pair_col, const float (&lse_log2)[2],
                                                    const float (&delta)[2], float scale_log2) {
  if (needs_mask) {
    mask_row_keys<kN>(seg, mask, q_index, key0, pair_col, [&](int nf, int e) {
      s[nf][e] = -INFINITY;
      dp[nf][e] = 0.0f;
    });
  }
#pragma unroll
  for (int nf = 0; nf < kN / 8; ++nf) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int half = e >> 1;
      const float prob = fast_exp2(fmaf(s[nf][e], scale_log2, -lse_log2[half]));
      s[nf][e] = prob * (dp[nf][e] - delta[half]);
    }
  }
}

// Writes the dQ accumulator rows of this thread (tile rows tile_row, tile_row + 8 below
// span_rows; m16n8 layout over kD columns) times the softmax scale, in fp32 or the storage
// type. Rows past q_len but inside the span are padding: they get the zeros they hold.
template <typename Storage, int kD>
__device__ __forceinline__ void store_dq_rows(const BackwardParams& p, const Strides& dq_strides, const Segment& seg,
                                              int head, int m0, int tile_row, int span_rows, int pair_col,
                                              const float (&dq)[kD / 8][4]) {
  using Traits = StorageTraits<Storage>;
  using Element = typename Traits::Element;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = tile_row + half * 8;
    if (r >= span_rows) continue;
    const int64_t offset = (static_cast<int64_t>(seg.q_row) + m0 + r) * dq_strides.row +
                           static_cast<int64_t>(head) * dq_strides.head + pair_col;
    if (p.dq_fp32) {
      float* dst = static_cast<float*>(p.dq) + offset;
#pragma unroll
      for (int df = 0; df < kD / 8; ++df) {
        *reinterpret_cast<float2*>(dst + df * 8) =
            make_float2(dq[df][2 * half] * p.scale, dq[df][2 * half + 1] * p.scale);
      }
    } else {
      Element* dst = static_cast<Element*>(p.dq) + offset;
#pragma unroll
      for (int df = 0; df < kD / 8; ++df) {
        *reinterpret_cast<uint32_t*>(dst + df * 8) =
            Traits::pack(dq[df][2 * half] * p.scale, dq[df][2 * half + 1] * p.scale);
      }
    }
  }
}

template <typename Storage, int kHeadDim>
__global__ void __launch_bounds__(DqShape<kHeadDim>::kThreads)
    dq_kernel(const BackwardParams p, const BackwardStrides strides) {
  using Traits = StorageTraits<Storage>;
  using Element = typename Traits::Element;
  using Shape = DqShape<kHeadDim>;
  constexpr int kM = Shape::kTileM;
  constexpr int kN = Shape::kTileN;
  constexpr int kD = kHeadDim;
  constexpr int kThreads = Shape::kThreads;

  QueryTileWork work;
  if (!work.assign<kM>(p.q_tile_start, p.num_segments, p.segments, p.q_heads, p.kv_heads)) return;
  const Segment& seg = work.seg;
  const int head = work.head, kv_head = work.kv_head, m0 = work.m0, span_rows = work.span_rows, valid_q = work.valid_q;
  const Mask mask{p.window_left, p.window_right};

  const VisibleKeyTiles<kN> key_tiles(seg, mask, m0, valid_q, kM);
  const int n_begin = key_tiles.begin;
  const int n_end = key_tiles.end;
  const int unmasked_begin = key_tiles.unmasked_begin;
  const int unmasked_end = key_tiles.unmasked_end;

  extern __shared__ __align__(128) unsigned char smem[];
  Element* q_tile = reinterpret_cast<Element*>(smem);
  Element* do_tile = q_tile + kM * kD;
  Element* k_tiles = do_tile + kM * kD;
  Element* v_tiles = k_tiles + 2 * kN * kD;

  const Element* q = static_cast<const Element*>(p.q);
  const Element* dout = static_cast<const Element*>(p.dout);
  const Element* k = static_cast<const Element*>(p.k);
  const Element* v = static_cast<const Element*>(p.v);

  // Rows past q_len are zero-filled: padding rows of dout may hold anything.
  load_tile_async<kM, kD, kThreads>(q_tile, q, seg.q_row + m0, valid_q, strides.q, head);
  load_tile_async<kM, kD, kThreads>(do_tile, dout, seg.q_row + m0, valid_q, strides.dout, head);
  // K/V tile loads (load_tile_async's layout and zero fill) from per-thread row pointers:
  // this thread copies chunk `kv_chunk` of rows kv_row0 + kKvRowStep * i of each tile, so
  // each tile costs one 32x32->64-bit multiply per tensor (row_offset) and each row pass one
  // 64-bit step of each pointer, and the shared-memory offsets past the first are constants
  // (the forward's scheme).
  constexpr int kKvChunks = kD / 8;
  constexpr int kKvRowStep = kThreads / kKvChunks;
  constexpr int kKvPasses = kN * kKvChunks / kThreads;
  static_assert(kN * kKvChunks % kThreads == 0 && kKvRowStep % 8 == 0, "K/V passes keep the swizzle phase");
  const int kv_chunk = static_cast<int>(threadIdx.x) % kKvChunks;
  const int kv_row0 = static_cast<int>(threadIdx.x) / kKvChunks;
  const uint32_t kv_row = static_cast<uint32_t>(seg.k_row) + kv_row0;
  const uint32_t k_smem = smem_address(k_tiles + swizzled_offset<kD>(kv_row0, kv_chunk));
  const uint32_t v_smem = smem_address(v_tiles + swizzled_offset<kD>(kv_row0, kv_chunk));
  auto load_kv = [&](int n, int buffer) {
    const int rows = min(kN, seg.k_len - n * kN) - kv_row0;  // rows this thread may read
    const uint32_t row = kv_row + static_cast<uint32_t>(n * kN);
    const Element* k_src = k + row_offset(strides.k, row, kv_head, kv_chunk);
    const Element* v_src = v + row_offset(strides.v, row, kv_head, kv_chunk);
    const uint32_t buffer_bytes = static_cast<uint32_t>(buffer * kN * kD * 2);
#pragma unroll
    for (int i = 0; i < kKvPasses; ++i) {
      const bool valid = kKvRowStep * i < rows;
      const uint32_t dst = buffer_bytes + static_cast<uint32_t>(kKvRowStep * i * kD * 2);
      cp_async_16(k_smem + dst, valid ? k_src : k, valid);
      cp_async_16(v_smem + dst, valid ? v_src : v, valid);
      k_src += pass_step<kKvRowStep>(strides.k);
      v_src += pass_step<kKvRowStep>(strides.v);
    }
  };
  if (n_begin < n_end) load_kv(n_begin, 0);
  cp_async_commit();

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int group_row = lane >> 2;
  const int pair_col = (lane & 3) * 2;
  const int warp_row0 = warp * 16;

  // ldmatrix addresses (bwd_step_addresses): Q A-fragments (dO at + kM kD elements), K
  // B-fragments read [key][dim] (V at + 2 kN kD elements), K B-fragments read transposed;
  // K and V of buffer 0.
  uint32_t q_address[4];
  uint32_t k_address[4];
  uint32_t kt_address[4];
  bwd_step_addresses<kD>(q_address, smem_address(q_tile), warp_row0 + (lane & 15), 0, lane >> 4);
  bwd_step_addresses<kD>(k_address, smem_address(k_tiles), (lane & 7) + ((lane >> 4) << 3), 0, (lane >> 3) & 1);
  bwd_step_addresses<kD>(kt_address, smem_address(k_tiles), (lane & 7) + (((lane >> 3) & 1) << 3), 0, lane >> 4);
  constexpr uint32_t kDoBytes = kM * kD * 2;      // dO tile past the Q tile
  constexpr uint32_t kVBytes = 2 * kN * kD * 2;   // V buffers past the K buffers

  float lse_log2[2];
  float delta[2];
  load_row_statistics(p, seg, head, m0, warp_row0 + group_row, valid_q, lse_log2, delta);

  float dq[kD / 8][4];
#pragma unroll
  for (int i = 0; i < kD / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;

  for (int n = n_begin; n < n_end; ++n) {
    const int buffer = (n - n_begin) & 1;
    prefetch_next_and_wait(n + 1 < n_end, [&] { load_kv(n + 1, buffer ^ 1); });
    __syncthreads();
    const uint32_t buffer_bytes = static_cast<uint32_t>(buffer * kN * kD * 2);

    float s[kN / 8][4];
    float dp[kN / 8][4];
#pragma unroll
    for (int i = 0; i < kN / 8; ++i) {
      s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
      dp[i][0] = dp[i][1] = dp[i][2] = dp[i][3] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t a[4];
      uint32_t a_do[4];
      ldmatrix_x4(a, q_address[kk & 3] + (kk >> 2) * 128);
      ldmatrix_x4(a_do, q_address[kk & 3] + (kk >> 2) * 128 + kDoBytes);
#pragma unroll
      for (int np = 0; np < kN / 16; ++np) {
        uint32_t b[4];
        const uint32_t address = k_address[kk & 3] + buffer_bytes + (kk >> 2) * 128 + np * 16 * kD * 2;
        ldmatrix_x4(b, address);
        mma_16816<Storage>(s[2 * np], a, b[0], b[1]);
        mma_16816<Storage>(s[2 * np + 1], a, b[2], b[3]);
        ldmatrix_x4(b, address + kVBytes);
        mma_16816<Storage>(dp[2 * np], a_do, b[0], b[1]);
        mma_16816<Storage>(dp[2 * np + 1], a_do, b[2], b[3]);
      }
    }

    const bool needs_mask = n < unmasked_begin || n >= unmasked_end;
    dq_softmax_gradient<kN>(s, dp, needs_mask, seg, mask, m0 + warp_row0 + group_row, n * kN, pair_col, lse_log2,
                            delta, p.scale_log2);

    // dQ += dS K (dS rounded to the storage type for the tensor cores).
#pragma unroll
    for (int j = 0; j < kN / 16; ++j) {
      const uint32_t a[4] = {Traits::pack(s[2 * j][0], s[2 * j][1]), Traits::pack(s[2 * j][2], s[2 * j][3]),
                             Traits::pack(s[2 * j + 1][0], s[2 * j + 1][1]),
                             Traits::pack(s[2 * j + 1][2], s[2 * j + 1][3])};
#pragma unroll
      for (int dp_col = 0; dp_col < kD / 16; ++dp_col) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, kt_address[dp_col & 3] + buffer_bytes + (dp_col >> 2) * 128 + j * 16 * kD * 2);
        mma_16816<Storage>(dq[2 * dp_col], a, b[0], b[1]);
        mma_16816<Storage>(dq[2 * dp_col + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();
  }
  cp_async_wait<0>();
  store_dq_rows<Storage, kD>(p, strides.dq, seg, head, m0, warp_row0 + group_row, span_rows, pair_col, dq);
}

// kFuseDq: also accumulate dQ += dS K into p.dq_accum with fp32 atomics (the order of the
// additions, hence the last bits, varies between runs). Without it dq_kernel computes dQ.
template <typename Storage, int kHeadDim, bool kFuseDq>
__global__ void __launch_bounds__(DkvShape<kHeadDim, kFuseDq>::kThreads, DkvShape<kHeadDim, kFuseDq>::kMinBlocks)
    dkv_kernel(const BackwardParams p, const BackwardStrides strides) {
  using Traits = StorageTraits<Storage>;
  using Element = typename Traits::Element;
  using Shape = DkvShape<kHeadDim, kFuseDq>;
  constexpr int kN = Shape::kTileN;
  constexpr int kM = Shape::kTileM;
  constexpr int kD = kHeadDim;
  constexpr int kHalfD = kD / 2;
  constexpr int kThreads = Shape::kThreads;

  const Mask mask{p.window_left, p.window_right};
  KeyTileWork work;
  if (!work.assign<kN, kM>(p.k_tile_start, p.num_segments, p.segments, p.kv_heads, mask)) return;
  const Segment& seg = work.seg;
  const int kv_head = work.kv_head, n0 = work.n0, valid_k = work.valid_k, m_begin = work.m_begin,
            m_count = work.m_count;
  const int group = p.q_heads / p.kv_heads;
  const int steps = m_count * group;

  extern __shared__ __align__(128) unsigned char smem[];
  Element* k_tile = reinterpret_cast<Element*>(smem);
  Element* v_tile = k_tile + kN * kD;
  Element* q_tiles = v_tile + kN * kD;
  Element* do_tiles = q_tiles + 2 * kM * kD;
  float* lse_rows = reinterpret_cast<float*>(do_tiles + 2 * kM * kD);
  float* delta_rows = lse_rows + 2 * kM;
  Element* pt_tile = reinterpret_cast<Element*>(delta_rows + 2 * kM);  // P^T  [key][query]
  Element* ds_tile = pt_tile + kN * kM;                                  // dS^T [key][query]

  const Element* q = static_cast<const Element*>(p.q);
  const Element* dout = static_cast<const Element*>(p.dout);
  const Element* k = static_cast<const Element*>(p.k);
  const Element* v = static_cast<const Element*>(p.v);
  // The accumulators (dQ's in the workspace, dK/dV's in the workspace or fp32 dk/dv) are
  // contiguous.
  const int64_t q_stride = static_cast<int64_t>(p.q_heads) * kD;
  const int64_t kv_stride = static_cast<int64_t>(p.kv_heads) * kD;

  if (steps == 0) return;  // no query sees these keys: their gradients stay 0

  load_tile_async<kN, kD, kThreads>(k_tile, k, seg.k_row + n0, valid_k, strides.k, kv_head);
  load_tile_async<kN, kD, kThreads>(v_tile, v, seg.k_row + n0, valid_k, strides.v, kv_head);
  // Q/dO tile loads (load_tile_async's layout and zero fill) from per-thread row pointers:
  // this thread copies chunk `q_chunk` of rows q_row0 + kQRowStep * i of each tile, so one
  // 32x32->64-bit multiply per tensor per step (row_offset) and one 64-bit step per row pass
  // address them, and the shared-memory offsets past the first are constants.
  constexpr int kQChunks = kD / 8;
  constexpr int kQRowStep = kThreads / kQChunks;
  constexpr int kQPasses = kM * kQChunks / kThreads;
  static_assert(kM * kQChunks % kThreads == 0 && kQRowStep % 8 == 0, "Q/dO passes keep the swizzle phase");
  const int q_chunk = static_cast<int>(threadIdx.x) % kQChunks;
  const int q_row0 = static_cast<int>(threadIdx.x) / kQChunks;
  const uint32_t q_smem = smem_address(q_tiles + swizzled_offset<kD>(q_row0, q_chunk));
  constexpr uint32_t kDoBytes = 2 * kM * kD * 2;  // the dO buffers past the Q buffers
  // Step s covers query tile m_begin + s % m_count of head kv_head * group + s / m_count,
  // kept as two counters (m_index, head_index) instead of a division per step.
  auto load_q = [&](int m_index, int head_index, int buffer) {
    const int head = kv_head * group + head_index;
    const int m0 = (m_begin + m_index) * kM;
    const int rows = max(0, min(kM, seg.q_len - m0));
    const int thread_rows = rows - q_row0;  // rows this thread may read
    const uint32_t row = static_cast<uint32_t>(seg.q_row + m0) + q_row0;
    const Element* q_src = q + row_offset(strides.q, row, head, q_chunk);
    const Element* do_src = dout + row_offset(strides.dout, row, head, q_chunk);
    const uint32_t buffer_bytes = static_cast<uint32_t>(buffer * kM * kD * 2);
#pragma unroll
    for (int i = 0; i < kQPasses; ++i) {
      const bool valid = kQRowStep * i < thread_rows;
      const uint32_t dst = q_smem + buffer_bytes + static_cast<uint32_t>(kQRowStep * i * kD * 2);
      cp_async_16(dst, valid ? q_src : q, valid);
      cp_async_16(dst + kDoBytes, valid ? do_src : dout, valid);
      q_src += pass_step<kQRowStep>(strides.q);
      do_src += pass_step<kQRowStep>(strides.dout);
    }
    const int t = threadIdx.x;
    if (t < 2 * kM) {
      const int r = t % kM;
      const bool valid = r < rows;
      const int64_t index = static_cast<int64_t>(head) * p.q_rows + seg.q_row + m0 + (valid ? r : 0);
      const float* src = t < kM ? p.lse + index : p.delta + index;
      float* dst = (t < kM ? lse_rows : delta_rows) + buffer * kM + r;
      cp_async_4(smem_address(dst), src, valid);
    }
  };
  load_q(0, 0, 0);
  cp_async_commit();

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int group_row = lane >> 2;
  const int pair_col = (lane & 3) * 2;
  const int key_row0 = (warp >> 1) * 32;     // the warp's 32 keys (every product)
  const int query_col0 = (warp & 1) * 32;    // its 32 queries of S^T and dP^T
  const int dim_col0 = (warp & 1) * kHalfD;  // its head-dim half of dV and dK

  // ldmatrix addresses (bwd_step_addresses): K A-fragments (V at + kN kD elements); Q
  // B-fragments read [query][dim] (dO at + kDoBytes), Q B-fragments read transposed from
  // the warp's head-dim half (likewise); P^T A-fragments of the stage (dS^T at + kN kM
  // elements). Q and dO of buffer 0.
  static_assert(kHalfD / 16 <= 4 && kM / 16 <= 4, "one address per 16-column step");
  constexpr uint32_t kVBytes = kN * kD * 2;
  constexpr uint32_t kDsBytes = kN * kM * 2;
  uint32_t kv_address[4];
  uint32_t qn_address[4];
  uint32_t qt_address[4];
  uint32_t stage_address[4];
  bwd_step_addresses<kD>(kv_address, smem_address(k_tile), key_row0 + (lane & 15), 0, lane >> 4);
  bwd_step_addresses<kD>(qn_address, smem_address(q_tiles), query_col0 + (lane & 7) + ((lane >> 4) << 3), 0,
                         (lane >> 3) & 1);
  bwd_step_addresses<kD>(qt_address, smem_address(q_tiles), (lane & 7) + (((lane >> 3) & 1) << 3), dim_col0 >> 3,
                         lane >> 4);
  bwd_step_addresses<kM>(stage_address, smem_address(pt_tile), key_row0 + (lane & 15), 0, lane >> 4);
  // Byte offset in the stage of this thread's fragment rows (key_row0 + group_row, + 8, ...)
  // at column pair_col; the swizzled chunk is added per 8-column block.
  char* const pt_bytes = reinterpret_cast<char*>(pt_tile);
  const int stage_row_bytes = (key_row0 + group_row) * kM * 2 + pair_col * 2;

  float dk[2][kHalfD / 8][4];
  float dv[2][kHalfD / 8][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int i = 0; i < kHalfD / 8; ++i) {
      dk[mi][i][0] = dk[mi][i][1] = dk[mi][i][2] = dk[mi][i][3] = 0.0f;
      dv[mi][i][0] = dv[mi][i][1] = dv[mi][i][2] = dv[mi][i][3] = 0.0f;
    }
  }

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
    prefetch_next_and_wait(step + 1 < steps, [&] { load_q(next_m, next_head, buffer ^ 1); });
    __syncthreads();
    const uint32_t buffer_bytes = static_cast<uint32_t>(buffer * kM * kD * 2);
    const float* lse_tile = lse_rows + buffer * kM;
    const float* delta_tile = delta_rows + buffer * kM;
    const int m0 = (m_begin + m_index) * kM;
    const bool unmasked = dkv_step_unmasked(seg, mask, n0, valid_k, kN, m0, kM);

    {
      // S^T = K Q^T and dP^T = V dO^T for the warp's 32 keys x 32 queries.
      float st[2][4][4];
      float dpt[2][4][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          st[mi][i][0] = st[mi][i][1] = st[mi][i][2] = st[mi][i][3] = 0.0f;
          dpt[mi][i][0] = dpt[mi][i][1] = dpt[mi][i][2] = dpt[mi][i][3] = 0.0f;
        }
      }
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t a_k[2][4];
        uint32_t a_v[2][4];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          const uint32_t address = kv_address[kk & 3] + (kk >> 2) * 128 + mi * 16 * kD * 2;
          ldmatrix_x4(a_k[mi], address);
          ldmatrix_x4(a_v[mi], address + kVBytes);
        }
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          uint32_t b[4];
          const uint32_t address = qn_address[kk & 3] + buffer_bytes + (kk >> 2) * 128 + np * 16 * kD * 2;
          ldmatrix_x4(b, address);
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) {
            mma_16816<Storage>(st[mi][2 * np], a_k[mi], b[0], b[1]);
            mma_16816<Storage>(st[mi][2 * np + 1], a_k[mi], b[2], b[3]);
          }
          ldmatrix_x4(b, address + kDoBytes);
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) {
            mma_16816<Storage>(dpt[mi][2 * np], a_v[mi], b[0], b[1]);
            mma_16816<Storage>(dpt[mi][2 * np + 1], a_v[mi], b[2], b[3]);
          }
        }
      }

      if (!unmasked) {
        // Per key row, the queries that see it form one range; relative to this thread's
        // first column of the step and clamped to [0, kM], each element needs two compares.
        // A masked entry gets S^T = -inf (P = 0) and dP^T = 0, so nothing leaks into dS.
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            int lo = 0;
            int hi = 0;
            key_visible_queries<kM>(seg, mask, n0 + key_row0 + 16 * mi + group_row + half * 8,
                                    m0 + query_col0 + pair_col, lo, hi);
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

      // P^T and dS^T = P^T (dP^T - delta), staged in the storage type for the products
      // below (which read them across warps). A query row with lse = -inf (it saw no key)
      // gets the offset +inf, hence P = 0.
#pragma unroll
      for (int nf = 0; nf < 4; ++nf) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int column = query_col0 + nf * 8 + pair_col + c;
          const float lse = lse_tile[column];
          const float offset = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
          const float row_delta = delta_tile[column];
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const int e = 2 * half + c;
              const float prob = fast_exp2(fmaf(st[mi][nf][e], p.scale_log2, -offset));
              st[mi][nf][e] = prob;
              dpt[mi][nf][e] = prob * (dpt[mi][nf][e] - row_delta);
            }
          }
        }
      }
#pragma unroll
      for (int nf = 0; nf < 4; ++nf) {
        const int chunk_bytes = ((((query_col0 >> 3) + nf) ^ group_row) & 7) << 4;
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int offset = stage_row_bytes + chunk_bytes + (16 * mi + 8 * half) * kM * 2;
            *reinterpret_cast<uint32_t*>(pt_bytes + offset) =
                Traits::pack(st[mi][nf][2 * half], st[mi][nf][2 * half + 1]);
            *reinterpret_cast<uint32_t*>(pt_bytes + kDsBytes + offset) =
                Traits::pack(dpt[mi][nf][2 * half], dpt[mi][nf][2 * half + 1]);
          }
        }
      }
    }
    __syncthreads();  // every warp's P^T and dS^T rows are staged

    // dV += P^T dO and dK += dS^T Q for the warp's 32 keys x D/2 columns (reduction over
    // the step's kM queries).
#pragma unroll
    for (int j = 0; j < kM / 16; ++j) {
      uint32_t a_p[2][4];
      uint32_t a_ds[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        const uint32_t address = stage_address[j] + mi * 16 * kM * 2;
        ldmatrix_x4(a_p[mi], address);
        ldmatrix_x4(a_ds[mi], address + kDsBytes);
      }
#pragma unroll
      for (int dcol = 0; dcol < kHalfD / 16; ++dcol) {
        uint32_t b[4];
        const uint32_t address = qt_address[dcol] + buffer_bytes + j * 16 * kD * 2;
        ldmatrix_x4_trans(b, address + kDoBytes);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          mma_16816<Storage>(dv[mi][2 * dcol], a_p[mi], b[0], b[1]);
          mma_16816<Storage>(dv[mi][2 * dcol + 1], a_p[mi], b[2], b[3]);
        }
        ldmatrix_x4_trans(b, address);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          mma_16816<Storage>(dk[mi][2 * dcol], a_ds[mi], b[0], b[1]);
          mma_16816<Storage>(dk[mi][2 * dcol + 1], a_ds[mi], b[2], b[3]);
        }
      }
    }

    if constexpr (kFuseDq) {
      // dQ[q, d] += sum over the block's keys of dS[q, key] K[key, d]. With W warps, warp w
      // takes queries [32 (w / (W / 2)), +32) and columns [(w % (W / 2)) 2D / W, +2D / W);
      // A = dS read transposed from the key-major stage, B = K read transposed from its
      // row-major tile.
      constexpr int kColumnGroups = Shape::kWarps / 2;
      constexpr int kCols = kD / kColumnGroups;
      static_assert(kCols / 16 <= 4, "one address per 16-column step");
      const int q_row0 = (warp / kColumnGroups) * 32;
      const int col0 = (warp % kColumnGroups) * kCols;
      // ldmatrix addresses: dS^T read transposed (key rows lane % 8 + 8 (lane / 16), query
      // chunk q_row0 / 8 + 2 mi + (lane / 8) % 2), K read transposed (key rows lane % 8 +
      // 8 ((lane / 8) % 2), chunk col0 / 8 + 2 np + lane / 16).
      uint32_t dst_address[4];
      uint32_t kt_address[4];
      bwd_step_addresses<kM>(dst_address, smem_address(pt_tile) + kDsBytes, (lane & 7) + ((lane >> 4) << 3),
                             q_row0 >> 3, (lane >> 3) & 1);
      bwd_step_addresses<kD>(kt_address, smem_address(k_tile), (lane & 7) + (((lane >> 3) & 1) << 3), col0 >> 3,
                             lane >> 4);
      float dq_part[2][kCols / 8][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
        for (int nf = 0; nf < kCols / 8; ++nf) {
          dq_part[mi][nf][0] = dq_part[mi][nf][1] = dq_part[mi][nf][2] = dq_part[mi][nf][3] = 0.0f;
        }
      }
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
          ldmatrix_x4_trans(b, kt_address[np] + kk * 16 * kD * 2);
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) {
            mma_16816<Storage>(dq_part[mi][2 * np], a[mi], b[0], b[1]);
            mma_16816<Storage>(dq_part[mi][2 * np + 1], a[mi], b[2], b[3]);
          }
        }
      }
      const int head = kv_head * group + head_index;
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int q_index = m0 + q_row0 + mi * 16 + group_row + half * 8;
          if (q_index >= seg.q_len) continue;
          float* dst = p.dq_accum + (static_cast<int64_t>(seg.q_row) + q_index) * q_stride +
                       static_cast<int64_t>(head) * kD + col0 + pair_col;
#pragma unroll
          for (int nf = 0; nf < kCols / 8; ++nf) {
            atomicAdd(dst + nf * 8, dq_part[mi][nf][2 * half]);
            atomicAdd(dst + nf * 8 + 1, dq_part[mi][nf][2 * half + 1]);
          }
        }
      }
    }
    m_index = next_m;
    head_index = next_head;
    __syncthreads();  // the Q/dO buffer and the stages are refilled by the next step
  }

  // One fp32 addition per (segment, element): with at most two segments reaching a key row
  // and the accumulator starting at zero, the result does not depend on their order.
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int key_local = key_row0 + 16 * mi + group_row + half * 8;
      if (key_local >= valid_k) continue;
      const int64_t key = static_cast<int64_t>(seg.k_row) + n0 + key_local;
      const int64_t offset = (p.dkv_rows ? p.dkv_rows[key] : key) * kv_stride + static_cast<int64_t>(kv_head) * kD +
                             dim_col0 + pair_col;
#pragma unroll
      for (int df = 0; df < kHalfD / 8; ++df) {
        atomicAdd(p.dk_accum + offset + df * 8, dk[mi][df][2 * half] * p.scale);
        atomicAdd(p.dk_accum + offset + df * 8 + 1, dk[mi][df][2 * half + 1] * p.scale);
        atomicAdd(p.dv_accum + offset + df * 8, dv[mi][df][2 * half]);
        atomicAdd(p.dv_accum + offset + df * 8 + 1, dv[mi][df][2 * half + 1]);
      }
    }
  }
}

}  // namespace thdcp::cuda::detail
