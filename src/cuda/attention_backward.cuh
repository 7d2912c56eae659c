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

// Head dims kDqk (q, k, dq) and kDv (v, dout); shared-memory rows of kQkRow and kVRow
// elements. Above 128 columns, key tiles of 32 rows keep the K/V buffers within sm_80's
// shared memory.
template <int kDqk, int kDv>
struct DqShape {
  static constexpr int kTileM = kDqTileRows;
  static constexpr int kTileN = kDqk > 128 || kDv > 128 ? 32 : 64;
  static constexpr int kWarps = kTileM / 16;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kQkRow = smem_row_elements(kDqk);
  static constexpr int kVRow = smem_row_elements(kDv);
  static constexpr size_t kSmemBytes = (kTileM + 2 * kTileN) * (kQkRow + kVRow) * 2;
};

// kFuseDq selects the tile of the fused-dQ path (see kDkvFusedTileRows in launch.h).
template <int kDqk, int kDv, bool kFuseDq>
struct DkvShape {
  static constexpr int kTileN = kFuseDq ? kDkvFusedTileRows : kDkvTileRows;  // keys per block
  static constexpr int kTileM = 64;            // queries per step
  static constexpr int kWarps = kTileN / 16;
  static constexpr int kThreads = kWarps * 32;
  // Blocks per SM the registers and shared memory allow (one 8-warp block of 128 keys; two
  // 4-warp blocks of 64 keys, which overlap each other's barriers).
  static constexpr int kMinBlocks = kWarps <= 4 ? 2 : 1;
  // Column slices (the grid's z, dkv_column_slices): block z owns columns [z D / kSlices,
  // +D / kSlices) of dK (D = D_qk) and of dV (D = D_v).
  static constexpr int kSlices = dkv_column_slices(kDqk, kDv);
  // Warp w: keys [32 (w / 2), +32); queries [32 (w % 2), +32) of S^T and dP^T, and the
  // (w % 2)-th half of the block's columns of dV and dK: kDkCols and kDvCols of them.
  static constexpr int kDkCols = kDqk / (2 * kSlices);
  static constexpr int kDvCols = kDv / (2 * kSlices);
  static_assert(kTileN == 32 * (kWarps / 2) && kTileM == 64, "warp layout");
  static_assert(kDkCols % 16 == 0 && kDvCols % 16 == 0 && kDkCols <= 64 && kDvCols <= 64,
                "16-column steps, one address per step");
  static_assert(!kFuseDq || portable_fuses_dq(kDqk, kDv), "dQ fused at D_qk = D_v in {64, 128} only");
  static constexpr int kQkRow = smem_row_elements(kDqk);
  static constexpr int kVRow = smem_row_elements(kDv);
  // K, V, two Q and two dO tiles, the lse and delta rows, and P^T and dS^T staged in storage
  // precision: kTileN key rows of kTileM queries, swizzled like the other tiles: the 16-byte
  // chunk c of row r sits at c ^ (r & 7), so the eight rows an ldmatrix phase reads and the
  // eight rows a fragment store writes fall in different banks. At D = 128: 113 KiB for 64
  // keys (two blocks fill an H100/H200 SM's 228 KiB), 161 KiB for 128 keys (within sm_80's
  // 163 KiB); at 256, 209 KiB (Hopper's 227 KiB; more than sm_80 gives a block).
  static constexpr size_t kSmemBytes =
      (kTileN + 2 * kTileM) * (kQkRow + kVRow) * 2 + 4 * kTileM * sizeof(float) + 2 * kTileN * kTileM * 2;
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

// Enqueues (cp.async) the lse and delta of query rows [m0, m0 + kM) of `head` into buffer
// `buffer` of lse_rows / delta_rows ([2][kM] floats each): thread t < kM copies lse row t,
// kM <= t < 2 kM delta row t - kM; with kGuarded, threads t >= 2 kM do nothing (blocks of
// more threads), without it the block has exactly 2 kM. Rows at and past `rows` are
// zero-filled. The dK/dV passes load them beside each query tile.
template <int kM, bool kGuarded>
__device__ __forceinline__ void load_row_statistics_async(const BackwardParams& p, const Segment& seg, int head,
                                                          int m0, int rows, float* lse_rows, float* delta_rows,
                                                          int buffer) {
  const int t = threadIdx.x;
  if (kGuarded && t >= 2 * kM) return;
  const int r = t % kM;
  const bool valid = r < rows;
  const int64_t index = static_cast<int64_t>(head) * p.q_rows + seg.q_row + m0 + (valid ? r : 0);
  const float* src = t < kM ? p.lse + index : p.delta + index;
  float* dst = (t < kM ? lse_rows : delta_rows) + buffer * kM + r;
  cp_async_4(smem_address(dst), src, valid);
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

}  // namespace thdcp::cuda::detail
