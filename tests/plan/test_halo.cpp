// The halo of AllGather CP (thdcp/plan/halo.h) against a brute force: for every query row of a
// rank, every key of its document the mask lets it see, the rank that holds that key (from
// rank_row_map and Mask::allows only, not the segment table the halo is computed from).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "support/expect_error.h"
#include "support/random_batch.h"
#include "thdcp/plan/halo.h"
#include "thdcp/plan/rank_split.h"

namespace thdcp {
namespace {

using HeldRow = std::tuple<int /*source rank*/, int64_t /*local row*/, int64_t /*global row*/>;

std::set<HeldRow> brute_force_halo(const LayoutView& layout, int cp, int rank, const Mask& mask, CpLayout cp_layout) {
  std::vector<std::pair<int, int64_t>> holder(static_cast<size_t>(layout.total_rows()));
  for (int r = 0; r < cp; ++r) {
    const std::vector<int32_t> map = rank_row_map(layout, cp, r, cp_layout);
    for (size_t local = 0; local < map.size(); ++local) holder[static_cast<size_t>(map[local])] = {r, local};
  }
  std::set<HeldRow> halo;
  for (int32_t query_row : rank_row_map(layout, cp, rank, cp_layout)) {
    const int b = sequence_of_row(layout.cu_seqlens_padded, layout.num_seqs, query_row, 1);
    const int64_t position = query_row - layout.padded_start(b);
    if (position >= layout.length(b)) continue;  // padding: no query
    for (int64_t key = 0; key < layout.length(b); ++key) {
      if (!mask.allows(position, key)) continue;
      const int64_t key_row = layout.padded_start(b) + key;
      const auto [source, local] = holder[static_cast<size_t>(key_row)];
      if (source != rank) halo.insert({source, local, key_row});
    }
  }
  return halo;
}

// The rows of a halo, checking its promises on the way: runs ordered by source then global
// row, not overlapping, each non-empty.
std::set<HeldRow> expand(const std::vector<HaloRun>& halo, int rank) {
  std::set<HeldRow> rows;
  for (size_t i = 0; i < halo.size(); ++i) {
    const HaloRun& run = halo[i];
    EXPECT_GT(run.rows, 0) << "run " << i;
    EXPECT_NE(run.source_rank, rank) << "run " << i << " is the rank's own";
    if (i > 0) {
      const HaloRun& last = halo[i - 1];
      EXPECT_TRUE(last.source_rank < run.source_rank ||
                  (last.source_rank == run.source_rank && last.global_row + last.rows < run.global_row + 1))
          << "run " << i << " is out of order or overlaps run " << i - 1;
    }
    for (int64_t j = 0; j < run.rows; ++j) rows.insert({run.source_rank, run.local_row + j, run.global_row + j});
  }
  EXPECT_EQ(static_cast<int64_t>(rows.size()), halo_row_count(halo));
  return rows;
}

void expect_halo_is_brute_force(const BatchLayout& batch, int cp, const Mask& mask, CpLayout cp_layout) {
  for (int rank = 0; rank < cp; ++rank) {
    const std::vector<HaloRun> halo = halo_rows(batch.view(), cp, rank, mask, cp_layout);
    EXPECT_EQ(expand(halo, rank), brute_force_halo(batch.view(), cp, rank, mask, cp_layout))
        << cp_layout_name(cp_layout) << " cp " << cp << " rank " << rank << " mask (" << mask.window_left << ","
        << mask.window_right << ")";
    int64_t by_source = 0;
    for (int source = 0; source < cp; ++source) by_source += halo_row_count(halo, source);
    EXPECT_EQ(by_source, halo_row_count(halo));
  }
}

class HaloMatrix : public ::testing::TestWithParam<std::tuple<CpLayout, int>> {};

// Random documents with lengths 0 and 1 among them, a capacity's placeholders behind them, and
// windows narrower and wider than a rank's piece (left only, both sides, right unbounded).
TEST_P(HaloMatrix, EqualsBruteForce) {
  const auto [cp_layout, cp] = GetParam();
  Rng rng(static_cast<uint64_t>(40 + cp + 10 * static_cast<int>(cp_layout)));
  for (int trial = 0; trial < 3; ++trial) {
    std::vector<int64_t> lengths = test::random_lengths(rng, 5, 70);
    lengths.insert(lengths.begin() + trial, {0, 1});
    const BatchLayout batch = cp_layout == CpLayout::kDualChunk
                                  ? make_layout(lengths, cp, Capacity{12, 64 * cp * 8})
                                  : make_contiguous_layout(lengths, cp);
    for (const Mask& mask : {Mask::window(0, 0), Mask::window(3, 0), Mask::window(40, 0), Mask::window(200, 0),
                             Mask::window(7, 3), Mask::window(5, -1), Mask::causal(), Mask::full()}) {
      expect_halo_is_brute_force(batch, cp, mask, cp_layout);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, HaloMatrix,
                         ::testing::Combine(::testing::Values(CpLayout::kDualChunk, CpLayout::kContiguous),
                                            ::testing::Values(1, 2, 3, 4, 8)),
                         [](const ::testing::TestParamInfo<std::tuple<CpLayout, int>>& param_info) {
                           return std::string(cp_layout_name(std::get<0>(param_info.param))) + "_cp" +
                                  std::to_string(std::get<1>(param_info.param));
                         });

// One document of 64 rows, window (5, 0), worked by hand.
TEST(Halo, OneDocumentByHand) {
  const BatchLayout doc = make_layout({64}, 2);
  // Dual chunk, cp 2, chunks of 16: rank 0 holds [0, 16) and [48, 64), rank 1 [16, 48). Rank
  // 0's late chunk reaches back into [43, 48) (rank 1's local rows 27..31); rank 1's early chunk
  // into [11, 16) (rank 0's local rows 11..15), its late chunk only its own rows.
  const std::vector<HaloRun> rank0 = halo_rows(doc.view(), 2, 0, Mask::window(5, 0));
  ASSERT_EQ(rank0.size(), 1u);
  EXPECT_EQ(std::make_tuple(rank0[0].source_rank, rank0[0].local_row, rank0[0].global_row, rank0[0].rows),
            std::make_tuple(1, int64_t{27}, int64_t{43}, int64_t{5}));
  const std::vector<HaloRun> rank1 = halo_rows(doc.view(), 2, 1, Mask::window(5, 0));
  ASSERT_EQ(rank1.size(), 1u);
  EXPECT_EQ(std::make_tuple(rank1[0].source_rank, rank1[0].local_row, rank1[0].global_row, rank1[0].rows),
            std::make_tuple(0, int64_t{11}, int64_t{11}, int64_t{5}));
  // Contiguous, cp 4, pieces of 16: rank 2 (rows [32, 48)) reaches [27, 32) of rank 1, and with
  // a window wider than a piece (20) also [12, 16) of rank 0; rank 0 has no halo.
  const BatchLayout packed = make_contiguous_layout({64}, 4);
  EXPECT_EQ(halo_row_count(halo_rows(packed.view(), 4, 2, Mask::window(5, 0), CpLayout::kContiguous)), 5);
  const std::vector<HaloRun> wide = halo_rows(packed.view(), 4, 2, Mask::window(20, 0), CpLayout::kContiguous);
  ASSERT_EQ(wide.size(), 2u);
  EXPECT_EQ(std::make_tuple(wide[0].source_rank, wide[0].local_row, wide[0].rows), std::make_tuple(0, int64_t{12}, int64_t{4}));
  EXPECT_EQ(std::make_tuple(wide[1].source_rank, wide[1].local_row, wide[1].rows), std::make_tuple(1, int64_t{0}, int64_t{16}));
  EXPECT_TRUE(halo_rows(packed.view(), 4, 0, Mask::window(20, 0), CpLayout::kContiguous).empty());
}

TEST(Halo, RefusesBadArguments) {
  const BatchLayout doc = make_layout({64}, 2);
  EXPECT_THDCP_ERROR(halo_rows(doc.view(), 2, 0, Mask::window(-3, 0)), "window_left=-3 must be >= 0, or -1");
  EXPECT_THDCP_ERROR(halo_rows(doc.view(), 2, 2, Mask::causal()), "rank=2 must be in [0, cp=2)");
  EXPECT_THDCP_ERROR(halo_rows(doc.view(), 3, 0, Mask::causal()), "multiple of 2*cp=6");
}

}  // namespace
}  // namespace thdcp
