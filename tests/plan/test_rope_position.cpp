// RoPE positions of local rows (thdcp/plan/rope.h) against hand-computed tables for
// cp = 1, 2, 4 with placeholders, padding and start offsets; their agreement with the rank
// split; the frequencies; and the config checks.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "support/expect_error.h"
#include "thdcp/plan/layout.h"
#include "thdcp/plan/rank_split.h"
#include "thdcp/plan/rope.h"
#include "thdcp/testing/workload.h"

namespace thdcp {
namespace {

std::vector<int64_t> positions_of(const BatchLayout& layout, int cp, int rank, const int32_t* offsets = nullptr,
                                  CpLayout cp_layout = CpLayout::kDualChunk) {
  std::vector<int64_t> positions;
  for (int64_t row = 0; row < layout.total_rows() / cp; ++row) {
    positions.push_back(rope_position(layout.cu_seqlens.data(), layout.cu_seqlens_padded.data(), layout.num_seqs(),
                                      cp, rank, row, offsets, cp_layout));
  }
  return positions;
}

TEST(RopePosition, SingleDeviceWithEmptySequenceAndSlack) {
  // Lengths 3, 0, 5 padded to even lengths 4, 0, 6; capacity (5, 16): sequences 3 and 4 are
  // placeholders, 4 absorbing the 6 slack rows.
  const BatchLayout layout = make_layout({3, 0, 5}, 1, Capacity{5, 16});
  ASSERT_EQ(layout.cu_seqlens_padded, (std::vector<int32_t>{0, 4, 4, 10, 10, 16}));
  EXPECT_EQ(positions_of(layout, 1, 0), (std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 0, 0, 0, 0, 0, 0}));
  const std::vector<int32_t> offsets = {10, 20, 30, 40, 50};
  EXPECT_EQ(positions_of(layout, 1, 0, offsets.data()),
            (std::vector<int64_t>{10, 11, 12, 13, 30, 31, 32, 33, 34, 35, 0, 0, 0, 0, 0, 0}));
}

TEST(RopePosition, SingleDeviceAcceptsAnyPadding) {
  // cp = 1 with odd padded lengths (cu_seqlens_padded == cu_seqlens): row - S_b.
  BatchLayout layout;
  layout.cu_seqlens = {0, 3, 8};
  layout.cu_seqlens_padded = {0, 3, 8};
  EXPECT_EQ(positions_of(layout, 1, 0), (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 3, 4}));
}

TEST(RopePosition, ContiguousPiecesKeepTheirDocumentPositions) {
  // Lengths 5, 0, 4 with no padding but the last document's (9 rows -> 12 for cp 4): rank 1
  // holds document 0's last two rows and document 2's first; rank 3 document 2's padding
  // rows, which keep their positions.
  const BatchLayout layout = make_contiguous_layout({5, 0, 4}, 4);
  ASSERT_EQ(layout.cu_seqlens_padded, (std::vector<int32_t>{0, 5, 5, 12}));
  const std::vector<std::vector<int64_t>> want = {{0, 1, 2}, {3, 4, 0}, {1, 2, 3}, {4, 5, 6}};
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(positions_of(layout, 4, rank, nullptr, CpLayout::kContiguous), want[static_cast<size_t>(rank)]);
  }
  const std::vector<int32_t> offsets = {100, 7, 1000};
  EXPECT_EQ(positions_of(layout, 4, 1, offsets.data(), CpLayout::kContiguous), (std::vector<int64_t>{103, 104, 1000}));
}

TEST(RopePosition, TwoRanks) {
  // Lengths 5, 8 padded to 8 each (chunks of 2); capacity (4, 24): sequence 2 is an empty
  // placeholder, sequence 3 absorbs 8 slack rows (4 per rank). Rank 0 holds chunks 0 and 3,
  // rank 1 chunks 1 and 2. Sequence 0's positions 5..7 are padding and keep their positions.
  const BatchLayout layout = make_layout({5, 8}, 2, Capacity{4, 24});
  ASSERT_EQ(layout.cu_seqlens_padded, (std::vector<int32_t>{0, 8, 16, 16, 24}));
  EXPECT_EQ(positions_of(layout, 2, 0), (std::vector<int64_t>{0, 1, 6, 7, 0, 1, 6, 7, 0, 0, 0, 0}));
  EXPECT_EQ(positions_of(layout, 2, 1), (std::vector<int64_t>{2, 3, 4, 5, 2, 3, 4, 5, 0, 0, 0, 0}));
  const std::vector<int32_t> offsets = {100, 1000, 7, 9};
  EXPECT_EQ(positions_of(layout, 2, 0, offsets.data()),
            (std::vector<int64_t>{100, 101, 106, 107, 1000, 1001, 1006, 1007, 0, 0, 0, 0}));
  EXPECT_EQ(positions_of(layout, 2, 1, offsets.data()),
            (std::vector<int64_t>{102, 103, 104, 105, 1002, 1003, 1004, 1005, 0, 0, 0, 0}));
}

TEST(RopePosition, FourRanks) {
  // One sequence of 9 padded to 16 (chunks of 2) and 8 slack rows (2 per rank). Rank r holds
  // chunks r and 7 - r.
  const BatchLayout layout = make_layout({9}, 4, Capacity{2, 24});
  ASSERT_EQ(layout.cu_seqlens_padded, (std::vector<int32_t>{0, 16, 24}));
  EXPECT_EQ(positions_of(layout, 4, 0), (std::vector<int64_t>{0, 1, 14, 15, 0, 0}));
  EXPECT_EQ(positions_of(layout, 4, 1), (std::vector<int64_t>{2, 3, 12, 13, 0, 0}));
  EXPECT_EQ(positions_of(layout, 4, 2), (std::vector<int64_t>{4, 5, 10, 11, 0, 0}));
  EXPECT_EQ(positions_of(layout, 4, 3), (std::vector<int64_t>{6, 7, 8, 9, 0, 0}));
  const std::vector<int32_t> offsets = {100, 7};
  EXPECT_EQ(positions_of(layout, 4, 0, offsets.data()), (std::vector<int64_t>{100, 101, 114, 115, 0, 0}));
  EXPECT_EQ(positions_of(layout, 4, 3, offsets.data()), (std::vector<int64_t>{106, 107, 108, 109, 0, 0}));
}

