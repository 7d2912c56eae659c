// dK, dV and dQ in one pass on Hopper (sm_90a), head dim 128: FlashAttention-3's backward
// layout over the segment table. A block owns 128 keys of one KV head and loops over the
// query tiles that see them (64 queries per step) and the query heads of the group:
//   - two consumer warpgroups own 64 keys each and run dkv_kernel_sm90's step,
//       S^T = K Q^T, dP^T = V dO^T, P^T, dS^T = P^T (dP^T - delta),
//       dV += P^T dO, dK += dS^T Q,
//     then store dS^T to shared memory, and each computes half of the step's dQ columns
//     over all 128 keys,
//       dQ_part[:, 64 w .. 64 w + 63] = dS K[:, 64 w .. 64 w + 63]   (m64n64k16 x 8, dS read
//                                                                    M-major, K MN-major),
//     which it stages in fp32 in shared memory;
//   - one writer warp adds each staged partial to the query tile's fp32 accumulator in
//     p.dq_accum by bulk reductions (cp.reduce.async.bulk), off the consumers' path.
// dQ is then stored by dq_store_kernel. The Q/dO tiles of a step are loaded with cp.async by
// the consumers, double-buffered.
//
// Order (p.dq_order, zeroed by the host; required): the key tiles of a segment add into a
// query tile in increasing order, each after the one before has completed, counted by the
// query tile's entry of p.dq_order; the first one writes the accumulator tile instead of
// adding to it, so the accumulator needs no zeroing. Same bits on every run. The steps go
// over the query tiles last first with the heads of the group inside, so key tile n reaches
// a query tile at the same step index as key tile n - 1 (causal) or later: each block runs
// about one step behind the one before it. A block waits only for blocks of lower index,
// which start first.
#pragma once

#include "attention_backward.cuh"
#include "attention_dkv_sm90.cuh"
#include "sm90_pipeline.cuh"
#include "wgmma.cuh"

namespace thdcp::cuda::detail {

struct DkvqSm90Shape {
  static constexpr int kD = 128;
  static constexpr int kKeys = kDkvqTileRows;  // per block: two consumer warpgroups of 64
  static constexpr int kTileM = 64;            // queries per step
  static constexpr int kThreads = 384;         // the writer's warpgroup, then two consumers
  static constexpr int kConsumerThreads = 256;
  static constexpr int kWriterRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  static constexpr uint32_t kTileBytes = 64 * kD * 2;  // a 64-row wgmma tile: 16 KiB
  static constexpr uint32_t kDsBytes = 64 * 64 * 2;    // one warpgroup's dS^T
  static constexpr uint32_t kDqHalfBytes = 64 * 64 * 4;  // one warpgroup's dQ columns, fp32
  // Byte offsets from the 1024-aligned base: K of each consumer, V of each, two buffers of a
  // step's [Q dO], the two dS^T tiles, the two staged dQ halves, lse and delta of two steps.
  static constexpr uint32_t kK = 0;
  static constexpr uint32_t kV = 2 * kTileBytes;
  static constexpr uint32_t kQdo = 4 * kTileBytes;
  static constexpr uint32_t kDs = 8 * kTileBytes;
  static constexpr uint32_t kDq = kDs + 2 * kDsBytes;
  static constexpr uint32_t kStats = kDq + 2 * kDqHalfBytes;
  static constexpr size_t kSmemBytes = kStats + 4 * kTileM * sizeof(float) + 1024;  // 178 KiB
  // Named barriers (0 is __syncthreads): the consumers' own, and the staged dQ's full / empty
  // hand-over between the consumers and the writer warp.
  static constexpr int kConsumerBarrier = 1;
  static constexpr int kDqFull = 2;
  static constexpr int kDqEmpty = 3;
  static constexpr int kHandOverThreads = kConsumerThreads + 32;
  static_assert(kWriterRegisters * 128 + 2 * kConsumerRegisters * 128 <= 65536, "registers of the block");
};

// Spins until *flag == value (one thread; acquire: what was released with the count is
// visible to this thread after it).
__device__ __forceinline__ void wait_for_count(const int* flag, int value) {
  int seen = 0;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(flag) : "memory");
  } while (seen != value);
}

