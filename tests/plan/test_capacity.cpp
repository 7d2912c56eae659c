// Capacities of captured graphs: the placeholder rule, the zero-fallback default, buckets,
// and the CP-size policy of dynamic CP (thdcp/plan/capacity.h). No GPU.
#include <gtest/gtest.h>

#include <vector>

#include "support/expect_error.h"
#include "thdcp/plan/capacity.h"
#include "thdcp/testing/workload.h"

namespace thdcp {
namespace {

TEST(Capacity, DefaultMaxSeqsIsTokensOverTwoCpPlusOne) {
  EXPECT_EQ(default_max_seqs(16384, 1), 8193);
  EXPECT_EQ(default_max_seqs(16384, 2), 4097);
  EXPECT_EQ(default_max_seqs(16384, 8), 1025);
  const Capacity c = default_capacity(4096, 4);
  EXPECT_EQ(c.max_seqs, 513);
  EXPECT_EQ(c.max_tokens, 4096);
  EXPECT_THDCP_ERROR(default_max_seqs(100, 4), "multiple of 2*cp=8");
  EXPECT_THDCP_ERROR(default_max_seqs(64, 0), "cp=0");
}

// Every batch whose padded rows fit max_tokens also fits the default max_seqs: the document
// count never forces a fallback. Checked on the tightest batches (every document of one
// token: 2*cp rows each) and on random ones.
TEST(Capacity, DefaultCapacityNeverFallsBackOnDocumentCount) {
  for (int cp : {1, 2, 3, 4, 8}) {
    const int64_t max_tokens = 2 * cp * 100;
    const Capacity c = default_capacity(max_tokens, cp);
    const std::vector<int64_t> tightest(static_cast<size_t>(max_tokens / (2 * cp)), 1);
    EXPECT_EQ(check_fit(tightest, cp, c), Fit::kFits) << "cp " << cp;
    std::vector<int64_t> one_more = tightest;
    one_more.push_back(1);
    EXPECT_EQ(check_fit(one_more, cp, c), Fit::kTooManyTokens) << "cp " << cp;
    Rng rng(7 + static_cast<uint64_t>(cp));
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<int64_t> lengths;
      const int docs = static_cast<int>(rng.uniform_int(1, 150));
      for (int d = 0; d < docs; ++d) lengths.push_back(rng.uniform_int(0, 2 * cp + 3));
      const Fit fit = check_fit(lengths, cp, c);
      EXPECT_NE(fit, Fit::kTooManySequences) << "cp " << cp << " trial " << trial;
      EXPECT_EQ(fit == Fit::kFits, padded_rows(lengths, cp) <= max_tokens);
    }
  }
}

// The contiguous layout: documents take their own length in rows, max_tokens a multiple of
// cp, the zero-fallback max_seqs max_tokens + 1; fits, the capacity form, the fallback choice
// and the CP-size policy follow it.
TEST(Capacity, ContiguousLayoutTakesDocumentsUnpadded) {
  const CpLayout contiguous = CpLayout::kContiguous;
  EXPECT_EQ(default_max_seqs(300, 3, contiguous), 301);
  EXPECT_THDCP_ERROR(default_max_seqs(100, 3, contiguous), "max_tokens=100 must be a positive multiple of cp=3 "
                                                           "(layout=contiguous): round it up to 102");
  EXPECT_EQ(padded_rows({5, 0, 7}, 4, contiguous), 12);
  EXPECT_EQ(padded_rows({5, 0, 7}, 4), 16);
  const Capacity c{3, 12};  // two documents, 12 rows: 5 + 7 fits unpadded, not padded to 8
  EXPECT_EQ(check_fit({5, 0, 7}, 2, c, contiguous), Fit::kFits);
  EXPECT_THDCP_ERROR(check_fit({5, 0, 7}, 4, Capacity{3, 12}), "multiple of 2*cp=8");
  EXPECT_EQ(check_fit({5, 8}, 2, c, contiguous), Fit::kTooManyTokens);
  EXPECT_EQ(check_fit({5, 1, 1}, 2, c, contiguous), Fit::kTooManySequences);
  const BatchLayout layout = capacity_layout({5, 0, 7}, 2, c, contiguous);
  EXPECT_EQ(layout.cu_seqlens, (std::vector<int32_t>{0, 5, 12, 12}));
  EXPECT_EQ(layout.cu_seqlens_padded, (std::vector<int32_t>{0, 5, 12, 12}));
  // A batch whose documents fit no bucket falls back to the contiguous zero-fallback capacity.
  const CapacityChoice choice = choose_capacity({Capacity{2, 12}}, {3, 3, 3}, 2, contiguous);
  EXPECT_TRUE(choice.fallback);
  EXPECT_EQ(choice.run, (Capacity{13, 12}));
  test::expect_error([] { choose_capacity({Capacity{2, 12}}, {13}, 2, CpLayout::kContiguous); },
                     {"a batch of 13 rows at cp=2 (layout=contiguous: documents unpadded) fits no capacity"});
  // 9 + 9 rows: at cp 2 each rank holds 9 (within 10); padded to 4 they would be 12 + 12.
  EXPECT_EQ(choose_cp_size({9, 9}, {1, 2, 4}, 10, contiguous), 2);
  EXPECT_EQ(choose_cp_size({9, 9}, {1, 2, 4}, 10), 4);
}

TEST(Capacity, ZeroLengthDocumentsTakeNoRowAndAreNotCounted) {
  const Capacity c{3, 16};  // two real documents at most
  EXPECT_EQ(check_fit({5, 0, 0, 0, 3}, 2, c), Fit::kFits);
  EXPECT_EQ(check_fit({5, 1, 3}, 2, c), Fit::kTooManySequences);
  const BatchLayout layout = capacity_layout({5, 0, 0, 3}, 2, c);
  EXPECT_EQ(layout.cu_seqlens, (std::vector<int32_t>{0, 5, 8, 8}));
  EXPECT_EQ(layout.cu_seqlens_padded, (std::vector<int32_t>{0, 8, 12, 16}));
}

// max_seqs + 1 entries; trailing placeholders repeat the last offset; the last padded
// entry is max_tokens; one placeholder is always reserved.
TEST(Capacity, PlaceholderRule) {
  const Capacity c{5, 32};
  const BatchLayout layout = capacity_layout({3, 6}, 2, c);
  EXPECT_EQ(layout.cu_seqlens, (std::vector<int32_t>{0, 3, 9, 9, 9, 9}));
  EXPECT_EQ(layout.cu_seqlens_padded, (std::vector<int32_t>{0, 4, 12, 12, 12, 32}));
  EXPECT_EQ(check_fit({1, 1, 1, 1}, 2, c), Fit::kFits);
  EXPECT_EQ(check_fit({1, 1, 1, 1, 1}, 2, c), Fit::kTooManySequences);  // 5 = max_seqs: no placeholder left
  const BatchLayout full = capacity_layout({1, 1, 1, 1}, 2, c);
  EXPECT_EQ(full.cu_seqlens_padded.back(), 32);
  EXPECT_EQ(full.cu_seqlens_padded[4], 16);  // the reserved placeholder absorbs rows 16..31
  const BatchLayout exact = capacity_layout({32}, 2, c);  // exactly max_tokens used
  EXPECT_EQ(exact.cu_seqlens_padded, (std::vector<int32_t>{0, 32, 32, 32, 32, 32}));
  EXPECT_THDCP_ERROR(capacity_layout({1, 1, 1, 1, 1}, 2, c), "max_seqs=5");
  EXPECT_THDCP_ERROR(capacity_layout({33}, 2, c), "max_tokens=32");
  EXPECT_THDCP_ERROR(check_fit({-1}, 2, c), "lengths[0]=-1");
}

TEST(Capacity, SmallestFittingBucket) {
  const std::vector<Capacity> buckets{{65, 4096}, {9, 1024}, {33, 2048}, {3, 1024}};
  EXPECT_EQ(smallest_fitting(buckets, {100}, 2), 3);        // 1024 tokens, 3 seqs
  EXPECT_EQ(smallest_fitting(buckets, {100, 1, 1}, 2), 1);  // 3 documents: not {3, 1024}
  EXPECT_EQ(smallest_fitting(buckets, {1500}, 2), 2);       // the next bucket by tokens
  EXPECT_EQ(smallest_fitting(buckets, std::vector<int64_t>(40, 1), 2), 0);
  EXPECT_EQ(smallest_fitting(buckets, {5000}, 2), -1);
}

// The bank's rule: the smallest bucket that fits runs the batch; a batch whose rows fit a
// bucket but whose documents fit none falls back to the zero-fallback capacity of the
// smallest bucket its rows fit, counted against that bucket; rows that fit no bucket throw.
TEST(Capacity, ChooseCapacityRunsFallsBackOrRefuses) {
  const std::vector<Capacity> buckets{{9, 1024}, {9, 512}};
  const CapacityChoice fits = choose_capacity(buckets, {100, 50, 7}, 2);
  EXPECT_FALSE(fits.fallback);
  EXPECT_EQ(fits.bucket, (Capacity{9, 512}));
  EXPECT_EQ(fits.run, (Capacity{9, 512}));
  const CapacityChoice next = choose_capacity(buckets, {300, 250, 150}, 2);  // 704 rows
  EXPECT_FALSE(next.fallback);
  EXPECT_EQ(next.run, (Capacity{9, 1024}));
  const CapacityChoice fallback = choose_capacity(buckets, std::vector<int64_t>(20, 10), 2);  // 20 docs, 240 rows
  EXPECT_TRUE(fallback.fallback);
  EXPECT_EQ(fallback.bucket, (Capacity{9, 512}));
  EXPECT_EQ(fallback.run, default_capacity(512, 2));
  const CapacityChoice larger = choose_capacity(buckets, std::vector<int64_t>(40, 20), 2);  // 40 docs, 800 rows
  EXPECT_TRUE(larger.fallback);
  EXPECT_EQ(larger.bucket, (Capacity{9, 1024}));
  EXPECT_THDCP_ERROR(choose_capacity(buckets, {3000}, 2),
                     "a batch of 3000 rows at cp=2 (documents padded to multiples of 2*cp) fits no capacity: the "
                     "largest is cp=2 max_seqs=9 max_tokens=1024");
  EXPECT_THDCP_ERROR(choose_capacity({}, {1}, 2), "no capacity to run the batch at");
}

TEST(Capacity, BankKeysOrderByTokensThenSequences) {
  EXPECT_TRUE((Capacity{9, 1024} < Capacity{3, 2048}));
  EXPECT_TRUE((Capacity{3, 1024} < Capacity{9, 1024}));
  EXPECT_TRUE((Capacity{9, 1024} == Capacity{9, 1024}));
  EXPECT_TRUE((Capacity{9, 1024} != Capacity{9, 2048}));
  EXPECT_EQ(capacity_key_name(2, Capacity{9, 1024}), "cp=2 max_seqs=9 max_tokens=1024");
}

TEST(Capacity, CpSizePolicyPicksTheSmallestSizeWithinTheRowBudget) {
  const std::vector<int> sizes{4, 1, 2};
  EXPECT_EQ(choose_cp_size({1000, 900}, sizes, 4096), 1);
  EXPECT_EQ(choose_cp_size({6000}, sizes, 4096), 2);   // 6000 rows: 3000 per rank at cp 2
  EXPECT_EQ(choose_cp_size({9000, 4000}, sizes, 4096), 4);
  EXPECT_EQ(choose_cp_size({4095}, {1, 2}, 2048), 2);  // 4096 padded rows at cp 2 = 2048 per rank
  EXPECT_THDCP_ERROR(choose_cp_size({20000}, sizes, 4096), "largest CP size 4");
  EXPECT_THDCP_ERROR(choose_cp_size({1}, {}, 4096), "no CP sizes");
  EXPECT_THDCP_ERROR(choose_cp_size({1}, {0}, 4096), "CP size 0");
}

}  // namespace
}  // namespace thdcp
