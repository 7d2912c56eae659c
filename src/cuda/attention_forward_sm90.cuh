// The forward on Hopper (sm_90a), warp-specialized (the schedule of FlashAttention-3): a work
// item is a query tile of one head (128 rows at head dim 128, 192 and 256, 192 at 64), and a persistent
// block (one per SM) of a producer and two or three consumer warpgroups takes items in turn.
//   - The producer (warpgroup 0; one thread issues every copy) loads each item's Q tile once
//     (two Q buffers, so the next item's Q can land while the current one is still read) and
//     the K and V tiles of 128 keys (64 at D_v 256) through a two-stage pipeline with TMA
//     (sm90_pipeline.cuh), by coordinates in tensor maps of the whole THD tensors
//     (tensor_map.h).
//   - The consumer warpgroups own 64 query rows each and run, per key tile n,
//       S = Q K^T        (wgmma m64n128k16, Q and K read K-major from shared memory),
//       online softmax   (registers),
//       O += P V         (wgmma, P from registers, V read MN-major),
//     with the softmax of tile n overlapping the P V product of tile n - 1 ("intra-warpgroup
//     overlap"): O is rescaled only after that product has landed.
// setmaxnreg moves registers from the producer (40 per thread with two consumers, 32 with
// three) to the consumers (232, resp. 160).
// Masks, the key tiles visited and the block order are forward_kernel's; the softmax and the
// epilogue are the units both share (softmax.cuh, epilogue.cuh).
//
// Rows a tile copies past a segment's keys (its padding, the next segment's rows) are
// masked out of S; V's such rows are zeroed in shared memory before P V reads them, so
// that P = 0 never multiplies a NaN of a padding row. Rows past the tensor's end arrive as
// zeros.
#pragma once

#include <cmath>

#include "epilogue.cuh"
#include "sm90_pipeline.cuh"
#include "softmax.cuh"
#include "tile_ranges.cuh"
#include "tile_shapes.h"
#include "wgmma.cuh"
#include "thdcp/plan/mask.h"
#include "thdcp/plan/segment.h"

namespace thdcp::cuda::detail {

// Head dims kDqk (q, k) and kDv (v, out).
template <int kDqk, int kDv>
struct ForwardSm90Shape {
  static constexpr int kTileM = forward_sm90_tile_rows(kDqk);  // 64 rows per consumer warpgroup
  static constexpr int kTileN = forward_sm90_key_rows(kDv);
  static constexpr int kStages = 2;  // K/V tiles in flight
  // Q tiles: the current item's and the next one's; one above D_qk 128 (shared memory).
  static constexpr int kQStages = kDqk > 128 ? 1 : 2;
  static constexpr int kSlots = 4;    // work item descriptions (ForwardItem), see the kernel
  static constexpr int kConsumers = kTileM / 64;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kProducerRegisters = kConsumers == 2 ? 40 : 32;
  static constexpr int kConsumerRegisters = kConsumers == 2 ? 232 : 160;
  // 128-byte swizzle atoms per row of Q and K, and of V.
  static constexpr int kQkBlocks = kDqk / 64;
  static constexpr int kVBlocks = kDv / 64;
  static constexpr uint32_t kQBytes = kTileM * kDqk * 2;
  static constexpr uint32_t kKBytes = kTileN * kDqk * 2;
  static constexpr uint32_t kVBytes = kTileN * kDv * 2;
  // kQStages Q tiles, then kStages K tiles, then kStages V tiles (each 1024-byte aligned for
  // the swizzle), then the barriers: Q full and empty per Q stage, K full/empty and V
  // full/empty per stage, then the kSlots slots of work items (ForwardItem, 64 bytes each).
  static constexpr uint32_t kBarrierOffset = kQStages * kQBytes + kStages * (kKBytes + kVBytes);
  static constexpr uint32_t kItemOffset = kBarrierOffset + 8 * (2 * kQStages + 4 * kStages);
  static constexpr size_t kSmemBytes = kItemOffset + kSlots * 64 + 1024;
  static_assert(kTileM == 64 * kConsumers, "64 query rows per consumer warpgroup");
  static_assert(kDqk % 64 == 0 && kDv % 64 == 0, "whole swizzle atoms");
  // setmaxnreg moves registers inside the block's allocation (launch bounds: 65536 / kThreads,
  // rounded down to a multiple of 8, per thread); asking for more waits forever.
  static_assert(kProducerRegisters * 128 + kConsumerRegisters * 128 * kConsumers <=
                    65536 / kThreads / 8 * 8 * kThreads,
                "the warpgroups' registers exceed the block's");
};

// Zeroes rows [first_row, kRows) of every column block of a wgmma tile of kRows rows at
// `tile` (all 128 threads of a warpgroup, `thread` = 0..127) and makes the zeros visible to
// the warpgroup's next wgmma (named barrier `barrier_id`).
template <int kRows, int kColumnBlocks>
__device__ __forceinline__ void zero_tile_rows(uint32_t tile, int first_row, int thread, int barrier_id) {
  const int chunks = (kRows - first_row) * 8;  // 16-byte chunks of those rows in one block
#pragma unroll
  for (int b = 0; b < kColumnBlocks; ++b) {
    const uint32_t base = tile + static_cast<uint32_t>((b * kRows + first_row) * 128);
    for (int c = thread; c < chunks; c += 128) {
      asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(base + 16u * c), "r"(0) : "memory");
    }
  }
  fence_proxy_async_shared();
  named_barrier_sync(barrier_id, 128);
}