// Element offset of (row, column) in one half (64 columns) of an fp32 dQ accumulator tile:
// p.dq_accum holds, for each (query tile of the dQ grid, query head), 64 rows x 128 columns
// as two halves of 64 x 64 ([tile][head][half][64 x 64]); in a half, rows of 64 whose
// 8-column groups are XOR-swizzled by row % 8, so that the float2 stores of a warp's
// accumulator fragments hit distinct banks.
__device__ __forceinline__ int dq_half_offset(int row, int column) {
  return row * 64 + ((((column >> 3) ^ (row & 7))) << 3) + (column & 7);
}

// The writer (warp 0 of warpgroup 0; lane 0 issues): each step's staged dQ_part, added to the
// fp32 accumulator tile of its (query tile, head) in key-tile order (see above).
template <typename StepTile, typename StepHead>
__device__ __forceinline__ void dkvq_sm90_write(const BackwardParams& p, const Segment& seg, const Mask& mask,
                                                int segment_index, int n_tile, int steps, uint32_t base,
                                                const StepTile& step_tile, const StepHead& step_head) {
  using Shape = DkvqSm90Shape;
  constexpr int kD = Shape::kD;
  constexpr int kM = Shape::kTileM;
  constexpr int kKeys = Shape::kKeys;
  const int q_tile_base = __ldg(p.q_tile_start + segment_index);
  for (int step = 0; step < steps; ++step) {
    named_barrier_sync(Shape::kDqFull, Shape::kHandOverThreads);
    int* order = nullptr;
    if (threadIdx.x == 0) {
      const int m_tile = step_tile(step);
      const int64_t q_tile = static_cast<int64_t>(q_tile_base) + m_tile;
      const int64_t slot = q_tile * p.q_heads + step_head(step);
      float* accum = p.dq_accum + slot * (64 * kD);
      order = p.dq_order + slot;
      const int rank = n_tile - static_cast<int>(first_key_tile_reaching(seg, mask, m_tile, kM, kKeys));
      wait_for_count(order, rank);
      asm volatile("fence.proxy.async.global;\n" ::: "memory");  // the acquire, before the async proxy
      const uint32_t src = base + Shape::kDq;
      if (rank == 0) {  // the first key tile writes the tile (never zeroed), the others add
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(accum), "r"(src),
                     "r"(2 * Shape::kDqHalfBytes)
                     : "memory");
      } else {
        asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(accum),
                     "r"(src), "r"(2 * Shape::kDqHalfBytes)
                     : "memory");
      }
      asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
      asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    }
    __syncwarp();
    if (step + 1 < steps) {
      asm volatile("bar.arrive %0, %1;\n" ::"r"(Shape::kDqEmpty), "r"(Shape::kHandOverThreads) : "memory");
    }
    if (order) {  // the next key tile's addition starts after this one has completed
      asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
      asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
      asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(order) : "memory");
    }
  }
  if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// A consumer thread's dS^T fragments (rows key_row, key_row + 8 of its warpgroup's tile) to
// the tile at ds_row (this thread's first row and column, wgmma_tile_offset<64> without the
// XOR by row % 8 = group_row, which ds_swizzle applies at the store).
__device__ __forceinline__ void store_ds_rows(const uint32_t (&dst)[4][4], uint32_t ds_row, uint32_t ds_swizzle) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int chunk = 2 * j + (i >> 1);
      uint32_t offset;
      asm volatile("xor.b32 %0, %1, %2;\n" : "=r"(offset) : "r"(ds_swizzle), "r"(chunk << 4));
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(ds_row + (i & 1) * 8 * 128 + offset), "r"(dst[j][i]) : "memory");
    }
  }
}

