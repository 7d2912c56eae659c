// The forward kernel: one block per (query tile of a segment, query head), FA2-style.
//
// Four warps share a 128-row query tile; each owns 32 rows (two MMA fragments). Key/value tiles of 64 rows
// stream through a double buffer filled by cp.async while the previous tile is used. Only
// the key tiles that the mask leaves visible to some row of the query tile are visited, and
// only tiles that straddle the mask's edge (or the segment's end) evaluate it per element.
#pragma once

#include <cmath>

#include "tensor_core.cuh"
#include "thdcp/cuda/check.h"
#include "thdcp/mask.h"
#include "thdcp/segment.h"

namespace thdcp::cuda::detail {

template <int kHeadDim>
struct ForwardShape {
  static constexpr int kTileM = kForwardTileRows;
  static constexpr int kTileN = 64;
  static constexpr int kFragmentsPerWarp = 2;  // 32 query rows per warp: each K/V fragment
                                               // read from shared memory feeds two MMAs
  static constexpr int kWarps = kTileM / (16 * kFragmentsPerWarp);
  static constexpr int kThreads = kWarps * 32;
  static constexpr size_t kSmemBytes = (kTileM + 4 * kTileN) * kHeadDim * 2;
};

template <typename Storage, int kHeadDim>
__global__ void __launch_bounds__(ForwardShape<kHeadDim>::kThreads) forward_kernel(const ForwardParams p) {
  using Traits = StorageTraits<Storage>;
  using Element = typename Traits::Element;
  using Shape = ForwardShape<kHeadDim>;
  constexpr int kM = Shape::kTileM;
  constexpr int kN = Shape::kTileN;
  constexpr int kD = kHeadDim;
  constexpr int kThreads = Shape::kThreads;
  constexpr int kMF = Shape::kFragmentsPerWarp;

  const int total_tiles = __ldg(p.tile_start + p.num_segments);
  if (static_cast<int>(blockIdx.x) >= total_tiles) return;  // grid is sized by capacity
  // Last tiles first: under a causal mask they are the longest, so the tail of the grid is
  // made of short blocks.
  const int tile = total_tiles - 1 - static_cast<int>(blockIdx.x);
  const int head = blockIdx.y;
  const int segment_index = find_segment(p.tile_start, p.num_segments, tile);
  const Segment seg = p.segments[segment_index];
  const int m0 = (tile - __ldg(p.tile_start + segment_index)) * kM;
  const int span_rows = min(kM, seg.q_span - m0);
  const int valid_q = max(0, min(kM, seg.q_len - m0));
  const int kv_head = head / (p.q_heads / p.kv_heads);
  const Mask mask{p.window_left, p.window_right};

  // Key tiles that some row of this tile sees, and the key range every row sees.
  int n_begin = 0;
  int n_end = 0;
  int64_t full_begin = 0;
  int64_t full_end = 0;
  if (valid_q > 0 && seg.k_len > 0) {
    const PositionRange first = segment_visible_keys(seg, mask, m0);
    const PositionRange last = segment_visible_keys(seg, mask, m0 + valid_q - 1);
    const int64_t key_begin = first.begin - seg.k_pos;
    const int64_t key_end = last.end - seg.k_pos;
    if (key_end > key_begin) {
      n_begin = static_cast<int>(key_begin / kN);
      n_end = static_cast<int>((key_end + kN - 1) / kN);
    }
    full_begin = last.begin - seg.k_pos;
    full_end = first.end - seg.k_pos;
  }
  // Key tiles [unmasked_begin, unmasked_end) need no per-element mask: every row of the
  // tile is a valid query that sees every key of the tile. Empty unless all rows are valid.
  int unmasked_begin = 0;
  int unmasked_end = 0;
  if (valid_q == kM && full_end - full_begin >= kN) {
    unmasked_begin = static_cast<int>((full_begin + kN - 1) / kN);
    unmasked_end = static_cast<int>(full_end / kN);
  }

  extern __shared__ __align__(128) unsigned char smem[];
  Element* q_tile = reinterpret_cast<Element*>(smem);
  Element* k_tiles = q_tile + kM * kD;
  Element* v_tiles = k_tiles + 2 * kN * kD;

  const Element* q = static_cast<const Element*>(p.q);
  const Element* k = static_cast<const Element*>(p.k);
  const Element* v = static_cast<const Element*>(p.v);
  const int64_t q_stride = static_cast<int64_t>(p.q_heads) * kD;
  const int64_t kv_stride = static_cast<int64_t>(p.kv_heads) * kD;

  load_tile_async<kM, kD, kThreads>(q_tile, q, seg.q_row + m0, valid_q, q_stride, head);
  auto load_kv = [&](int n, int buffer) {
    const int rows = min(kN, seg.k_len - n * kN);
    load_tile_async<kN, kD, kThreads>(k_tiles + buffer * kN * kD, k, seg.k_row + n * kN, rows, kv_stride, kv_head);
    load_tile_async<kN, kD, kThreads>(v_tiles + buffer * kN * kD, v, seg.k_row + n * kN, rows, kv_stride, kv_head);
  };
  if (n_begin < n_end) load_kv(n_begin, 0);
  cp_async_commit();

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int group_row = lane >> 2;  // row within an 8-row half of a fragment
  const int pair_col = (lane & 3) * 2;
  const int warp_row0 = warp * 16 * kMF;

  // Fragment mi of the warp covers tile rows warp_row0 + 16 * mi + [0, 16); of it this
  // thread holds rows group_row and group_row + 8 ("halves").
  float o[kMF][kD / 8][4];
  float row_max[kMF][2];  // raw (unscaled) scores
  float row_sum[kMF][2];  // this thread's part of the denominator
#pragma unroll
  for (int mi = 0; mi < kMF; ++mi) {
#pragma unroll
    for (int i = 0; i < kD / 8; ++i) o[mi][i][0] = o[mi][i][1] = o[mi][i][2] = o[mi][i][3] = 0.0f;
    row_max[mi][0] = row_max[mi][1] = -INFINITY;
    row_sum[mi][0] = row_sum[mi][1] = 0.0f;
  }

  for (int n = n_begin; n < n_end; ++n) {
    const int buffer = (n - n_begin) & 1;
    if (n + 1 < n_end) {
      load_kv(n + 1, buffer ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const Element* k_tile = k_tiles + buffer * kN * kD;
    const Element* v_tile = v_tiles + buffer * kN * kD;

    // S = Q K^T; each K fragment serves the warp's kMF query fragments.
    float s[kMF][kN / 8][4];
#pragma unroll
    for (int mi = 0; mi < kMF; ++mi) {
#pragma unroll
      for (int i = 0; i < kN / 8; ++i) s[mi][i][0] = s[mi][i][1] = s[mi][i][2] = s[mi][i][3] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t a[kMF][4];
#pragma unroll
      for (int mi = 0; mi < kMF; ++mi) load_a_fragment<kD>(a[mi], q_tile, warp_row0 + 16 * mi, kk * 16);
#pragma unroll
      for (int np = 0; np < kN / 16; ++np) {
        uint32_t b[4];
        load_b_fragments_nk<kD>(b, k_tile, np * 16, kk * 16);
#pragma unroll
        for (int mi = 0; mi < kMF; ++mi) {
          mma_16816<Storage>(s[mi][2 * np], a[mi], b[0], b[1]);
          mma_16816<Storage>(s[mi][2 * np + 1], a[mi], b[2], b[3]);
        }
      }
    }

    const int key0 = n * kN;
    const bool needs_mask = n < unmasked_begin || n >= unmasked_end;
    if (needs_mask) {
#pragma unroll
      for (int mi = 0; mi < kMF; ++mi) {
#pragma unroll
        for (int nf = 0; nf < kN / 8; ++nf) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int q_index = m0 + warp_row0 + 16 * mi + group_row + (e >> 1) * 8;
            const int key_index = key0 + nf * 8 + pair_col + (e & 1);
            const bool allowed = q_index < seg.q_len && key_index < seg.k_len &&
                                 mask.allows(static_cast<int64_t>(seg.q_pos) + q_index,
                                             static_cast<int64_t>(seg.k_pos) + key_index);
            if (!allowed) s[mi][nf][e] = -INFINITY;
          }
        }
      }
    }

    // Online softmax over the rows this thread holds.
#pragma unroll
    for (int mi = 0; mi < kMF; ++mi) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int nf = 0; nf < kN / 8; ++nf) {
          tile_max = fmaxf(tile_max, fmaxf(s[mi][nf][2 * half], s[mi][nf][2 * half + 1]));
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float new_max = fmaxf(row_max[mi][half], tile_max);
        // A row that has seen only masked keys keeps max -inf; subtracting 0 then keeps
        // exp2(-inf) = 0 instead of NaN.
        const float offset = (new_max == -INFINITY ? 0.0f : new_max) * p.scale_log2;
        const float correction = exp2f(row_max[mi][half] * p.scale_log2 - offset);
        row_max[mi][half] = new_max;
        row_sum[mi][half] *= correction;
#pragma unroll
        for (int df = 0; df < kD / 8; ++df) {
          o[mi][df][2 * half] *= correction;
          o[mi][df][2 * half + 1] *= correction;
        }
#pragma unroll
        for (int nf = 0; nf < kN / 8; ++nf) {
#pragma unroll
          for (int e = 2 * half; e < 2 * half + 2; ++e) {
            const float prob = exp2f(fmaf(s[mi][nf][e], p.scale_log2, -offset));
            s[mi][nf][e] = prob;
            row_sum[mi][half] += prob;
          }
        }
      }
    }