// Copies the box of rows [row, row + kRows) of head `head` (all kColumnBlocks column blocks)
// of the tensor of `map` into the wgmma tile at `dst`, completing on `barrier`.
template <int kRows, int kColumnBlocks>
__device__ __forceinline__ void tma_load_rows(uint32_t dst, const ThdTensorMap& map, int head, int row,
                                              uint32_t barrier) {
  // A box of kRows rows of one head either way: (64, 1, kRows) or, heads outer, (64, kRows, 1).
  const int inner = map.heads_outer ? row : head;
  const int outer = map.heads_outer ? head : row;
#pragma unroll
  for (int b = 0; b < kColumnBlocks; ++b) {
    tma_load_3d(dst + static_cast<uint32_t>(b * kRows * 128), &map.map, 64 * b, inner, outer, barrier);
  }
}

// The consumers' turns at the tensor cores ("ping-pong", round robin over kConsumers): a
// consumer issues its GEMMs of a step only on its turn and then hands the turn to the next,
// so that one warpgroup's softmax runs while another's GEMMs do. Named barriers
// kFirstBarrier + consumer (of 256 threads: the waiting warpgroup's sync and the previous
// one's arrive); zero_tile_rows takes barriers 1 .. kConsumers. Consumer 0 has the first
// turn; all take the same number of turns, and consumer 0 takes the last consumer's final
// hand-over at the end, so that each arrive is matched by a sync.
template <int kConsumers>
struct TensorCoreTurns {
  static constexpr int kFirstBarrier = 1 + kConsumers;
  static_assert(kFirstBarrier + kConsumers <= 16, "16 named barriers");
  int consumer;
  __device__ __forceinline__ void start() const {
    if (consumer == kConsumers - 1) arrive_(0);
  }
  __device__ __forceinline__ void wait() const { named_barrier_sync(kFirstBarrier + consumer, 256); }
  __device__ __forceinline__ void pass() const {
    arrive_(kConsumers == 2 ? 1 - consumer : (consumer + 1 == kConsumers ? 0 : consumer + 1));
  }

 private:
  __device__ __forceinline__ void arrive_(int next) const {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(kFirstBarrier + next), "r"(256) : "memory");
  }
};