// A consumer thread's dQ_part rows to the staging tile at dq_row0 (dq_half_offset without its
// XOR by row % 8, which dq_swizzle applies at the store).
__device__ __forceinline__ void stage_dq_rows(const float (&dq)[8][4], uint32_t dq_row0, uint32_t dq_swizzle) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int df = 0; df < 8; ++df) {
      uint32_t offset;
      asm volatile("xor.b32 %0, %1, %2;\n" : "=r"(offset) : "r"(dq_swizzle), "r"(df << 5));
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(dq_row0 + half * 8 * 64 * 4 + offset),
                   "f"(dq[df][2 * half]), "f"(dq[df][2 * half + 1])
                   : "memory");
    }
  }
}

// dQ_part[:, 64 w .. 64 w + 63] = dS K over the block's 128 keys (0 where no consumer's keys
// are visible): A = dS^T tile j read M-major, B = column block w of consumer j's K tile,
// MN-major. Issued, committed and waited for.
template <typename Storage>
__device__ __forceinline__ void dkvq_dq_part(float (&dq)[8][4], const bool (&visible)[2], uint32_t ds_tiles,
                                             uint32_t base, int w) {
  using Shape = DkvqSm90Shape;
  zero_fragments(dq);  // no visible keys: 0
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    if (!visible[j]) continue;
    const uint32_t a_tile = ds_tiles + static_cast<uint32_t>(j) * Shape::kDsBytes;
    const uint32_t b_tile =
        base + Shape::kK + static_cast<uint32_t>(j) * Shape::kTileBytes + static_cast<uint32_t>(w) * 64 * 128;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      // Accumulate from the second product on (the first visible consumer's first k-step
      // overwrites the zeros).
      WgmmaSs<Storage, 64>::template run<1, 1>(flat(dq), wgmma_desc_mn_major<64>(a_tile, kk),
                                               wgmma_desc_mn_major<64>(b_tile, kk), kk > 0 || (j == 1 && visible[0]));
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operands(flat(dq));
}

