// Attention masks on absolute positions (DESIGN.md section 2).
//
// A query at position i and a key at position j of the same sequence see each other iff
//   (window_left  < 0 or j >= i - window_left) and
//   (window_right < 0 or j <= i + window_right).
// Causal is window_right = 0. Negative means unbounded. There is no top-left/bottom-right
// alignment anywhere: positions count from the first token of the sequence.
#pragma once

#include <cstdint>

#include "thdcp/core/host_device.h"

namespace thdcp {

struct Mask {
  int32_t window_left = -1;   // keys at most this many positions before the query; <0: any
  int32_t window_right = -1;  // keys at most this many positions after the query; <0: any

  THDCP_HD static constexpr Mask full() { return Mask{-1, -1}; }
  THDCP_HD static constexpr Mask causal() { return Mask{-1, 0}; }
  THDCP_HD static constexpr Mask window(int32_t left, int32_t right) { return Mask{left, right}; }

  THDCP_HD bool allows(int64_t query_pos, int64_t key_pos) const {
    return (window_left < 0 || key_pos >= query_pos - window_left) &&
           (window_right < 0 || key_pos <= query_pos + window_right);
  }
};

// Throws thdcp::Error naming the field unless each window is >= 0 or -1 (unbounded): every
// other negative value is refused rather than guessed at. Host only; every table builder and
// attention call checks its mask with it.
void check_mask(const Mask& mask);

// Half-open range [begin, end) of key positions.
struct PositionRange {
  int64_t begin;
  int64_t end;
  THDCP_HD int64_t size() const { return end > begin ? end - begin : 0; }
};

// Keys a query at `query_pos` sees among the key positions [key_begin, key_end). The
// mask is an interval in j, so the visible keys are one contiguous range.
THDCP_HD PositionRange visible_keys(const Mask& mask, int64_t query_pos, int64_t key_begin,
                                    int64_t key_end) {
  int64_t begin = key_begin;
  int64_t end = key_end;
  if (mask.window_left >= 0 && query_pos - mask.window_left > begin) {
    begin = query_pos - mask.window_left;
  }
  if (mask.window_right >= 0 && query_pos + mask.window_right + 1 < end) {
    end = query_pos + mask.window_right + 1;
  }
  return PositionRange{begin, end};
}

}  // namespace thdcp