// Persistent: the grid has one block per SM (launch_forward). Block b's first work item is b;
// after that its producer takes the next one from a counter (p.work_counter, zeroed by the
// schedule kernel), so items go out in the forward's order (QueryTileWork::assign_item: tiles
// last first, heads fastest) to whichever block is free first, as a grid of blocks would,
// and the producer loads the next item's Q and K/V while the consumers finish the last
// product and store the outputs of the current one. Item u (the u-th of the block) takes Q
// buffer u % kQStages and slot u % kSlots. The producer describes item u + 1 (its
// QueryTileWork, found from the counter and the tile prefix sums: global loads) after it has
// issued the loads of item u's first K/V tile, so that latency is not in front of them, and
// hands it over with the Q tile (the Q barrier's arrival; an item with no visible key gets
// the arrival alone, an invalid slot ends the loop). It writes slot (u + 1) % kSlots after
// waiting, in iteration u, for the consumers to release the Q of item u - kQStages, which
// they do after reading every slot up to that item's; the slot's last item, u + 1 - kSlots,
// is at most that one (kSlots >= kQStages + 1). Counters of Q and K/V stage uses run on
// across items (their barrier phases follow from them).
// A work item as the producer hands it to the consumers (in shared memory).
struct ForwardItem {
  QueryTileWork work;
  int valid;  // 0: no item left
};
static_assert(sizeof(ForwardItem) <= 64, "slots of 64 bytes (ForwardSm90Shape::kSmemBytes)");

// The shared memory of forward_kernel_sm90 (ForwardSm90Shape's layout): the Q, K and V tiles,
// their barriers, and the slots of work items.
template <int kDqk, int kDv>
struct ForwardSm90Buffers {
  using Shape = ForwardSm90Shape<kDqk, kDv>;
  static constexpr int kQStages = Shape::kQStages;
  static constexpr int kStages = Shape::kStages;

  __device__ __forceinline__ explicit ForwardSm90Buffers(unsigned char* smem_raw)
      : q_base((smem_address(smem_raw) + 1023u) & ~1023u),
        k_base(q_base + kQStages * Shape::kQBytes),
        v_base(k_base + kStages * Shape::kKBytes),
        barriers(q_base + Shape::kBarrierOffset),
        kv_barriers(barriers + 8u * 2 * kQStages),
        slots(reinterpret_cast<ForwardItem*>(smem_raw + (q_base + Shape::kItemOffset - smem_address(smem_raw)))) {}

  __device__ __forceinline__ uint32_t q_tile(int q_stage) const {
    return q_base + static_cast<uint32_t>(q_stage) * Shape::kQBytes;
  }
  __device__ __forceinline__ uint32_t q_full(int q_stage) const { return barriers + 8u * q_stage; }
  __device__ __forceinline__ uint32_t q_empty(int q_stage) const { return barriers + 8u * (kQStages + q_stage); }
  __device__ __forceinline__ uint32_t k_full(int stage) const { return kv_barriers + 8u * stage; }
  __device__ __forceinline__ uint32_t k_empty(int stage) const { return kv_barriers + 8u * (kStages + stage); }
  __device__ __forceinline__ uint32_t v_full(int stage) const { return kv_barriers + 8u * (2 * kStages + stage); }
  __device__ __forceinline__ uint32_t v_empty(int stage) const { return kv_barriers + 8u * (3 * kStages + stage); }

  // The buffers of use `uses` (counted on across items) and the phase parity its full
  // barrier completes: Q buffers by item, K/V stages by key tile; the item's slot.
  static __device__ __forceinline__ int q_stage(int uses) { return uses % kQStages; }
  static __device__ __forceinline__ uint32_t q_parity(int uses) { return (uses / kQStages) & 1; }
  static __device__ __forceinline__ int kv_stage(int uses) { return uses % kStages; }
  static __device__ __forceinline__ uint32_t kv_parity(int uses) { return (uses / kStages) & 1; }
  __device__ __forceinline__ ForwardItem& slot(int uses) const { return slots[uses % Shape::kSlots]; }

  // Thread 0, before the block's barrier.
  __device__ __forceinline__ void init_barriers() const {
#pragma unroll
    for (int q_stage = 0; q_stage < kQStages; ++q_stage) {
      mbarrier_init(q_full(q_stage), 1);
      mbarrier_init(q_empty(q_stage), 128 * Shape::kConsumers);
    }
#pragma unroll
    for (int stage = 0; stage < kStages; ++stage) {
      mbarrier_init(k_full(stage), 1);
      mbarrier_init(v_full(stage), 1);
      mbarrier_init(k_empty(stage), 128 * Shape::kConsumers);
      mbarrier_init(v_empty(stage), 128 * Shape::kConsumers);
    }
    mbarrier_init_fence();
  }