// The consumer warpgroups (w = 0, 1: keys n0 + 64 w .. n0 + 64 w + 63): each step's S^T, dP^T,
// dV, dK of their keys, the dS^T tiles, and dQ_part staged for the writer; then their dK/dV.
template <typename Storage, typename StepTile, typename StepHead>
__device__ __forceinline__ void dkvq_sm90_consume(const BackwardParams& p, const BackwardStrides& strides,
                                                  const Segment& seg, const Mask& mask, int kv_head, int n0,
                                                  int valid_k, int steps, uint32_t base, float* stats, int w,
                                                  const StepTile& step_tile, const StepHead& step_head) {
  using Traits = StorageTraits<Storage>;
  using Element = typename Traits::Element;
  using Shape = DkvqSm90Shape;
  constexpr int kD = Shape::kD;
  constexpr int kM = Shape::kTileM;
  const int ct = static_cast<int>(threadIdx.x) - 128;  // 0..255 over both consumers
  const int t = ct % 128;                // in this warpgroup
  const int key0 = n0 + 64 * w;
  const int valid_keys = max(0, min(64, valid_k - 64 * w));
  const uint32_t k_tile = base + Shape::kK + static_cast<uint32_t>(w) * Shape::kTileBytes;
  const uint32_t v_tile = base + Shape::kV + static_cast<uint32_t>(w) * Shape::kTileBytes;
  const uint32_t ds_tiles = base + Shape::kDs;
  const uint32_t dq_half = base + Shape::kDq + static_cast<uint32_t>(w) * Shape::kDqHalfBytes;
  const Element* q = static_cast<const Element*>(p.q);
  const Element* dout = static_cast<const Element*>(p.dout);

  // K and V of this warpgroup's keys (rows past the valid ones are zero-filled).
  load_wgmma_tile_async_from<64, kD, 128>(k_tile, static_cast<const Element*>(p.k), seg.k_row + key0, valid_keys,
                                          strides.k, kv_head, t);
  load_wgmma_tile_async_from<64, kD, 128>(v_tile, static_cast<const Element*>(p.v), seg.k_row + key0, valid_keys,
                                          strides.v, kv_head, t);
  auto load_q = [&](int step, int buffer) {
    const int head = step_head(step);
    const int m0 = step_tile(step) * kM;
    const int rows = max(0, min(kM, seg.q_len - m0));
    const uint32_t q_dst = base + Shape::kQdo + static_cast<uint32_t>(buffer) * 2 * Shape::kTileBytes;
    load_wgmma_tile_async_from<kM, kD, 256>(q_dst, q, seg.q_row + m0, rows, strides.q, head, ct);
    load_wgmma_tile_async_from<kM, kD, 256>(q_dst + Shape::kTileBytes, dout, seg.q_row + m0, rows, strides.dout,
                                            head, ct);
    if (ct < 2 * kM) {
      const int r = ct % kM;
      const bool valid = r < rows;
      const int64_t index = static_cast<int64_t>(head) * p.q_rows + seg.q_row + m0 + (valid ? r : 0);
      const float* src = ct < kM ? p.lse + index : p.delta + index;
      float* dst = stats + (ct < kM ? 0 : 2 * kM) + buffer * kM + r;
      cp_async_4(smem_address(dst), src, valid);
    }
  };
  load_q(0, 0);
  cp_async_commit();

  const int warp = t / 32;
  const int lane = t % 32;
  const int group_row = lane >> 2;
  const int pair_col = (lane & 3) * 2;
  // This thread's rows of the accumulators: key rows of S^T, dP^T, dK, dV (of the
  // warpgroup's 64), query rows of dQ_part.
  const int key_row = 16 * warp + group_row;

  // The query tiles [half_tiles[2 j], half_tiles[2 j + 1]) that visit consumer j's keys
  // (DkvQueryTiles; none for a consumer without valid keys).
  int half_tiles[4];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int keys = max(0, min(64, valid_k - 64 * j));
    const DkvQueryTiles tiles(seg, mask, n0 + 64 * j, keys, kM);
    half_tiles[2 * j] = tiles.begin;
    half_tiles[2 * j + 1] = keys > 0 ? tiles.begin + tiles.count : tiles.begin;
  }

  float dk[kD / 8][4];
  float dv[kD / 8][4];
  zero_fragments(dk);
  zero_fragments(dv);
  // The staging address of this thread's first dQ_part row (dq_half_offset without its XOR
  // by row % 8 = group_row, which is applied at the store).
  const uint32_t dq_row0 = dq_half + static_cast<uint32_t>(key_row * 64 + pair_col) * 4;
  const uint32_t dq_swizzle = static_cast<uint32_t>(group_row) << 5;
  // The same for this thread's dS^T rows in its warpgroup's tile (wgmma_tile_offset<64>).
  const uint32_t ds_row =
      ds_tiles + static_cast<uint32_t>(w) * Shape::kDsBytes + static_cast<uint32_t>(key_row * 128 + pair_col * 2);
  const uint32_t ds_swizzle = static_cast<uint32_t>(group_row) << 4;

  for (int step = 0; step < steps; ++step) {
    const int buffer = step & 1;
    cp_async_wait<0>();          // this step's Q/dO (and on step 0 K/V)
    fence_proxy_async_shared();  // this thread's cp.async data, visible to wgmma
    // Both consumers: this step's tiles are in; last step's products (which read the other
    // buffer and the dS^T tiles) have landed in both.
    named_barrier_sync(Shape::kConsumerBarrier, Shape::kConsumerThreads);
    if (step + 1 < steps) load_q(step + 1, buffer ^ 1);
    cp_async_commit();
    const uint32_t q_tile = base + Shape::kQdo + static_cast<uint32_t>(buffer) * 2 * Shape::kTileBytes;
    const uint32_t do_tile = q_tile + Shape::kTileBytes;
    const float* lse_tile = stats + buffer * kM;
    const float* delta_tile = stats + 2 * kM + buffer * kM;
    const int m_tile = step_tile(step);
    const int m0 = m_tile * kM;
    const bool visible[2] = {m_tile >= half_tiles[0] && m_tile < half_tiles[1],
                             m_tile >= half_tiles[2] && m_tile < half_tiles[3]};

    // A consumer whose keys no query of this tile sees skips the step's products (both
    // leave its keys out of dQ_part below).
    if (visible[w]) {
      float st[kM / 8][4];
      float dpt[kM / 8][4];
      wgmma_ss_k_major_pair<Storage, kM, 64, kM, kD / 16, kD / 16>(st, k_tile, q_tile, dpt, v_tile, do_tile);
      wgmma_wait<1>();
      wgmma_fence_operands(flat(st));

      uint32_t pt[kM / 16][4];
      uint32_t dst[kM / 16][4];
      dkv_step_products<Storage, kM, kD>(st, dpt, dv, dk, pt, dst, seg, mask, key0, key_row, m0, pair_col,
                                         dkv_step_unmasked(seg, mask, key0, valid_keys, 64, m0, kM), lse_tile,
                                         delta_tile, p.scale_log2, q_tile, do_tile);

      // dS^T of this warpgroup's keys to its tile (rows key_row, key_row + 8; query columns
      // 16 j + pair_col + {0, 1} and 16 j + 8 + ...: accumulator_to_a_fragments' order).
      // Byte address: ds_row + 8 x 128 (i & 1) + ((chunk ^ group_row) << 4) (wgmma_tile_offset),
      // the XOR computed at the store rather than kept in registers across the loop.
      store_ds_rows(dst, ds_row, ds_swizzle);
    }
    fence_proxy_async_shared();  // (the dS^T stores)
    named_barrier_sync(Shape::kConsumerBarrier, Shape::kConsumerThreads);  // both dS^T tiles
    // dV/dK read P^T and dS^T from registers: let them land before dQ_part's accumulator
    // takes registers of its own.
    wgmma_wait<0>();
    wgmma_fence_operands(flat(dv));
    wgmma_fence_operands(flat(dk));

    // dQ_part of this warpgroup's columns over the block's 128 keys.
    float dq[8][4];
    dkvq_dq_part<Storage>(dq, visible, ds_tiles, base, w);

    if (step > 0) named_barrier_sync(Shape::kDqEmpty, Shape::kHandOverThreads);  // the writer read the last one
    stage_dq_rows(dq, dq_row0, dq_swizzle);
    fence_proxy_async_shared();  // the staged partial, visible to the bulk reduction
    asm volatile("bar.arrive %0, %1;\n" ::"r"(Shape::kDqFull), "r"(Shape::kHandOverThreads) : "memory");
  }

  add_dkv_rows<Storage, kD>(p, seg, kv_head, key0, key_row, valid_keys, pair_col, dk, dv);
}

