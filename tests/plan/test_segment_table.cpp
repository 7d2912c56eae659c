// Segment tables allow exactly the (query, key) pairs of the global mask: for a single
// device, and for the union over the ranks of AllGather CP.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "support/random_batch.h"
#include "thdcp/plan/rank_split.h"
#include "thdcp/plan/segment_table.h"

namespace thdcp {
namespace {

// Every pair (global query row, global key row) the mask allows, brute force.
std::vector<int64_t> global_pairs(const LayoutView& layout, const Mask& mask) {
  const int64_t rows = layout.total_rows();
  std::vector<int64_t> pairs;
  for (int b = 0; b < layout.num_seqs; ++b) {
    const int64_t start = layout.padded_start(b);
    for (int64_t i = 0; i < layout.length(b); ++i) {
      for (int64_t j = 0; j < layout.length(b); ++j) {
        if (mask.allows(i, j)) pairs.push_back((start + i) * rows + start + j);
      }
    }
  }
  std::sort(pairs.begin(), pairs.end());
  return pairs;
}

// Pairs a table allows, with query rows mapped to global rows by `query_rows`.
void table_pairs_into(const SegmentTable& table, const std::vector<int32_t>& query_rows, int64_t rows,
                      std::vector<int64_t>& pairs) {
  for (const Segment& s : table.segments) {
    for (int64_t t = 0; t < s.q_len; ++t) {
      const PositionRange keys = segment_visible_keys(s, table.mask, t);
      const int64_t q_global = query_rows[static_cast<size_t>(s.q_row + t)];
      for (int64_t p = keys.begin; p < keys.end; ++p) pairs.push_back(q_global * rows + s.k_row + (p - s.k_pos));
    }
  }
}

std::vector<int64_t> test_lengths(Rng& rng, int cp) {
  std::vector<int64_t> lengths = test::random_lengths(rng, 6, 120);
  // 0, 1, a non-multiple of 2*cp, and a sequence long enough for windows wider than a chunk.
  lengths.push_back(0);
  lengths.push_back(1);
  lengths.push_back(2 * cp + 1);
  lengths.push_back(300);
  return lengths;
}

class SegmentTablePairs : public ::testing::TestWithParam<Mask> {};

TEST_P(SegmentTablePairs, SingleDeviceAndEveryCpSizeMatchTheMask) {
  const Mask mask = GetParam();
  Rng rng(static_cast<uint64_t>(mask.window_left * 7919 + mask.window_right + 17));
  for (int cp = 1; cp <= 8; ++cp) {
    for (CpLayout cp_layout : {CpLayout::kDualChunk, CpLayout::kContiguous}) {
      const std::vector<int64_t> lengths = test_lengths(rng, cp);
      const BatchLayout layout =
          cp_layout == CpLayout::kDualChunk ? make_layout(lengths, cp) : make_contiguous_layout(lengths, cp);
      const LayoutView view = layout.view();
      const int64_t rows = layout.total_rows();
      const std::vector<int64_t> expected = global_pairs(view, mask);

      std::vector<int32_t> identity(static_cast<size_t>(rows));
      for (int64_t i = 0; i < rows; ++i) identity[static_cast<size_t>(i)] = static_cast<int32_t>(i);
      std::vector<int64_t> single;
      const SegmentTable single_table = build_segment_table(view, mask);
      table_pairs_into(single_table, identity, rows, single);
      std::sort(single.begin(), single.end());
      EXPECT_EQ(single, expected) << "single device, " << test::mask_label(mask);
      EXPECT_EQ(table_pairs(single_table), static_cast<int64_t>(expected.size()));

      std::vector<int64_t> union_of_ranks;
      int64_t counted = 0;
      for (int rank = 0; rank < cp; ++rank) {
        const SegmentTable table = build_cp_segment_table(view, cp, rank, mask, cp_layout);
        EXPECT_EQ(table.q_rows, rows / cp);
        EXPECT_EQ(table.k_rows, rows);
        validate_segment_table(table);
        table_pairs_into(table, rank_row_map(view, cp, rank, cp_layout), rows, union_of_ranks);
        counted += table_pairs(table);
      }
      std::sort(union_of_ranks.begin(), union_of_ranks.end());
      // Equality of sorted lists also shows no pair is produced by two ranks.
      EXPECT_EQ(union_of_ranks, expected) << "cp " << cp << ", " << cp_layout_name(cp_layout) << ", "
                                          << test::mask_label(mask);
      EXPECT_EQ(counted, static_cast<int64_t>(expected.size()));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Masks, SegmentTablePairs, ::testing::ValuesIn(test::all_test_masks()),
                         [](const ::testing::TestParamInfo<Mask>& param_info) { return test::mask_label(param_info.param); });

// The pairs of a segment counted query row by query row: the reference for segment_pairs's
// closed form.
int64_t pairs_row_by_row(const Segment& s, const Mask& mask) {
  int64_t pairs = 0;
  for (int64_t t = 0; t < s.q_len; ++t) pairs += segment_visible_keys(s, mask, t).size();
  return pairs;
}

TEST(SegmentPairs, ClosedFormMatchesTheRowByRowCount) {
  Rng rng(28);
  std::vector<Mask> masks = test::all_test_masks();
  for (int32_t left : {-1, 0, 1, 2, 5}) {
    for (int32_t right : {-1, 0, 1, 3}) masks.push_back(Mask::window(left, right));
  }
  for (int i = 0; i < 200; ++i) {
    masks.push_back(Mask::window(static_cast<int32_t>(rng.uniform_int(-1, 90)),
                                 static_cast<int32_t>(rng.uniform_int(-1, 90))));
  }
  // The segments of real tables: single device and every rank of CP 1..8.
  for (const Mask& mask : masks) {
    const int cp = static_cast<int>(rng.uniform_int(1, 8));
    const BatchLayout layout = make_layout(test_lengths(rng, cp), cp);
    std::vector<SegmentTable> tables{build_segment_table(layout.view(), mask)};
    for (int rank = 0; rank < cp; ++rank) tables.push_back(build_cp_segment_table(layout.view(), cp, rank, mask));
    for (const SegmentTable& table : tables) {
      for (const Segment& s : table.segments) {
        ASSERT_EQ(segment_pairs(s, mask), pairs_row_by_row(s, mask))
            << test::mask_label(mask) << " q_pos=" << s.q_pos << " q_len=" << s.q_len << " k_pos=" << s.k_pos
            << " k_len=" << s.k_len;
      }
    }
  }
  // Any segment: queries before, inside, after or around the keys, empty either side.
  for (int i = 0; i < 200000; ++i) {
    Segment s{};
    s.q_pos = static_cast<int32_t>(rng.uniform_int(0, 120));
    s.q_len = static_cast<int32_t>(rng.uniform_int(0, 60));
    s.k_pos = static_cast<int32_t>(rng.uniform_int(0, 120));
    s.k_len = static_cast<int32_t>(rng.uniform_int(0, 60));
    const Mask& mask = masks[static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(masks.size()) - 1))];
    ASSERT_EQ(segment_pairs(s, mask), pairs_row_by_row(s, mask))
        << test::mask_label(mask) << " q_pos=" << s.q_pos << " q_len=" << s.q_len << " k_pos=" << s.k_pos
        << " k_len=" << s.k_len;
  }
}

// The longest segment a layout can hold (int32 offsets), in closed form with no overflow:
// what bench/peer_attention.py's allowed_pairs and tests/cli/check_plan.py count.
TEST(SegmentPairs, LongestSegmentMatchesTheTextbookCounts) {
  const int64_t n = std::numeric_limits<int32_t>::max();
  const Segment s = single_device_segment(0, n, n);
  EXPECT_EQ(segment_pairs(s, Mask::full()), n * n);
  EXPECT_EQ(segment_pairs(s, Mask::causal()), n * (n + 1) / 2);
  for (const int64_t w : {int64_t{0}, int64_t{1}, int64_t{4096}, n - 1, n}) {
    const int64_t expected = w >= n ? n * (n + 1) / 2 : w * (w + 1) / 2 + (n - w) * (w + 1);
    EXPECT_EQ(segment_pairs(s, Mask::window(static_cast<int32_t>(w), 0)), expected) << "window " << w;
  }
  // (w, w): every query sees 2w + 1 keys but those cut off by either end of the sequence.
  EXPECT_EQ(segment_pairs(s, Mask::window(16, 16)), n * 33 - 2 * (16 * 17 / 2));
}

TEST(SegmentTable, CpQueryBlocksTileTheLocalTensor) {
  // With q_span, the segments of a rank cover every local row exactly once, so a kernel
  // that writes its segments writes every row (padding included), under either layout.
  const BatchLayout dual = make_layout({13, 0, 5, 64}, 4, Capacity{6, 160});
  const BatchLayout contiguous = make_contiguous_layout({13, 0, 5, 1, 64, 2}, 4);
  for (const auto& [layout, cp_layout] : {std::make_pair(&dual, CpLayout::kDualChunk),
                                          std::make_pair(&contiguous, CpLayout::kContiguous)}) {
    for (int rank = 0; rank < 4; ++rank) {
      const SegmentTable table = build_cp_segment_table(layout->view(), 4, rank, Mask::causal(), cp_layout);
      std::vector<int> covered(static_cast<size_t>(table.q_rows), 0);
      for (const Segment& s : table.segments) {
        for (int64_t r = s.q_row; r < s.q_row + s.q_span; ++r) ++covered[static_cast<size_t>(r)];
      }
      for (int c : covered) EXPECT_EQ(c, 1) << cp_layout_name(cp_layout) << " rank " << rank;
    }
  }
}

// A contiguous split cuts a document across ranks: the second rank's piece starts at its
// position within the document, and a window reaches back into the first rank's rows.
TEST(SegmentTable, ContiguousPiecesKeepTheirPositions) {
  const BatchLayout layout = make_contiguous_layout({10, 7}, 2);  // 17 rows padded to 18
  ASSERT_EQ(layout.cu_seqlens_padded, (std::vector<int32_t>{0, 10, 18}));
  const SegmentTable table = build_cp_segment_table(layout.view(), 2, 1, Mask::window(4, 0), CpLayout::kContiguous);
  ASSERT_EQ(table.segments.size(), 2u);
  const Segment& tail = table.segments[0];  // rows 9..9 of document 0
  EXPECT_EQ(tail.q_row, 0);
  EXPECT_EQ(tail.q_pos, 9);
  EXPECT_EQ(tail.q_len, 1);
  EXPECT_EQ(tail.k_pos, 5);
  EXPECT_EQ(tail.k_len, 5);
  const Segment& second = table.segments[1];  // document 1: 7 valid rows and 1 of padding
  EXPECT_EQ(second.q_row, 1);
  EXPECT_EQ(second.q_pos, 0);
  EXPECT_EQ(second.q_len, 7);
  EXPECT_EQ(second.q_span, 8);
  EXPECT_EQ(second.k_row, 10);
}

TEST(SegmentTable, KeyRangeIsRestrictedToTheWindow) {
  // A 256-token sequence, cp 2: chunk 3 of rank 0 starts at 192; window (16, 0) reaches
  // back to 176, and causal keys stop at the chunk's end.
  const BatchLayout layout = make_layout({256}, 2);
  const SegmentTable table = build_cp_segment_table(layout.view(), 2, 0, Mask::window(16, 0));
  ASSERT_EQ(table.segments.size(), 2u);
  const Segment& late = table.segments[1];
  EXPECT_EQ(late.q_pos, 192);
  EXPECT_EQ(late.k_pos, 176);
  EXPECT_EQ(late.k_len, 256 - 176);
  EXPECT_EQ(late.k_row, 176);
}

// The CUDA backward's dK/dV blocks visit the query tiles key_tile_query_tiles gives, and the
// one-pass Hopper backward orders the dQ additions into a query tile by key tile, starting at
// first_key_tile_reaching (a wrong start would make a block wait for ever). For the tables of
// every CP size and mask, both key-tile sizes: the range holds every query tile with a pair
// the mask allows, the key tiles that reach a query tile are consecutive and start where
// first_key_tile_reaching says, and a query tile with a valid query that sees a key is reached.
TEST(SegmentTable, KeyTilesReachConsecutiveQueryTilesFromTheFirstOne) {
  constexpr int64_t kQueryTile = 64;
  for (const Mask& mask : test::all_test_masks()) {
    Rng rng(static_cast<uint64_t>(mask.window_left * 131 + mask.window_right + 5));
    for (int cp : {1, 2, 3, 4, 8}) {
      std::vector<int64_t> lengths = test_lengths(rng, cp);
      lengths.push_back(700);
      const BatchLayout layout = make_layout(lengths, cp);
      for (int rank = 0; rank < cp; ++rank) {
        const SegmentTable table =
            cp == 1 ? build_segment_table(layout.view(), mask) : build_cp_segment_table(layout.view(), cp, rank, mask);
        for (const Segment& s : table.segments) {
          for (int64_t key_rows : {int64_t{64}, int64_t{128}}) {
            SCOPED_TRACE(test::mask_label(mask) + ", cp " + std::to_string(cp) + ", rank " + std::to_string(rank) +
                         ", q_pos " + std::to_string(s.q_pos) + ", k_pos " + std::to_string(s.k_pos) +
                         ", key tiles of " + std::to_string(key_rows));
            const int64_t k_len = s.k_len;
            const int64_t key_tiles = (k_len + key_rows - 1) / key_rows;
            const int64_t query_tiles = (s.q_len + kQueryTile - 1) / kQueryTile;
            std::vector<PositionRange> reach;
            for (int64_t n = 0; n < key_tiles; ++n) {
              const int64_t n0 = n * key_rows;
              reach.push_back(key_tile_query_tiles(s, mask, n0, std::min(key_rows, k_len - n0), kQueryTile));
              // A bound: every query tile with an allowed pair is in the range.
              for (int64_t i = 0; i < s.q_len; ++i) {
                const PositionRange keys = segment_visible_keys(s, mask, i);
                const bool sees = keys.begin < s.k_pos + n0 + std::min(key_rows, k_len - n0) &&
                                  keys.end > s.k_pos + n0 && keys.size() > 0;
                if (sees) {
                  ASSERT_GE(i / kQueryTile, reach.back().begin) << "key tile " << n << ", query " << i;
                  ASSERT_LT(i / kQueryTile, reach.back().end) << "key tile " << n << ", query " << i;
                }
              }
            }
            for (int64_t m = 0; m < query_tiles; ++m) {
              std::vector<int64_t> reaching;
              for (int64_t n = 0; n < key_tiles; ++n) {
                if (m >= reach[static_cast<size_t>(n)].begin && m < reach[static_cast<size_t>(n)].end) {
                  reaching.push_back(n);
                }
              }
              bool seen = false;
              for (int64_t i = m * kQueryTile; i < std::min<int64_t>(s.q_len, (m + 1) * kQueryTile); ++i) {
                seen = seen || segment_visible_keys(s, mask, i).size() > 0;
              }
              if (seen) {
                ASSERT_FALSE(reaching.empty()) << "query tile " << m;
              }
              if (reaching.empty()) continue;
              EXPECT_EQ(reaching.back() - reaching.front() + 1, static_cast<int64_t>(reaching.size()))
                  << "query tile " << m << ": the key tiles that reach it are not consecutive";
              EXPECT_EQ(reaching.front(), first_key_tile_reaching(s, mask, m, kQueryTile, key_rows))
                  << "query tile " << m;
            }
          }
        }
      }
    }
  }
}

TEST(SegmentTable, ValidationRejectsBrokenTables) {
  SegmentTable table;
  table.q_rows = 8;
  table.k_rows = 8;
  table.segments = {single_device_segment(0, 4, 4), single_device_segment(2, 4, 4)};
  EXPECT_THDCP_ERROR(validate_segment_table(table), "overlap");
  table.segments = {single_device_segment(0, 4, 4), single_device_segment(4, 6, 4)};
  EXPECT_THDCP_ERROR(validate_segment_table(table), "do not fit a Q tensor of 8 rows");
  table.segments = {single_device_segment(0, 4, 5)};
  EXPECT_THDCP_ERROR(validate_segment_table(table), "q_len <= q_span");
  table.segments = {single_device_segment(0, 4, 4)};
  table.mask = Mask::window(-2, 0);
  EXPECT_THDCP_ERROR(validate_segment_table(table), "window_left=-2");
}

}  // namespace
}  // namespace thdcp