// On random layouts, the position of every local row equals the single-device position of
// the global row the rank split puts there.
TEST(RopePosition, RanksAgreeWithTheRankSplit) {
  Rng rng(7);
  for (int cp : {1, 2, 3, 4, 8}) {
    for (int trial = 0; trial < 5; ++trial) {
      std::vector<int64_t> lengths;
      const int docs = static_cast<int>(rng.uniform_int(1, 6));
      for (int d = 0; d < docs; ++d) lengths.push_back(rng.uniform_int(0, 50));
      const BatchLayout dense = make_layout(lengths, cp);
      const BatchLayout layout = make_layout(lengths, cp, Capacity{docs + 3, dense.total_rows() + 4 * cp});
      std::vector<int32_t> offsets;
      for (int b = 0; b < layout.num_seqs(); ++b) offsets.push_back(static_cast<int32_t>(rng.uniform_int(0, 1000)));
      const std::vector<int64_t> global = positions_of(layout, 1, 0, offsets.data());
      for (int rank = 0; rank < cp; ++rank) {
        const std::vector<int32_t> map = rank_row_map(layout.view(), cp, rank);
        const std::vector<int64_t> local = positions_of(layout, cp, rank, offsets.data());
        ASSERT_EQ(local.size(), map.size());
        for (size_t j = 0; j < map.size(); ++j) {
          EXPECT_EQ(local[j], global[static_cast<size_t>(map[j])]) << "cp " << cp << " rank " << rank << " row " << j;
        }
      }
    }
  }
}

TEST(RopeFrequency, FormulaAndPairs) {
  EXPECT_EQ(rope_inv_freq(0, 4, 10000.0f), 1.0f);
  EXPECT_FLOAT_EQ(rope_inv_freq(1, 4, 10000.0f), 0.01f);
  EXPECT_FLOAT_EQ(rope_inv_freq(3, 8, 10000.0f), std::pow(10000.0f, -0.75f));
  EXPECT_EQ(rope_angle(3, 0.5f), 1.5f);
  EXPECT_EQ(rope_pair(RopeLayout::kInterleaved, 8, 3).first, 6);
  EXPECT_EQ(rope_pair(RopeLayout::kInterleaved, 8, 3).second, 7);
  EXPECT_EQ(rope_pair(RopeLayout::kHalfSplit, 8, 3).first, 3);
  EXPECT_EQ(rope_pair(RopeLayout::kHalfSplit, 8, 3).second, 7);
  const RopeRotated quarter = rope_rotate(1.0f, 2.0f, 0.0f, 1.0f);  // 90 degrees
  EXPECT_EQ(quarter.first, -2.0f);
  EXPECT_EQ(quarter.second, 1.0f);
  EXPECT_EQ(rope_rotary_dim(RopeConfig{}, 64), 64);
  EXPECT_EQ(rope_rotary_dim(RopeConfig{RopeLayout::kHalfSplit, 32}, 64), 32);
}

TEST(RopeConfigCheck, BadConfigsNameTheArgument) {
  EXPECT_NO_THROW(validate_rope_config(RopeConfig{}, 64));
  EXPECT_NO_THROW(validate_rope_config(RopeConfig{RopeLayout::kInterleaved, 2, 500000.0f}, 6));
  EXPECT_THDCP_ERROR(validate_rope_config(RopeConfig{RopeLayout::kHalfSplit, 7}, 64),
                     "RopeConfig::rotary_dim=7 resolves to 7, which is odd");
  EXPECT_THDCP_ERROR(validate_rope_config(RopeConfig{}, 7), "RopeConfig::rotary_dim=0 resolves to 7, which is odd");
  EXPECT_THDCP_ERROR(validate_rope_config(RopeConfig{RopeLayout::kHalfSplit, 80}, 64),
                     "RopeConfig::rotary_dim=80 must be in [0, head_dim=64]");
  EXPECT_THDCP_ERROR(validate_rope_config(RopeConfig{RopeLayout::kHalfSplit, -2}, 64),
                     "RopeConfig::rotary_dim=-2 must be in [0, head_dim=64]");
  EXPECT_THDCP_ERROR(validate_rope_config(RopeConfig{RopeLayout::kHalfSplit, 0, 0.0f}, 64),
                     "RopeConfig::theta=0 must be finite and > 0");
  EXPECT_THDCP_ERROR(validate_rope_config(RopeConfig{RopeLayout::kHalfSplit, 0, NAN}, 64), "RopeConfig::theta=nan");
  EXPECT_THDCP_ERROR(validate_rope_config(RopeConfig{static_cast<RopeLayout>(5)}, 64),
                     "RopeConfig::layout=5 is not a RopeLayout");
  EXPECT_THDCP_ERROR(validate_rope_config(RopeConfig{}, 0), "head_dim=0 must be >= 2");
  const float values[2] = {1.0f, 0.0f};
  EXPECT_THDCP_ERROR(validate_rope_table(RopeTable{values, nullptr, 1}), "give both (a table) or neither");
  EXPECT_THDCP_ERROR(validate_rope_table(RopeTable{values, values, 0}), "RopeTable::rows=0 must be >= 1");
}

}  // namespace
}  // namespace thdcp