template <typename Storage>
__global__ void __launch_bounds__(DkvqSm90Shape::kThreads, 1)
    dkvq_kernel_sm90(const BackwardParams p, const BackwardStrides strides) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Shape = DkvqSm90Shape;
  constexpr int kM = Shape::kTileM;
  constexpr int kKeys = Shape::kKeys;

  const Mask mask{p.window_left, p.window_right};
  KeyTileWork work;
  if (!work.assign<kKeys, kM>(p.k_tile_start, p.num_segments, p.segments, p.kv_heads, mask)) return;
  const Segment& seg = work.seg;
  const int segment_index = work.segment_index, kv_head = work.kv_head, n_tile = work.n_tile, n0 = work.n0,
            valid_k = work.valid_k, m_begin = work.m_begin, m_count = work.m_count;
  const int group = p.q_heads / p.kv_heads;
  const int steps = m_count * group;
  if (steps == 0) return;  // no query sees these keys: their gradients stay 0

  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_address = smem_address(smem_raw);
  const uint32_t base = (raw_address + 1023u) & ~1023u;
  float* stats = reinterpret_cast<float*>(smem_raw + (base + Shape::kStats - raw_address));  // lse[2][64], delta[2][64]

  const int warpgroup = static_cast<int>(threadIdx.x) / 128;
  // Step s covers query tile m_begin + m_count - 1 - s / group of head kv_head * group + s %
  // group.
  const auto step_tile = [&](int step) { return m_begin + m_count - 1 - step / group; };
  const auto step_head = [&](int step) { return kv_head * group + step % group; };

  if (warpgroup == 0) {
    // The writer: warp 0, lane 0 issues; the other warps of the warpgroup leave.
    setmaxnreg_dec<Shape::kWriterRegisters>();
    if (threadIdx.x >= 32) return;
    dkvq_sm90_write(p, seg, mask, segment_index, n_tile, steps, base, step_tile, step_head);
    return;
  }

  setmaxnreg_inc<Shape::kConsumerRegisters>();
  dkvq_sm90_consume<Storage>(p, strides, seg, mask, kv_head, n0, valid_k, steps, base, stats, warpgroup - 1,
                             step_tile, step_head);
