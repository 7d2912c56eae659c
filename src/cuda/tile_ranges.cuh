// Which tiles a block works on: the block -> (tile, head) order, the key tiles a query tile
// sees and the query tiles that see a key tile, and the per-row visible ranges, all from
// the segment table on the device (DESIGN.md section 4) with the index math of
// thdcp/segment.h. Shared by the forward and backward kernels of both families.
#pragma once

#include <cstdint>

#include "tensor_core.cuh"
#include "thdcp/plan/mask.h"
#include "thdcp/plan/segment.h"

namespace thdcp::cuda::detail {

// Clamped to [0, kLimit] relative to `base`: the range [begin, end) of a visible-key or
// visible-query interval, so that an element at relative column c is visible iff lo <= c < hi.
template <int kLimit>
__device__ __forceinline__ void relative_range(int64_t begin, int64_t end, int64_t base, int& lo, int& hi) {
  lo = static_cast<int>(min(max(begin - base, int64_t{0}), int64_t{kLimit}));
  hi = static_cast<int>(min(max(end - base, int64_t{0}), int64_t{kLimit}));
}

// The (tile, head) of this block, for tiles counted by the prefix sums tile_start[0..
// num_segments] and `heads` heads. Blocks in launch order, heads fastest (the heads of one
// tile run side by side; those sharing a K/V head read the same rows through L2), tiles last
// first or first to last (last_first): under a causal mask a segment's last query tiles see
// the most keys, and its first key tiles are seen by the most queries, so the longest blocks
// start early rather than end the grid. False for the blocks past the real work (grids are
// sized by capacity).
// item_tile_and_head: the same for work item `item` of a persistent kernel, whose blocks
// take the items in that order.
__device__ __forceinline__ bool item_tile_and_head(int64_t item, const int* tile_start, int num_segments, int heads,
                                                   bool last_first, int& tile, int& head) {
  const int total_tiles = __ldg(tile_start + num_segments);
  const int64_t tile_rank = item / heads;
  if (tile_rank >= total_tiles) return false;
  tile = last_first ? total_tiles - 1 - static_cast<int>(tile_rank) : static_cast<int>(tile_rank);
  head = static_cast<int>(item - tile_rank * heads);
  return true;
}

__device__ __forceinline__ bool block_tile_and_head(const int* tile_start, int num_segments, int heads,
                                                    bool last_first, int& tile, int& head) {
  const int64_t block = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
  return item_tile_and_head(block, tile_start, num_segments, heads, last_first, tile, head);
}

// The query tile of kM rows and the query head of a forward or dQ block (block_tile_and_head,
// tiles last first) or of a persistent kernel's work item, with its segment, first row m0 in
// the segment, rows of the tile inside the segment's span (span_rows; the rest belong to the
// next segment) and valid rows (valid_q; the rest of the span is padding). False for the
// blocks (items) past the real work.
struct QueryTileWork {
  Segment seg;
  int head = 0;
  int kv_head = 0;
  int m0 = 0;
  int span_rows = 0;
  int valid_q = 0;

  template <int kM>
  __device__ __forceinline__ bool assign(const int* tile_start, int num_segments, const Segment* segments, int q_heads,
                                         int kv_heads) {
    const int64_t block = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
    return assign_item<kM>(block, tile_start, num_segments, segments, q_heads, kv_heads);
  }

  // The same for work item `item` (item_tile_and_head).
  template <int kM>
  __device__ __forceinline__ bool assign_item(int64_t item, const int* tile_start, int num_segments,
                                              const Segment* segments, int q_heads, int kv_heads) {
    int tile = 0;
    if (!item_tile_and_head(item, tile_start, num_segments, q_heads, true, tile, head)) return false;
    const int segment_index = find_segment(tile_start, num_segments, tile);
    seg = segments[segment_index];
    m0 = (tile - __ldg(tile_start + segment_index)) * kM;
    span_rows = min(kM, seg.q_span - m0);
    valid_q = max(0, min(kM, seg.q_len - m0));
    kv_head = head / (q_heads / kv_heads);
    return true;
  }
};

// The key tiles of kN keys that the valid query rows [m0, m0 + valid_q) of a segment see,
// [begin, end), and those inside it that need no per-element mask, [unmasked_begin,
// unmasked_end): every row of the tile (of tile_rows rows) is a valid query that sees every
// key of the tile. The latter is empty unless all tile_rows rows are valid.
template <int kN>
struct VisibleKeyTiles {
  int begin = 0;
  int end = 0;
  int unmasked_begin = 0;
  int unmasked_end = 0;

