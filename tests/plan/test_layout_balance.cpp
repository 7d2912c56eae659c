// The layouts' padding and per-rank pairs (layout_balance.h): the closed forms against an
// enumeration of every (query, key) pair on small random batches, for every mask and
// cp in {1, 2, 3, 4, 8}; known cases; many batches; the recommendation; bad arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <vector>

#include "support/expect_error.h"
#include "thdcp/plan/layout_balance.h"

namespace thdcp {
namespace {

// Brute force, written from the layouts' definitions: the position within its document of
// every valid query row of each rank, then every key of that document the mask allows.
std::vector<int64_t> enumerate_pairs(const std::vector<int64_t>& lengths, int cp, CpLayout layout,
                                     const Mask& mask) {
  std::vector<int64_t> pairs(static_cast<size_t>(cp), 0);
  const auto count = [&](int rank, int64_t position, int64_t length) {
    for (int64_t key = 0; key < length; ++key) pairs[static_cast<size_t>(rank)] += mask.allows(position, key) ? 1 : 0;
  };
  if (layout == CpLayout::kDualChunk) {
    for (int64_t length : lengths) {
      int64_t padded = length;
      while (padded % (2 * cp) != 0) ++padded;
      const int64_t chunk = padded / (2 * cp);
      for (int64_t position = 0; position < length; ++position) {
        const int64_t k = position / chunk;  // chunk k lives on rank k, or on 2cp-1-k
        count(static_cast<int>(k < cp ? k : 2 * cp - 1 - k), position, length);
      }
    }
    return pairs;
  }
  int64_t rows = 0;
  for (int64_t length : lengths) rows += length;
  while (rows % cp != 0) ++rows;
  int64_t row = 0;
  for (int64_t length : lengths) {
    for (int64_t position = 0; position < length; ++position, ++row) {
      count(static_cast<int>(row / (rows / cp)), position, length);
    }
  }
  return pairs;
}

const Mask kMasks[] = {Mask::causal(), Mask::full(),         Mask::window(0, 0), Mask::window(5, 0),
                       Mask::window(17, 0), Mask::window(3, 2), Mask::window(-1, 4)};

TEST(LayoutBalance, ClosedFormMatchesEnumeration) {
  std::mt19937 rng(31);
  for (const Mask& mask : kMasks) {
    for (int cp : {1, 2, 3, 4, 8}) {
      for (int trial = 0; trial < 20; ++trial) {
        std::vector<int64_t> lengths;
        const int documents = 1 + static_cast<int>(rng() % 6);
        for (int d = 0; d < documents; ++d) lengths.push_back(static_cast<int64_t>(rng() % 61));  // 0 included
        const std::vector<CpLayoutReport> reports = cp_layout_report(lengths, cp, mask);
        ASSERT_EQ(reports.size(), 2u);
        int64_t tokens = 0;
        for (int64_t length : lengths) tokens += length;
        for (const CpLayoutReport& r : reports) {
          const std::vector<int64_t> expected = enumerate_pairs(lengths, cp, r.layout, mask);
          EXPECT_EQ(r.rank_pairs, expected) << cp_layout_name(r.layout) << " cp=" << cp << " mask=("
                                            << mask.window_left << "," << mask.window_right << ")";
          int64_t total = 0;
          for (int64_t p : expected) total += p;
          EXPECT_EQ(r.total_pairs, total);
          const int64_t busiest = *std::max_element(expected.begin(), expected.end());
          EXPECT_DOUBLE_EQ(r.balance, total > 0 ? busiest / (static_cast<double>(total) / cp) : 1.0);
          EXPECT_EQ(r.valid_tokens, tokens);
          EXPECT_EQ(r.total_rows, tokens + r.padding_tokens);
        }
        EXPECT_EQ(reports[0].total_pairs, reports[1].total_pairs) << "both layouts hold every pair once";
      }
    }
  }
}

TEST(LayoutBalance, Padding) {
  // dual_chunk pads every document to a multiple of 2*cp, contiguous the batch to one of cp.
  const std::vector<int64_t> lengths{1, 2, 3, 0};
  EXPECT_EQ(cp_layout_padding(lengths, 2, CpLayout::kDualChunk), 3 + 2 + 1);
  EXPECT_EQ(cp_layout_padding(lengths, 2, CpLayout::kContiguous), 0);
  EXPECT_EQ(cp_layout_padding(lengths, 4, CpLayout::kDualChunk), 7 + 6 + 5);
  EXPECT_EQ(cp_layout_padding(lengths, 4, CpLayout::kContiguous), 2);
  EXPECT_EQ(cp_layout_padding(lengths, 1, CpLayout::kDualChunk), 1 + 0 + 1);  // cp = 1: even lengths
  EXPECT_EQ(cp_layout_padding(lengths, 1, CpLayout::kContiguous), 0);
  EXPECT_EQ(cp_layout_padding({}, 8, CpLayout::kContiguous), 0);
  const std::vector<CpLayoutReport> r = cp_layout_report(lengths, 3, Mask::causal());
  EXPECT_EQ(r[0].padding_tokens, 5 + 4 + 3);
  EXPECT_EQ(r[0].total_rows, 18);
  EXPECT_EQ(r[1].padding_tokens, 0);
  EXPECT_EQ(r[1].total_rows, 6);
}

TEST(LayoutBalance, DualChunkBalancesOneCausalDocument) {
  for (int cp : {1, 2, 3, 4, 8}) {
    const CpLayoutReport r = cp_layout_report({8 * static_cast<int64_t>(cp)}, cp, Mask::causal())[0];
    ASSERT_EQ(r.layout, CpLayout::kDualChunk);
    EXPECT_EQ(r.padding_tokens, 0);
    for (int64_t p : r.rank_pairs) EXPECT_EQ(p, r.rank_pairs[0]) << "cp=" << cp;
    EXPECT_DOUBLE_EQ(r.balance, 1.0);
  }
}

TEST(LayoutBalance, ContiguousCausalLoadsTheLastRank) {
  const int64_t length = 4096;
  for (int cp : {2, 3, 4, 8}) {
    const CpLayoutReport r = cp_layout_report({length}, cp, Mask::causal())[1];
    ASSERT_EQ(r.layout, CpLayout::kContiguous);
    for (int rank = 1; rank < cp; ++rank) EXPECT_GT(r.rank_pairs[rank], r.rank_pairs[rank - 1]);
    // Rank r's n rows start at position r*n: n*r*n + n(n+1)/2 pairs (n = L/cp, cp | L).
    if (length % cp == 0) {
      const int64_t n = length / cp;
      for (int rank = 0; rank < cp; ++rank) EXPECT_EQ(r.rank_pairs[rank], n * rank * n + n * (n + 1) / 2);
    }
    const double mean = static_cast<double>(length) * (length + 1) / 2 / cp;
    EXPECT_DOUBLE_EQ(r.balance, static_cast<double>(r.rank_pairs[cp - 1]) / mean);
    EXPECT_GT(r.balance, 1.4) << "cp=" << cp;  // (2cp-1)/cp for large L: 1.5 at cp = 2
  }
  // A left window makes contiguous balanced again, apart from the first rank's short start.
  const CpLayoutReport windowed = cp_layout_report({length}, 4, Mask::window(64, 0))[1];
  EXPECT_LT(windowed.balance, 1.01);
}

TEST(LayoutBalance, LongDocumentsCostNoMore) {
  // Closed form per piece: a document of 2^31 - 2^4 tokens counts as fast as a short one.
  const int64_t length = (int64_t{1} << 31) - 16;
  for (int cp : {1, 3, 8}) {
    for (const CpLayoutReport& r : cp_layout_report({length}, cp, Mask::causal())) {
      EXPECT_EQ(r.total_pairs, length * (length + 1) / 2) << cp_layout_name(r.layout) << " cp=" << cp;
    }
  }
}

TEST(LayoutBalance, ManyBatches) {
  const std::vector<std::vector<int64_t>> batches{{4096}, {100, 200, 300}, {7}};
  for (CpLayout layout : kCpLayouts) {
    const RankBalance b = rank_balance(batches, 4, layout, Mask::causal());
    std::vector<int64_t> sum(4, 0);
    double busiest = 0, mean = 0, worst = 1.0;
    int64_t worst_batch = 0;
    for (size_t i = 0; i < batches.size(); ++i) {
      const std::vector<int64_t> pairs = enumerate_pairs(batches[i], 4, layout, Mask::causal());
      int64_t total = 0;
      for (int rank = 0; rank < 4; ++rank) {
        sum[rank] += pairs[rank];
        total += pairs[rank];
      }
      const int64_t most = *std::max_element(pairs.begin(), pairs.end());
      busiest += most;
      mean += total / 4.0;
      if (most / (total / 4.0) > worst) {
        worst = most / (total / 4.0);
        worst_batch = static_cast<int64_t>(i);
      }
    }
    EXPECT_EQ(b.rank_pairs, sum);
    EXPECT_NEAR(b.step_max_over_mean, busiest / mean, 1e-12);
    EXPECT_NEAR(b.worst_batch_max_over_mean, worst, 1e-12);
    EXPECT_EQ(b.worst_batch, worst_batch);
  }
}

TEST(LayoutBalance, Recommendation) {
  const std::vector<Mask> masks{Mask::causal(), Mask::full(), Mask::window(64, 0)};
  // One long document: causal needs the dual-chunk split; full and the window are balanced
  // either way, and contiguous pads less (2*cp does not divide the length, cp does).
  const LayoutComparison one = compare_layouts({{4100}}, 4, masks);
  ASSERT_EQ(one.layouts.size(), 2u);
  ASSERT_EQ(one.choices.size(), 3u);
  EXPECT_EQ(one.layouts[0].padding_rows, 4);
  EXPECT_EQ(one.layouts[1].padding_rows, 0);
  EXPECT_EQ(one.choices[0].layout, CpLayout::kDualChunk) << one.choices[0].reason;
  EXPECT_NE(one.choices[0].reason.find("dual_chunk's busiest rank does 1.00"), std::string::npos)
      << one.choices[0].reason;
  EXPECT_EQ(one.choices[1].layout, CpLayout::kContiguous) << one.choices[1].reason;
  EXPECT_NE(one.choices[1].reason.find("within 1%"), std::string::npos) << one.choices[1].reason;
  EXPECT_EQ(one.choices[2].layout, CpLayout::kContiguous) << one.choices[2].reason;
  // Equal padding and balance: the default layout.
  const LayoutComparison even = compare_layouts({{4096}}, 4, {Mask::full()});
  EXPECT_EQ(even.choices[0].layout, CpLayout::kDualChunk) << even.choices[0].reason;
  // The balance of each mask is the one rank_balance gives.
  for (size_t m = 0; m < masks.size(); ++m) {
    EXPECT_EQ(one.layouts[1].balance[m].rank_pairs, rank_balance({{4100}}, 4, CpLayout::kContiguous, masks[m]).rank_pairs);
  }
}

TEST(LayoutBalance, RefusesBadArguments) {
  EXPECT_THDCP_ERROR(cp_layout_report({5, -1}, 2, Mask::causal()), "document 1 has length -1");
  EXPECT_THDCP_ERROR(cp_layout_report({5}, 0, Mask::causal()), "cp=0 must be >= 1");
  EXPECT_THDCP_ERROR(cp_layout_report({5}, 2, Mask::window(-3, 0)), "window_left");
  const int64_t most = std::numeric_limits<int32_t>::max();
  EXPECT_THDCP_ERROR(cp_layout_report({most, most}, 2, Mask::causal()), "more than 2^31-1 rows");
  EXPECT_THDCP_ERROR(rank_balance({{4}}, 0, CpLayout::kContiguous, Mask::causal()), "cp=0 must be >= 1");
}

// A batch's pairs fit int64 ((2^31)^2 at most); a sum over batches of documents near 2^31
// tokens may not, and is refused rather than wrapped (the fuzzer found the signed overflow).
TEST(LayoutBalance, PairSumsPastInt64AreRefused) {
  const int64_t longest = std::numeric_limits<int32_t>::max() - 47;  // a multiple of 16: padded as it is
  for (const CpLayout layout : kCpLayouts) {
    const RankBalance one = rank_balance({{longest}}, 8, layout, Mask::full());
    EXPECT_EQ(one.total_pairs, longest * longest) << cp_layout_name(layout);
    EXPECT_THDCP_ERROR(rank_balance({{longest}, {longest}, {longest}}, 8, layout, Mask::full()),
                       "the batches' (query, key) pairs add up past 2^63-1");
  }
}

}  // namespace
}  // namespace thdcp