#endif
}

// dQ of the fused pass: the block of (query tile of the dQ grid, query head), 128 threads,
// reads the tile's fp32 accumulator (dq_half_offset) and stores the tile's span rows of dq,
// scaled by the softmax scale (rows past q_len hold 0: their partials were 0). A warp takes
// 16 rows, one row at a time, each lane 4 consecutive columns: 16-byte loads from the
// accumulator and one contiguous row store per warp. After dkvq_kernel_sm90 on the same
// stream.
template <typename Storage>
__global__ void __launch_bounds__(128) dq_store_kernel(const BackwardParams p, const BackwardStrides strides) {
  using Traits = StorageTraits<Storage>;
  using Element = typename Traits::Element;
  constexpr int kD = DkvqSm90Shape::kD;
  static_assert(kD == 128, "a warp's 32 lanes x 4 columns are one row");
  int tile = 0;
  int head = 0;
  if (!block_tile_and_head(p.q_tile_start, p.num_segments, p.q_heads, false, tile, head)) return;
  const int segment_index = find_segment(p.q_tile_start, p.num_segments, tile);
  const Segment seg = p.segments[segment_index];
  const int m0 = (tile - __ldg(p.q_tile_start + segment_index)) * 64;
  const int span_rows = min(64, seg.q_span - m0);
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int row0 = 16 * (static_cast<int>(threadIdx.x) / 32);
  const int column = 4 * lane;  // of dq; in half column / 64 of the accumulator tile
  const float* accum =
      p.dq_accum + (static_cast<int64_t>(tile) * p.q_heads + head) * (64 * kD) + (column / 64) * 64 * 64;
  // A tile whose valid queries see no key was written by no key tile (its dQ is 0); every
  // other one was, by the first key tile that visits it (DkvQueryTiles is a bound of these).
  const int valid_q = max(0, min(64, seg.q_len - m0));
  const VisibleKeyTiles<64> key_tiles(seg, Mask{p.window_left, p.window_right}, m0, valid_q, 64);
  const bool written = key_tiles.begin < key_tiles.end;
  float4 v[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    v[i] = written && row0 + i < span_rows
               ? *reinterpret_cast<const float4*>(accum + dq_half_offset(row0 + i, column % 64))
               : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    if (row0 + i >= span_rows) break;
    const int64_t offset = (static_cast<int64_t>(seg.q_row) + m0 + row0 + i) * strides.dq.row +
                           static_cast<int64_t>(head) * strides.dq.head + column;
    if (p.dq_fp32) {
      *reinterpret_cast<float4*>(static_cast<float*>(p.dq) + offset) =
          make_float4(v[i].x * p.scale, v[i].y * p.scale, v[i].z * p.scale, v[i].w * p.scale);
    } else {
      const uint2 packed = make_uint2(Traits::pack(v[i].x * p.scale, v[i].y * p.scale),
                                      Traits::pack(v[i].z * p.scale, v[i].w * p.scale));
      *reinterpret_cast<uint2*>(static_cast<Element*>(p.dq) + offset) = packed;
    }
  }
}

}  // namespace thdcp::cuda::detail