    // O += P V, with P rounded to the storage type for the tensor cores; each V fragment
    // serves the warp's kMF fragments.
#pragma unroll
    for (int j = 0; j < kN / 16; ++j) {
      uint32_t a[kMF][4];
#pragma unroll
      for (int mi = 0; mi < kMF; ++mi) {
        a[mi][0] = Traits::pack(s[mi][2 * j][0], s[mi][2 * j][1]);
        a[mi][1] = Traits::pack(s[mi][2 * j][2], s[mi][2 * j][3]);
        a[mi][2] = Traits::pack(s[mi][2 * j + 1][0], s[mi][2 * j + 1][1]);
        a[mi][3] = Traits::pack(s[mi][2 * j + 1][2], s[mi][2 * j + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < kD / 16; ++dp) {
        uint32_t b[4];
        load_b_fragments_kn<kD>(b, v_tile, j * 16, dp * 16);
#pragma unroll
        for (int mi = 0; mi < kMF; ++mi) {
          mma_16816<Storage>(o[mi][2 * dp], a[mi], b[0], b[1]);
          mma_16816<Storage>(o[mi][2 * dp + 1], a[mi], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // the buffer is refilled by the next iteration
  }
  cp_async_wait<0>();

  Element* out = static_cast<Element*>(p.out);
  float thread_max = -INFINITY;
#pragma unroll
  for (int mi = 0; mi < kMF; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float sum = row_sum[mi][half];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int r = warp_row0 + 16 * mi + group_row + half * 8;
      const bool seen = sum > 0.0f;  // false for padding rows and rows that see no key
      const float inv = seen ? 1.0f / sum : 0.0f;
      if (seen) thread_max = fmaxf(thread_max, row_max[mi][half] * p.scale);
      if (r < span_rows) {
        const int64_t row = static_cast<int64_t>(seg.q_row) + m0 + r;
        Element* dst = out + row * q_stride + static_cast<int64_t>(head) * kD + pair_col;
#pragma unroll
        for (int df = 0; df < kD / 8; ++df) {
          *reinterpret_cast<uint32_t*>(dst + df * 8) =
              Traits::pack(o[mi][df][2 * half] * inv, o[mi][df][2 * half + 1] * inv);
        }
        if ((lane & 3) == 0) {
          p.lse[static_cast<int64_t>(head) * p.q_rows + row] =
              seen ? row_max[mi][half] * p.scale + logf(sum) : -INFINITY;
        }
      }
    }
  }
  if (p.max_logit != nullptr) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      thread_max = fmaxf(thread_max, __shfl_xor_sync(0xffffffffu, thread_max, offset));
    }
    if (lane == 0 && thread_max > -INFINITY) atomic_max_float(p.max_logit + head, thread_max);
  }
}

template <typename Storage, int kHeadDim>
void launch_forward(const ForwardParams& params, int grid_tiles, cudaStream_t stream) {
  using Shape = ForwardShape<kHeadDim>;
  static const cudaError_t attribute_status = cudaFuncSetAttribute(
      forward_kernel<Storage, kHeadDim>, cudaFuncAttributeMaxDynamicSharedMemorySize, Shape::kSmemBytes);
  THDCP_CHECK_CUDA(attribute_status);
  if (grid_tiles == 0 || params.q_heads == 0) return;
  const dim3 grid(static_cast<unsigned>(grid_tiles), static_cast<unsigned>(params.q_heads));
  forward_kernel<Storage, kHeadDim><<<grid, Shape::kThreads, Shape::kSmemBytes, stream>>>(params);
  THDCP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace thdcp::cuda::detail