  __device__ VisibleKeyTiles(const Segment& seg, const Mask& mask, int m0, int valid_q, int tile_rows) {
    if (valid_q == 0 || seg.k_len == 0) return;
    const PositionRange first = segment_visible_keys(seg, mask, m0);
    const PositionRange last = segment_visible_keys(seg, mask, m0 + valid_q - 1);
    const int64_t key_begin = first.begin - seg.k_pos;
    const int64_t key_end = last.end - seg.k_pos;
    if (key_end > key_begin) {
      begin = static_cast<int>(key_begin / kN);
      end = static_cast<int>((key_end + kN - 1) / kN);
    }
    const int64_t full_begin = last.begin - seg.k_pos;
    const int64_t full_end = first.end - seg.k_pos;
    if (valid_q == tile_rows && full_end - full_begin >= kN) {
      unmasked_begin = static_cast<int>((full_begin + kN - 1) / kN);
      unmasked_end = static_cast<int>(full_end / kN);
    }
  }
};

// Masks the scores of a warp's 16 query rows x kN keys in the m16n8 accumulator layout: this
// thread holds rows q_index and q_index + 8 of the segment and columns 8 nf + pair_col +
// {0, 1} from key index key0. Per row the visible keys form one range
// (segment_visible_keys); relative to this thread's first column and clamped to [0, kN],
// each element needs two compares. masked(nf, e) is called for every element (fragment nf,
// value e) the mask hides; rows past q_len hide all.
template <int kN, typename Masked>
__device__ __forceinline__ void mask_row_keys(const Segment& seg, const Mask& mask, int q_index, int key0,
                                              int pair_col, Masked&& masked) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    int lo = 0;
    int hi = 0;
    if (q_index + half * 8 < seg.q_len) {
      const PositionRange r = segment_visible_keys(seg, mask, q_index + half * 8);
      relative_range<kN>(r.begin, r.end, static_cast<int64_t>(seg.k_pos) + key0 + pair_col, lo, hi);
    }
#pragma unroll
    for (int nf = 0; nf < kN / 8; ++nf) {
#pragma unroll
      for (int e = 2 * half; e < 2 * half + 2; ++e) {
        const int c = nf * 8 + (e & 1);
        if (c < lo || c >= hi) masked(nf, e);
      }
    }
  }
}

// The query tiles (of tile_rows rows) [begin, begin + count) that can see a key of
// [n0, n0 + valid_k) of a segment (key_tile_query_tiles, thdcp/plan/segment.h).
struct DkvQueryTiles {
  int begin = 0;
  int count = 0;

  __device__ DkvQueryTiles(const Segment& seg, const Mask& mask, int n0, int valid_k, int tile_rows) {
    const PositionRange tiles = key_tile_query_tiles(seg, mask, n0, valid_k, tile_rows);
    begin = static_cast<int>(tiles.begin);
    count = static_cast<int>(tiles.end - tiles.begin);
  }
};

// The key tile of kN rows and the KV head of a dK/dV block (block_tile_and_head, tiles first
// to last), with its segment (and its index), the tile's index n_tile among the segment's
// key tiles, its first row n0 = n_tile kN in the segment, its valid rows, and the query tiles
// of kM rows that can see it, [m_begin, m_begin + m_count) (DkvQueryTiles). False for the
// blocks past the real work.
struct KeyTileWork {
  Segment seg;
  int segment_index = 0;
  int kv_head = 0;
  int n_tile = 0;
  int n0 = 0;
  int valid_k = 0;
  int m_begin = 0;
  int m_count = 0;

  template <int kN, int kM>
  __device__ __forceinline__ bool assign(const int* tile_start, int num_segments, const Segment* segments,
                                         int kv_heads, const Mask& mask) {
    int tile = 0;
    if (!block_tile_and_head(tile_start, num_segments, kv_heads, false, tile, kv_head)) return false;
    segment_index = find_segment(tile_start, num_segments, tile);
    seg = segments[segment_index];
    n_tile = tile - __ldg(tile_start + segment_index);
    n0 = n_tile * kN;
    valid_k = min(kN, seg.k_len - n0);
    const DkvQueryTiles query_tiles(seg, mask, n0, valid_k, kM);
    m_begin = query_tiles.begin;
    m_count = query_tiles.count;
    return true;
  }
};

// Whether every (query, key) pair of query rows [m0, m0 + tile_rows) and key rows
// [n0, n0 + key_rows) is a valid pair the mask allows (no per-element mask needed).
__device__ __forceinline__ bool dkv_step_unmasked(const Segment& seg, const Mask& mask, int n0, int valid_k,
                                                  int key_rows, int m0, int tile_rows) {
  bool unmasked = valid_k == key_rows && m0 + tile_rows <= seg.q_len;
  const int64_t first_query = static_cast<int64_t>(seg.q_pos) + m0;
  const int64_t first_key = static_cast<int64_t>(seg.k_pos) + n0;
  if (mask.window_left >= 0) unmasked = unmasked && first_key >= first_query + tile_rows - 1 - mask.window_left;
  if (mask.window_right >= 0) unmasked = unmasked && first_key + key_rows - 1 <= first_query + mask.window_right;
  return unmasked;
}

// The queries that see key `key_index` of a segment form one range; relative to query index
// `query_base` and clamped to [0, kLimit]: [lo, hi). Empty for key rows past k_len.
template <int kLimit>
__device__ __forceinline__ void key_visible_queries(const Segment& seg, const Mask& mask, int key_index,
                                                    int query_base, int& lo, int& hi) {
  lo = 0;
  hi = 0;
  if (key_index >= seg.k_len) return;
  const int64_t key_pos = static_cast<int64_t>(seg.k_pos) + key_index;
  int64_t begin = seg.q_pos;
  int64_t end = static_cast<int64_t>(seg.q_pos) + seg.q_len;
  if (mask.window_right >= 0) begin = max(begin, key_pos - mask.window_right);
  if (mask.window_left >= 0) end = min(end, key_pos + mask.window_left + 1);
  relative_range<kLimit>(begin, end, static_cast<int64_t>(seg.q_pos) + query_base, lo, hi);
}

}  // namespace thdcp::cuda::detail