  uint32_t q_base;
  uint32_t k_base;
  uint32_t v_base;
  uint32_t barriers;
  uint32_t kv_barriers;
  ForwardItem* slots;
};

// The producer (one thread): each item's Q tile and its K/V tiles, and the next item's
// description (see above).
template <int kDqk, int kDv>
__device__ __forceinline__ void forward_sm90_produce(const ForwardParams& p, const ForwardTensorMaps& maps,
                                                     const ForwardSm90Buffers<kDqk, kDv>& b, int64_t items,
                                                     const Mask& mask) {
  using Shape = ForwardSm90Shape<kDqk, kDv>;
  constexpr int kM = Shape::kTileM;
  constexpr int kN = Shape::kTileN;
  prefetch_tensor_map(&maps.q.map);
  prefetch_tensor_map(&maps.k.map);
  prefetch_tensor_map(&maps.v.map);
  const auto describe = [&](int64_t item, ForwardItem& slot) {
    slot.valid = item < items;
    if (slot.valid) slot.work.assign_item<kM>(item, p.tile_start, p.num_segments, p.segments, p.q_heads, p.kv_heads);
  };
  describe(blockIdx.x, b.slots[0]);
  int kv_uses = 0;
  for (int q_uses = 0;; ++q_uses) {
    const int q_stage = b.q_stage(q_uses);
    // Both consumers are done with the Q of item q_uses - kQStages.
    mbarrier_wait(b.q_empty(q_stage), b.q_parity(q_uses) ^ 1);
    const ForwardItem& slot = b.slot(q_uses);
    if (!slot.valid) {
      mbarrier_arrive(b.q_full(q_stage));
      break;
    }
    const QueryTileWork work = slot.work;
    const VisibleKeyTiles<kN> key_tiles(work.seg, mask, work.m0, work.valid_q, kM);
    if (key_tiles.begin == key_tiles.end) {
      mbarrier_arrive(b.q_full(q_stage));
    } else {
      mbarrier_arrive_expect_tx(b.q_full(q_stage), Shape::kQBytes);
      tma_load_rows<kM, Shape::kQkBlocks>(b.q_tile(q_stage), maps.q, work.head, work.seg.q_row + work.m0,
                                          b.q_full(q_stage));
    }
    // The next item is described once this item's first K/V tiles are on their way (after
    // the first tile's loads, or at once when the item has none), so that its latency
    // (global loads) is neither in front of them nor at the end of a long item.
    const auto describe_next = [&] {
      describe(gridDim.x + static_cast<int64_t>(atomicAdd(p.work_counter, 1)), b.slot(q_uses + 1));
    };
    if (key_tiles.begin == key_tiles.end) describe_next();
    for (int n = key_tiles.begin; n < key_tiles.end; ++n, ++kv_uses) {
      const int stage = b.kv_stage(kv_uses);
      const uint32_t parity = b.kv_parity(kv_uses) ^ 1;
      const int row = work.seg.k_row + n * kN;
      mbarrier_wait(b.k_empty(stage), parity);
      mbarrier_arrive_expect_tx(b.k_full(stage), Shape::kKBytes);
      tma_load_rows<kN, Shape::kQkBlocks>(b.k_base + stage * Shape::kKBytes, maps.k, work.kv_head, row,
                                          b.k_full(stage));
      mbarrier_wait(b.v_empty(stage), parity);
      mbarrier_arrive_expect_tx(b.v_full(stage), Shape::kVBytes);
      tma_load_rows<kN, Shape::kVBlocks>(b.v_base + stage * Shape::kVBytes, maps.v, work.kv_head, row,
                                         b.v_full(stage));
      if (n == key_tiles.begin) describe_next();
    }
  }
}

