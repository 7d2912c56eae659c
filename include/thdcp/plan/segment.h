// One entry of a segment table (DESIGN.md section 4) and the formulas that fill it.
//
// A segment is a block of query rows of one sequence attending to a block of key rows of
// the same sequence. The attention kernels (CPU and CUDA) only ever see segments, so the
// single-device and the context-parallel calls are the same launch with different tables.
#pragma once

#include <cstdint>

#include "thdcp/plan/dual_chunk.h"
#include "thdcp/core/host_device.h"
#include "thdcp/plan/mask.h"

namespace thdcp {

struct Segment {
  int32_t q_row;   // first query row of the block in the Q/O tensors
  int32_t q_len;   // valid query rows
  int32_t q_pos;   // position within its sequence of the first query row
  int32_t q_span;  // rows the block occupies in memory (>= q_len); the rest is padding,
                   // written as 0
  int32_t k_row;   // first key row in the K/V tensors
  int32_t k_len;   // key rows the queries may reach
  int32_t k_pos;   // position within its sequence of the first key row
  int32_t reserved = 0;
};

// Single device: the whole sequence attends to itself.
THDCP_HD Segment single_device_segment(int64_t padded_start, int64_t padded_len, int64_t length) {
  Segment s;
  s.q_row = static_cast<int32_t>(padded_start);
  s.q_len = static_cast<int32_t>(length);
  s.q_pos = 0;
  s.q_span = static_cast<int32_t>(padded_len);
  s.k_row = static_cast<int32_t>(padded_start);
  s.k_len = static_cast<int32_t>(length);
  s.k_pos = 0;
  s.reserved = 0;
  return s;
}

// Keys (as positions, [begin, end)) that a block of q_len queries from position q_pos of a
// sequence of `length` valid tokens may reach under the mask; empty when q_len is 0.
THDCP_HD PositionRange reachable_keys(int64_t q_pos, int64_t q_len, int64_t length, const Mask& mask) {
  if (q_len == 0) return PositionRange{0, 0};
  int64_t k_pos = 0;
  int64_t k_end = length;
  if (mask.window_left >= 0 && q_pos - mask.window_left > 0) k_pos = q_pos - mask.window_left;
  if (mask.window_right >= 0 && q_pos + q_len + mask.window_right < length) k_end = q_pos + q_len + mask.window_right;
  return PositionRange{k_pos, k_end};
}

// A segment of q_len valid rows (q_span in memory) at q_row, from position q_pos of a
// sequence, whose keys are rows of K/V in sequence order (the global padded layout),
// restricted to the positions the mask can reach from it. The restriction only saves work:
// the mask is still applied inside the kernels.
THDCP_HD Segment gathered_keys_segment(int64_t q_row, int64_t q_len, int64_t q_pos, int64_t q_span,
                                       int64_t padded_start, int64_t length, const Mask& mask) {
  const PositionRange keys = reachable_keys(q_pos, q_len, length, mask);
  Segment s;
  s.q_row = static_cast<int32_t>(q_row);
  s.q_len = static_cast<int32_t>(q_len);
  s.q_pos = static_cast<int32_t>(q_pos);
  s.q_span = static_cast<int32_t>(q_span);
  s.k_row = static_cast<int32_t>(padded_start + keys.begin);
  s.k_len = static_cast<int32_t>(keys.size());
  s.k_pos = static_cast<int32_t>(keys.begin);
  s.reserved = 0;
  return s;
}

// AllGather CP on `rank`, dual-chunk layout: the segment of `slot` (0 or 1) of a sequence.
// Queries are the rank's local rows.
THDCP_HD Segment cp_segment(int64_t padded_start, int64_t padded_len, int64_t length, int cp,
                            int rank, int slot, const Mask& mask) {
  const int64_t chunk_rows = dual_chunk_rows(padded_len, cp);
  const int chunk = dual_chunk_index(cp, rank, slot);
  return gathered_keys_segment(padded_start / cp + slot * chunk_rows, dual_chunk_valid_rows(length, chunk_rows, chunk),
                               static_cast<int64_t>(chunk) * chunk_rows, chunk_rows, padded_start, length, mask);
}

// AllGather CP on a rank whose local rows are the global rows [rank_begin, rank_end)
// (contiguous layout, contiguous.h): the segment of the sequence's rows on that rank. A
// sequence with no row there gets an empty segment (q_span 0) at the nearer end of the
// rank's rows, so that query blocks stay ordered.
THDCP_HD Segment contiguous_segment(int64_t padded_start, int64_t padded_len, int64_t length, int64_t rank_begin,
                                    int64_t rank_end, const Mask& mask) {
  const int64_t first = padded_start > rank_begin ? (padded_start < rank_end ? padded_start : rank_end) : rank_begin;
  const int64_t end = padded_start + padded_len < rank_end ? padded_start + padded_len : rank_end;
  const int64_t span = end > first ? end - first : 0;
  const int64_t q_pos = span > 0 ? first - padded_start : 0;
  const int64_t valid = length - q_pos;  // the rank's rows are valid up to the sequence's length
  const int64_t q_len = valid < 0 ? 0 : (valid > span ? span : valid);
  return gathered_keys_segment(first - rank_begin, q_len, q_pos, span, padded_start, length, mask);
}

// Keys (as positions) that query row `q_index` (0-based within the segment) sees.
THDCP_HD PositionRange segment_visible_keys(const Segment& s, const Mask& mask, int64_t q_index) {
  return visible_keys(mask, s.q_pos + q_index, s.k_pos, static_cast<int64_t>(s.k_pos) + s.k_len);
}

// The query tiles (of q_tile_rows rows, counted from the segment's first query row) that a
// tile of valid_k keys from key index n0 of the segment can reach under the mask, [begin,
// end): i - window_right <= j <= i + window_left for some query i and key j of the two
// tiles, with i a valid query. Only a bound (the mask is applied per element): the dK/dV
// blocks of the CUDA backward visit these query tiles.
THDCP_HD PositionRange key_tile_query_tiles(const Segment& s, const Mask& mask, int64_t n0, int64_t valid_k,
                                            int64_t q_tile_rows) {
  int64_t q_begin = 0;
  int64_t q_end = s.q_len;
  const int64_t first_key = static_cast<int64_t>(s.k_pos) + n0;
  const int64_t last_key = first_key + valid_k - 1;
  if (mask.window_right >= 0) q_begin = q_begin > first_key - mask.window_right - s.q_pos
                                            ? q_begin
                                            : first_key - mask.window_right - s.q_pos;
  if (mask.window_left >= 0) q_end = q_end < last_key + mask.window_left + 1 - s.q_pos
                                         ? q_end
                                         : last_key + mask.window_left + 1 - s.q_pos;
  const int64_t begin = q_begin / q_tile_rows;
  return {begin, q_end > q_begin ? (q_end + q_tile_rows - 1) / q_tile_rows : begin};
}

// The first key tile (of key_rows keys) of a segment whose key_tile_query_tiles contains
// query tile m_tile: the key tiles that reach a query tile are consecutive, from this one on
// (tests/plan/test_segment_table.cpp checks both). Without a left window, tile 0; with one,
// the first tile whose last key lies within window_left of the query tile's first row.
THDCP_HD int64_t first_key_tile_reaching(const Segment& s, const Mask& mask, int64_t m_tile, int64_t q_tile_rows,
                                         int64_t key_rows) {
  if (mask.window_left < 0) return 0;
  const int64_t x = m_tile * q_tile_rows + s.q_pos - s.k_pos - mask.window_left;
  return x <= 0 ? 0 : x / key_rows;
}

namespace detail {

// The sum over i in [lo, hi) of max(0, c + slope * i), slope -1, 0 or 1: the positive part of
// one arithmetic run. Callers keep each term at most a segment's k_len (< 2^31) and the run
// at most its q_len, so no product below overflows.
THDCP_HD int64_t positive_run_sum(int64_t lo, int64_t hi, int64_t c, int slope) {
  if (slope > 0 && lo < 1 - c) lo = 1 - c;  // c + i > 0 from i = 1 - c on
  if (slope < 0 && hi > c) hi = c;          // c - i > 0 up to i = c - 1
  if (hi <= lo) return 0;
  const int64_t n = hi - lo;
  if (slope == 0) return c > 0 ? n * c : 0;
  // (first + last) is even when n is odd: halve whichever factor is even.
  const int64_t ends = 2 * c + slope * (lo + hi - 1);
  return n % 2 == 0 ? n / 2 * ends : ends / 2 * n;
}

THDCP_HD int64_t clamp_to(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : x > hi ? hi : x; }

}  // namespace detail

// Number of (query, key) pairs the mask allows within a segment: the sizes of
// segment_visible_keys summed over its query rows, in closed form (O(1), not O(q_len)). The
// query at position i sees [max(k_begin, i - window_left), min(k_end, i + window_right + 1)):
// the end moves with i until `right_edge`, from where it is k_end, and the start is k_begin
// until `left_edge`, from where it moves with i. Between the edges the count is linear in i,
// so the rows form at most three arithmetic runs. The planner counts every rank of every
// batch with it: a document of 2^31 tokens costs no more than a short one.
THDCP_HD int64_t segment_pairs(const Segment& s, const Mask& mask) {
  const int64_t first = s.q_pos, end = first + s.q_len;
  const int64_t k_begin = s.k_pos, k_end = k_begin + s.k_len;
  // Queries before right_edge see up to i + window_right + 1; from it on, up to k_end.
  const int64_t right_edge =
      mask.window_right >= 0 ? detail::clamp_to(k_end - mask.window_right - 1, first, end) : first;
  // Queries before left_edge see from k_begin; from it on, from i - window_left.
  const int64_t left_edge =
      mask.window_left >= 0 ? detail::clamp_to(k_begin + mask.window_left + 1, first, end) : end;
  const int64_t cuts[4] = {first, right_edge < left_edge ? right_edge : left_edge,
                           right_edge < left_edge ? left_edge : right_edge, end};
  int64_t pairs = 0;
  for (int run = 0; run < 3; ++run) {
    const int64_t lo = cuts[run], hi = cuts[run + 1];
    if (lo >= hi) continue;
    const bool end_grows = lo < right_edge;   // the run's end is i + window_right + 1
    const bool begin_grows = lo >= left_edge;  // the run's start is i - window_left
    const int64_t c = (end_grows ? int64_t{mask.window_right} + 1 : k_end) -
                      (begin_grows ? -int64_t{mask.window_left} : k_begin);
    pairs += detail::positive_run_sum(lo, hi, c, (end_grows ? 1 : 0) - (begin_grows ? 1 : 0));
  }
  return pairs;
}

}  // namespace thdcp