// The consumer warpgroups: each item's products, then its out rows, lse and max_logit.
template <typename Storage, int kDqk, int kDv>
__device__ __forceinline__ void forward_sm90_consume(const ForwardParams& p, const ForwardStrides& strides,
                                                     const ForwardSm90Buffers<kDqk, kDv>& b, const Mask& mask,
                                                     int consumer) {
  using Shape = ForwardSm90Shape<kDqk, kDv>;
  constexpr int kM = Shape::kTileM;
  constexpr int kN = Shape::kTileN;
  constexpr int kVBlocks = Shape::kVBlocks;

  const int thread = static_cast<int>(threadIdx.x) % 128;
  const int lane = thread % 32;
  const int group_row = lane >> 2;
  const int pair_col = (lane & 3) * 2;
  const int warp_row0 = consumer * 64 + (thread / 32) * 16;  // this warp's first row of the tile
  const TensorCoreTurns<Shape::kConsumers> turns{consumer};
  turns.start();
  int kv_uses = 0;

  for (int q_uses = 0;; ++q_uses) {
    const int q_stage = b.q_stage(q_uses);
    mbarrier_wait(b.q_full(q_stage), b.q_parity(q_uses));
    if (!b.slot(q_uses).valid) break;
    const QueryTileWork work = b.slot(q_uses).work;
    // This warpgroup's 64 rows of the Q tile: the tile's column blocks stay kM rows apart.
    const uint32_t q_rows = b.q_tile(q_stage) + static_cast<uint32_t>(consumer * 64 * 128);
    const Segment& seg = work.seg;
    const int m0 = work.m0;
    const VisibleKeyTiles<kN> key_tiles(seg, mask, m0, work.valid_q, kM);
    const int n_begin = key_tiles.begin;
    const int n_end = key_tiles.end;

    float o[kDv / 8][4];
    float row_max[2] = {-INFINITY, -INFINITY};  // raw (unscaled) scores
    float row_sum[2] = {0.0f, 0.0f};            // this thread's part of the denominator
#pragma unroll
    for (int i = 0; i < kDv / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;

    if (n_begin < n_end) {
      float s[kN / 8][4];
      uint32_t pa[kN / 16][4];  // P of the previous key tile, the A operand of P V
      float correction[2];
      const auto mask_scores = [&](int n) {
        if (n < key_tiles.unmasked_begin || n >= key_tiles.unmasked_end) {
          mask_row_keys<kN>(seg, mask, m0 + warp_row0 + group_row, n * kN, pair_col,
                            [&](int nf, int e) { s[nf][e] = -INFINITY; });
        }
      };
      // K/V stage use u of this item's tile n: kv_uses + n - n_begin.
      const auto stage_of = [&](int n) { return b.kv_stage(kv_uses + n - n_begin); };
      const auto parity_of = [&](int n) { return b.kv_parity(kv_uses + n - n_begin); };

      mbarrier_wait(b.k_full(stage_of(n_begin)), parity_of(n_begin));
      turns.wait();
      wgmma_fence();
      wgmma_ss_k_major<Storage, kN, kM, kN, kDqk / 16>(s, q_rows, b.k_base + stage_of(n_begin) * Shape::kKBytes);
      wgmma_commit();
      turns.pass();
      wgmma_wait<0>();
      wgmma_fence_operands(flat(s));
      mbarrier_arrive(b.k_empty(stage_of(n_begin)));
      mask_scores(n_begin);
      online_softmax_scores<kN>(s, row_max, row_sum, p.scale_log2, correction);  // O is still 0
      accumulator_to_a_fragments<Storage, kN>(s, pa);

      for (int n = n_begin + 1; n < n_end; ++n) {
        const int stage = stage_of(n);
        const int previous = stage_of(n - 1);
        mbarrier_wait(b.k_full(stage), parity_of(n));
        mbarrier_wait(b.v_full(previous), parity_of(n - 1));
        turns.wait();
        wgmma_fence();
        wgmma_ss_k_major<Storage, kN, kM, kN, kDqk / 16>(s, q_rows, b.k_base + stage * Shape::kKBytes);
        wgmma_commit();
        wgmma_rs_mn_major<Storage, kDv, kN, kN / 16>(o, pa, b.v_base + previous * Shape::kVBytes);
        wgmma_commit();
        turns.pass();

        wgmma_wait<1>();  // S has landed; P V of the previous tile may still run
        wgmma_fence_operands(flat(s));
        mbarrier_arrive(b.k_empty(stage));
        mask_scores(n);
        const bool raised = online_softmax_scores<kN>(s, row_max, row_sum, p.scale_log2, correction);
        wgmma_wait<0>();
        wgmma_fence_operands(flat(o));
        mbarrier_arrive(b.v_empty(previous));
        if (raised) rescale_rows<kDv>(o, correction);
        accumulator_to_a_fragments<Storage, kN>(s, pa);
      }
      mbarrier_arrive(b.q_empty(q_stage));  // every S of this item has landed: its Q buffer is free

      const int stage = stage_of(n_end - 1);
      const uint32_t v_tile = b.v_base + stage * Shape::kVBytes;
      mbarrier_wait(b.v_full(stage), parity_of(n_end - 1));
      // Only a segment's last key tile reaches past its keys, and it is the last one visited.
      const int valid_keys = seg.k_len - (n_end - 1) * kN;
      if (valid_keys < kN) zero_tile_rows<kN, kVBlocks>(v_tile, valid_keys, thread, 1 + consumer);
      // The diagonal half tile: when this warpgroup's last valid row sees no key of the upper
      // half of the last key tile (a causal mask's diagonal tile, for the first 64 rows of a
      // 128-row tile; a warpgroup with no valid row sees none), its P there is 0 and its P V
      // runs over the lower half only (K = kN / 2). Each branch fences its own products: a
      // fence before the branch makes ptxas serialise every wgmma of the kernel (C7520).
      // (S stays whole: a shape chosen at run time for S serialises them too, C7511 / C7515.)
      const int first_row = m0 + consumer * 64;
      const int last_row = min(first_row + 63, m0 + work.valid_q - 1);
      const bool half = last_row < first_row || segment_visible_keys(seg, mask, last_row).end <=
                                                    static_cast<int64_t>(seg.k_pos) + (n_end - 1) * kN + kN / 2;
      turns.wait();
      if (half) {
        wgmma_fence();
        wgmma_rs_mn_major<Storage, kDv, kN, kN / 32>(o, leading<kN / 32>(pa), v_tile);
        wgmma_commit();
      } else {
        wgmma_fence();
        wgmma_rs_mn_major<Storage, kDv, kN, kN / 16>(o, pa, v_tile);
        wgmma_commit();
      }
      turns.pass();
      wgmma_wait<0>();
      wgmma_fence_operands(flat(o));
      mbarrier_arrive(b.v_empty(stage));
      kv_uses += n_end - n_begin;
    } else {
      mbarrier_arrive(b.q_empty(q_stage));  // no Q was loaded; the item's slot has been read
    }

    float thread_max = -INFINITY;
    store_forward_rows<Storage, kDv>(p, strides.out, seg, work.head, m0, warp_row0 + group_row, work.span_rows,
                                    pair_col, o, row_max, row_sum, thread_max);
    reduce_max_logit(p, work.head, thread_max);
  }
  if (consumer == 0) turns.wait();  // the last consumer's final hand-over: every arrive is matched
}

template <typename Storage, int kDqk, int kDv>
__global__ void __launch_bounds__(ForwardSm90Shape<kDqk, kDv>::kThreads, 1)
    forward_kernel_sm90(const ForwardParams p, const ForwardStrides strides,
                        const __grid_constant__ ForwardTensorMaps maps) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Shape = ForwardSm90Shape<kDqk, kDv>;
  static_assert(Shape::kSlots >= Shape::kQStages + 1, "a slot is rewritten only once its item has been read");

  const int64_t items = static_cast<int64_t>(__ldg(p.tile_start + p.num_segments)) * p.q_heads;
  if (blockIdx.x >= items) return;
  const Mask mask{p.window_left, p.window_right};

  extern __shared__ unsigned char smem_raw[];
  const ForwardSm90Buffers<kDqk, kDv> buffers(smem_raw);
  if (threadIdx.x == 0) buffers.init_barriers();
  __syncthreads();

  const int warpgroup = static_cast<int>(threadIdx.x) / 128;
  if (warpgroup == 0) {
    setmaxnreg_dec<Shape::kProducerRegisters>();
    if (threadIdx.x != 0) return;
    forward_sm90_produce(p, maps, buffers, items, mask);
    return;
  }
  setmaxnreg_inc<Shape::kConsumerRegisters>();
  forward_sm90_consume<Storage>(p, strides, buffers, mask, warpgroup - 1);
#endif
}

}  // namespace thdcp::cuda::detail
