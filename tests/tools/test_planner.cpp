// Capacity planner: every number it reports on the sample file, recomputed here by simple
// independent code (direct packing, sorting, counting, closed-form causal pair counts), and
// the pair balance against an enumeration of (query, key) pairs through the dual-chunk map.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <random>

#include "support/expect_error.h"
#include "thdcp/plan/dual_chunk.h"
#include "thdcp/core/error.h"
#include "thdcp/plan/planner.h"
#include "thdcp/plan/segment.h"

namespace thdcp {
namespace {

// Brute-force packing: documents in order, each padded up to a multiple of `align`.
std::vector<std::vector<int64_t>> pack_directly(const std::vector<int64_t>& lengths, int64_t tokens, int64_t align) {
  std::vector<std::vector<int64_t>> batches(1);
  int64_t used = 0;
  for (int64_t length : lengths) {
    int64_t rows = length;
    while (rows % align != 0) ++rows;
    if (used + rows > tokens) {
      batches.emplace_back();
      used = 0;
    }
    batches.back().push_back(length);
    used += rows;
  }
  return batches;
}

// Nearest rank through floating point, as textbooks write it: the ceil(p/100 * n)-th value.
int64_t percentile_directly(std::vector<int64_t> values, double p) {
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(values.size()) - 1e-9));
  return values[std::max<size_t>(rank, 1) - 1];
}

// Causal pairs of chunk k (c rows) of a document of length L: its q valid query rows sit at
// positions k*c .. k*c+q-1 and each sees every key at or before it.
int64_t causal_chunk_pairs(int64_t length, int64_t c, int64_t k) {
  const int64_t q = std::clamp<int64_t>(length - k * c, 0, c);
  return q * k * c + q * (q + 1) / 2;
}

TEST(Planner, PercentileNearestRank) {
  const std::vector<int64_t> ten{7, 3, 1, 10, 2, 9, 4, 8, 6, 5};
  EXPECT_EQ(percentile_nearest_rank(ten, 50), 5);
  EXPECT_EQ(percentile_nearest_rank(ten, 90), 9);
  EXPECT_EQ(percentile_nearest_rank(ten, 91), 10);
  EXPECT_EQ(percentile_nearest_rank(ten, 99), 10);
  EXPECT_EQ(percentile_nearest_rank(ten, 100), 10);
  EXPECT_EQ(percentile_nearest_rank({42}, 1), 42);
  std::vector<int64_t> many(200);
  for (int i = 0; i < 200; ++i) many[i] = 199 - i;
  EXPECT_EQ(percentile_nearest_rank(many, 99), 197);  // rank 198 of 0..199
  EXPECT_EQ(percentile_nearest_rank(many, 50), 99);   // rank 100
  EXPECT_THROW(percentile_nearest_rank({}, 50), Error);
  EXPECT_THROW(percentile_nearest_rank({1}, 0), Error);
}

TEST(Planner, MetadataBytesFormula) {
  ASSERT_EQ(sizeof(Segment), 32u);
  // cu_seqlens + cu_seqlens_padded: 2 * 11 int32; segment table: 2 * 10 segments of 32 bytes.
  EXPECT_EQ(capacity_metadata_bytes(10), 2 * 11 * 4 + 2 * 10 * 32);
  EXPECT_EQ(capacity_metadata_bytes(1), 2 * 2 * 4 + 2 * 32);
}

TEST(Planner, PackingAlignmentIsTheLcmOf2Cp) {
  EXPECT_EQ(packing_alignment({1}), 2);
  EXPECT_EQ(packing_alignment({1, 2, 4, 8}), 16);
  EXPECT_EQ(packing_alignment({3, 4}), 24);
  EXPECT_EQ(packing_alignment({8, 3, 5}), 240);
  EXPECT_THROW(packing_alignment({}), Error);
  EXPECT_THROW(packing_alignment({2, 2}), Error);
  EXPECT_THROW(packing_alignment({0}), Error);
}

TEST(Planner, PacksInOrderAndNamesADocumentThatDoesNotFit) {
  DocumentLengths docs{"lens.txt", {5, 3, 8, 1}, {2, 3, 7, 8}};
  // Padded to 4: 8, 4, 8, 4 -> [5, 3] (12 rows), [8, 1] (12 rows).
  const DocumentBatches b = pack_documents(docs, 16, 4);
  EXPECT_EQ(b.batches, (std::vector<std::vector<int64_t>>{{5, 3}, {8, 1}}));
  EXPECT_EQ(b.lines, (std::vector<int64_t>{2, 7}));
  docs.lengths[2] = 17;
  try {
    pack_documents(docs, 16, 4);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("lens.txt':7:"), std::string::npos) << m;
    EXPECT_NE(m.find("17 tokens"), std::string::npos) << m;
    EXPECT_NE(m.find("raise tokens to at least 20"), std::string::npos) << m;
  }
  EXPECT_THROW(pack_documents(DocumentLengths{"x", {}, {}}, 16, 4), Error);
  EXPECT_THROW(pack_documents(DocumentLengths{"x", {1}, {}}, 2, 4), Error);
}

TEST(Planner, SampleFileAgreesWithBruteForce) {
  const DocumentLengths docs = read_lengths_file(THDCP_SAMPLE_LENGTHS);
  ASSERT_EQ(docs.lengths.size(), 4000u);
  const std::vector<int> cp_sizes{1, 2, 4, 8};
  const int64_t tokens = 32768;
  PlanOptions options;
  options.tokens = tokens;
  options.cp_sizes = cp_sizes;
  const DocumentBatches batches = pack_documents(docs, tokens, packing_alignment(cp_sizes));
  const CapacityPlan plan = plan_capacity(batches, options);

  const auto direct = pack_directly(docs.lengths, tokens, 16);
  ASSERT_EQ(batches.batches, direct);
  std::vector<int64_t> counts;
  for (const auto& b : direct) counts.push_back(static_cast<int64_t>(b.size()));
  const DocsPerBatch& d = plan.docs_per_batch;
  EXPECT_EQ(d.batches, static_cast<int64_t>(direct.size()));
  EXPECT_EQ(d.counts, counts);
  EXPECT_EQ(d.p50, percentile_directly(counts, 50));
  EXPECT_EQ(d.p90, percentile_directly(counts, 90));
  EXPECT_EQ(d.p99, percentile_directly(counts, 99));
  EXPECT_EQ(d.max, *std::max_element(counts.begin(), counts.end()));
  EXPECT_LT(d.p90, d.max) << "the sample should spread, or the candidates test nothing";

  ASSERT_EQ(plan.per_cp.size(), cp_sizes.size());
  for (size_t i = 0; i < cp_sizes.size(); ++i) {
    const CpPlan& p = plan.per_cp[i];
    const int64_t cp = cp_sizes[i];
    SCOPED_TRACE("cp=" + std::to_string(cp));
    ASSERT_EQ(p.cp, cp);
    int64_t valid = 0, padded = 0, longest = 0;
    for (int64_t length : docs.lengths) {
      valid += length;
      padded += length + (2 * cp - length % (2 * cp)) % (2 * cp);
      longest = std::max(longest, length);
    }
    EXPECT_EQ(p.valid_tokens, valid);
    EXPECT_EQ(p.padded_rows, padded);
    EXPECT_DOUBLE_EQ(p.padding_fraction, static_cast<double>(padded - valid) / padded);
    EXPECT_DOUBLE_EQ(p.slack_fraction, 1.0 - static_cast<double>(padded) / (static_cast<double>(direct.size()) * tokens));
    EXPECT_EQ(p.longest_document, longest);
    EXPECT_EQ(p.longest_rows_per_rank, (longest + 2 * cp - 1) / (2 * cp) * 2);

    ASSERT_EQ(p.candidates.size(), 4u);
    const int64_t real[4] = {percentile_directly(counts, 90), percentile_directly(counts, 99), d.max,
                             tokens / (2 * cp)};
    const char* labels[4] = {"P90", "P99", "max", "T/(2cp)"};
    for (int c = 0; c < 4; ++c) {
      const CapacityCandidate& cand = p.candidates[c];
      EXPECT_EQ(cand.label, labels[c]);
      EXPECT_EQ(cand.max_seqs, real[c] + 1);
      int64_t fallbacks = 0;
      for (int64_t n : counts) fallbacks += n >= cand.max_seqs ? 1 : 0;  // more than max_seqs - 1
      EXPECT_EQ(cand.fallback_batches, fallbacks);
      EXPECT_DOUBLE_EQ(cand.fallback_fraction, static_cast<double>(fallbacks) / counts.size());
      EXPECT_EQ(cand.metadata_bytes, (cand.max_seqs + 1) * 8 + cand.max_seqs * 64);
    }
    EXPECT_LE(p.candidates[0].fallback_fraction, 0.10);
    EXPECT_LE(p.candidates[1].fallback_fraction, 0.01);
    EXPECT_EQ(p.candidates[2].fallback_batches, 0);
    EXPECT_EQ(p.candidates[3].fallback_batches, 0);

    // Recommendation rule, recomputed.
    int pick = 3;
    for (int c = 0; c < 3; ++c) {
      if (p.candidates[c].fallback_fraction <= options.fallback_budget) {
        pick = c;
        break;
      }
    }
    if (pick != 3 && p.candidates[3].max_seqs <= 2 * p.candidates[pick].max_seqs) pick = 3;
    EXPECT_EQ(p.recommended, pick);
    EXPECT_NE(p.reason.find("max_seqs=" + std::to_string(p.candidates[pick].max_seqs)), std::string::npos) << p.reason;

    // Causal pairs per rank in closed form: rank r holds chunks r and 2cp-1-r of every document.
    std::vector<int64_t> rank_pairs(cp, 0);
    double busiest_sum = 0, mean_sum = 0, worst = 1.0;
    for (const auto& batch : direct) {
      std::vector<int64_t> in_batch(cp, 0);
      for (int64_t length : batch) {
        const int64_t c = (length + 2 * cp - 1) / (2 * cp);
        for (int64_t r = 0; r < cp; ++r) {
          in_batch[r] += causal_chunk_pairs(length, c, r) + causal_chunk_pairs(length, c, 2 * cp - 1 - r);
        }
      }
      int64_t total = 0, busiest = 0;
      for (int64_t r = 0; r < cp; ++r) {
        rank_pairs[r] += in_batch[r];
        total += in_batch[r];
        busiest = std::max(busiest, in_batch[r]);
      }
      busiest_sum += busiest;
      mean_sum += static_cast<double>(total) / cp;
      worst = std::max(worst, busiest / (static_cast<double>(total) / cp));
    }
    EXPECT_EQ(p.balance.rank_pairs, rank_pairs);
    int64_t total = 0;
    for (int64_t v : rank_pairs) total += v;
    EXPECT_EQ(p.balance.total_pairs, total);
    // All ranks together see every causal pair of every document once: L(L+1)/2.
    int64_t all = 0;
    for (int64_t length : docs.lengths) all += length * (length + 1) / 2;
    EXPECT_EQ(total, all);
    EXPECT_DOUBLE_EQ(p.balance.total_max_over_mean,
                     *std::max_element(rank_pairs.begin(), rank_pairs.end()) / (static_cast<double>(total) / cp));
    EXPECT_NEAR(p.balance.step_max_over_mean, busiest_sum / mean_sum, 1e-12);
    EXPECT_NEAR(p.balance.worst_batch_max_over_mean, worst, 1e-12);
    EXPECT_GE(p.balance.step_max_over_mean, p.balance.total_max_over_mean - 1e-12);
    if (cp > 1) {
      EXPECT_GT(p.balance.worst_batch_max_over_mean, 1.0);
    }
  }
}

// Pairs by enumeration: every local query row of every rank, mapped to its position with the
// dual-chunk map, against every key position of its document under the mask.
std::vector<int64_t> enumerate_rank_pairs(const std::vector<std::vector<int64_t>>& batches, int cp, const Mask& mask) {
  std::vector<int64_t> pairs(cp, 0);
  for (const auto& batch : batches) {
    for (int64_t length : batch) {
      const int64_t padded = (length + 2 * cp - 1) / (2 * cp) * (2 * cp);
      const int64_t c = dual_chunk_rows(padded, cp);
      for (int r = 0; r < cp; ++r) {
        for (int64_t j = 0; j < 2 * c; ++j) {
          const int64_t i = dual_chunk_position(j, c, cp, r);
          if (i >= length) continue;  // padding row
          for (int64_t k = 0; k < length; ++k) pairs[r] += mask.allows(i, k) ? 1 : 0;
        }
      }
    }
  }
  return pairs;
}

TEST(Planner, PairBalanceMatchesEnumeration) {
  std::mt19937 rng(5);
  for (const Mask mask : {Mask::causal(), Mask::full(), Mask::window(5, 0), Mask::window(3, 2)}) {
    for (const std::vector<int>& cp_sizes : {std::vector<int>{1, 2, 4}, std::vector<int>{3, 5}}) {
      DocumentBatches input;
      for (int b = 0; b < 6; ++b) {
        input.batches.emplace_back();
        for (int n = 0; n < 1 + static_cast<int>(rng() % 4); ++n) input.batches.back().push_back(1 + rng() % 40);
      }
      PlanOptions options;
      options.cp_sizes = cp_sizes;
      options.mask = mask;
      options.tokens = min_tokens_for(input, cp_sizes);
      const CapacityPlan plan = plan_capacity(input, options);
      for (size_t i = 0; i < cp_sizes.size(); ++i) {
        EXPECT_EQ(plan.per_cp[i].balance.rank_pairs, enumerate_rank_pairs(input.batches, cp_sizes[i], mask))
            << "cp=" << cp_sizes[i] << " window=" << mask.window_left << "," << mask.window_right;
      }
    }
  }
}

TEST(Planner, MinTokensHoldsEveryBatch) {
  DocumentBatches input{"", {{7, 1}, {30}}, {}};
  // cp=4 pads 7 -> 8, 1 -> 8, 30 -> 32; cp=3 pads 7 -> 12, 1 -> 6, 30 -> 30; lcm(8, 6) = 24.
  EXPECT_EQ(min_tokens_for(input, {4, 3}), 48);
  PlanOptions options;
  options.cp_sizes = {4, 3};
  options.tokens = 48;
  const CapacityPlan plan = plan_capacity(input, options);
  // The longest document (30) puts its padded length / cp rows on every rank.
  EXPECT_EQ(plan.per_cp[0].longest_rows_per_rank, 32 / 4);
  EXPECT_EQ(plan.per_cp[1].longest_rows_per_rank, 30 / 3);
  EXPECT_EQ(plan.per_cp[0].padded_rows, 8 + 8 + 32);
  EXPECT_DOUBLE_EQ(plan.per_cp[0].padding_fraction, 10.0 / 48.0);
  options.tokens = 24;
  EXPECT_THROW(plan_capacity(input, options), Error);
}

TEST(Planner, RejectsBadInputNamingIt) {
  DocumentBatches input{"batches.txt", {{4, 4}, {40}}, {3, 9}};
  PlanOptions options;
  options.cp_sizes = {1, 2};
  options.tokens = 32;
  try {
    plan_capacity(input, options);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("batches.txt':9:"), std::string::npos) << m;
    EXPECT_NE(m.find("raise tokens to at least 40"), std::string::npos) << m;
  }
  options.tokens = 30;  // not a multiple of 2*cp=4
  EXPECT_THROW(plan_capacity(input, options), Error);
  options.tokens = 64;
  options.cp_sizes = {};
  EXPECT_THROW(plan_capacity(input, options), Error);
  options.cp_sizes = {2};
  options.fallback_budget = 2;
  EXPECT_THROW(plan_capacity(input, options), Error);
  options.fallback_budget = 0.01;
  EXPECT_THROW(plan_capacity(DocumentBatches{}, options), Error);
  EXPECT_NO_THROW(plan_capacity(input, options));
}

// Layouts hold int32 offsets: tokens above 2^31-1 is refused before anything is sized from it
// (2^62 overflowed the metadata bytes of the T/(2cp) candidate; tests/fuzz findings, 2), and
// a batch of huge lengths is refused without its padded rows overflowing int64.
TEST(Planner, RefusesTokensAndBatchesBeyondInt32Offsets) {
  DocumentBatches input{"", {{5}}, {}};
  PlanOptions options;
  options.tokens = int64_t{1} << 62;
  test::expect_error([&] { plan_capacity(input, options); }, {"tokens=4611686018427387904", "int32", "2^31-1"});
  options.tokens = int64_t{1} << 31;
  test::expect_error([&] { plan_capacity(input, options); }, {"tokens=2147483648", "lower tokens"});
  options.tokens = (int64_t{1} << 31) - 16;
  EXPECT_NO_THROW(plan_capacity(input, options));

  const int64_t huge = int64_t{1} << 62;
  DocumentBatches huge_batch{"batches.txt", {{4}, {huge, huge}}, {1, 2}};
  test::expect_error([&] { plan_capacity(huge_batch, options); },
                     {"batches.txt':2:", "batch 1", "more than 2^31-1 rows", "split the batch"});
  test::expect_error([&] { min_tokens_for(huge_batch, {1, 2}); }, {"batches.txt':2:", "split the batch"});
  // One document of 2^31-2 tokens fits cp 1, but not CP sizes 1 and 2: batches of both are
  // multiples of 4 rows.
  const DocumentBatches longest{"", {{(int64_t{1} << 31) - 2}}, {}};
  EXPECT_EQ(min_tokens_for(longest, {1}), (int64_t{1} << 31) - 2);
  test::expect_error([&] { min_tokens_for(longest, {1, 2}); },
                     {"batch 0", "more than 2^31-1 rows", "the batch to 4", "split the batch"});

  // 2*cp of a CP size from 2^30 on does not fit an int (signed overflow in a message before;
  // tests/fuzz findings, 4): refused first, as no batch of int32 rows aligns to it.
  options.cp_sizes = {1 << 30};
  options.tokens = 64;
  test::expect_error([&] { plan_capacity(input, options); }, {"no common alignment below 2^31 rows"});

  EXPECT_EQ(capacity_metadata_bytes(int64_t{1} << 31), 2 * ((int64_t{1} << 31) + 1) * 4 + 2 * (int64_t{1} << 31) * 32);
  test::expect_error([&] { capacity_metadata_bytes((int64_t{1} << 31) + 1); }, {"max_seqs=2147483649"});
}

TEST(Planner, RecommendsTheNeverFallbackValueWhenItIsCheap) {
  // 64 rows, cp=8: T/(2cp) = 4 documents at most; the data has 1..3 per batch.
  DocumentBatches input{"", {{1}, {1, 1}, {1, 1, 1}, {1}}, {}};
  PlanOptions options;
  options.cp_sizes = {8};
  options.tokens = 64;
  const CapacityPlan plan = plan_capacity(input, options);
  const CpPlan& p = plan.per_cp[0];
  EXPECT_EQ(p.candidates[3].max_seqs, 5);
  EXPECT_EQ(p.recommended, 3);
  EXPECT_NE(p.reason.find("never falls back"), std::string::npos) << p.reason;
  // With a large T the never-fallback value is far above the data: P90/P99/max wins.
  options.tokens = 1 << 16;
  const CpPlan q = plan_capacity(input, options).per_cp[0];
  EXPECT_EQ(q.recommended, 0);  // P90 = P99 = max = 3 here, so P90+1 already never falls back
}

// --long-docs (issue 11): a document longer than a batch is split into batch-sized pieces or
// cut to one batch; both keep its line; kError leaves it for pack_documents to refuse.
TEST(Planner, LongDocumentsAreSplitOrTruncated) {
  DocumentLengths docs;
  docs.source = "lengths.txt";
  docs.lengths = {100, 40000, 16384, 16390};
  docs.lines = {1, 2, 3, 4};
  int64_t touched = -1;
  const DocumentLengths split = fit_long_documents(docs, 16384, 16, LongDocuments::kSplit, &touched);
  EXPECT_EQ(split.lengths, (std::vector<int64_t>{100, 16384, 16384, 7232, 16384, 16384, 6}));
  EXPECT_EQ(split.lines, (std::vector<int64_t>{1, 2, 2, 2, 3, 4, 4}));
  EXPECT_EQ(touched, 2);
  const DocumentLengths cut = fit_long_documents(docs, 16384, 16, LongDocuments::kTruncate, &touched);
  EXPECT_EQ(cut.lengths, (std::vector<int64_t>{100, 16384, 16384, 16384}));
  EXPECT_EQ(touched, 2);
  // With tokens not a multiple of the alignment, a piece is the largest multiple that fits.
  const DocumentLengths aligned = fit_long_documents(docs, 16390, 16, LongDocuments::kTruncate, &touched);
  EXPECT_EQ(aligned.lengths, (std::vector<int64_t>{100, 16384, 16384, 16384}));
  const DocumentLengths kept = fit_long_documents(docs, 16384, 16, LongDocuments::kError, &touched);
  EXPECT_EQ(kept.lengths, docs.lengths);
  EXPECT_EQ(touched, 0);
  EXPECT_THROW(pack_documents(kept, 16384, 16), Error);
  EXPECT_EQ(pack_documents(split, 16384, 16).batches.size(), 7u);  // [100] [16384] [16384] [7232] [16384] [16384] [6]
}

// count_packing counts what fit_long_documents and pack_documents build, for every policy,
// on random documents, tokens and alignments (long, short and repeated lengths).
TEST(Planner, CountPackingMatchesWhatPackingBuilds) {
  std::mt19937_64 rng(28);
  for (int round = 0; round < 400; ++round) {
    const int64_t alignment = int64_t{1} << (rng() % 5);
    const int64_t tokens = alignment + static_cast<int64_t>(rng() % 200);
    DocumentLengths docs;
    const int n = 1 + static_cast<int>(rng() % 30);
    for (int i = 0; i < n; ++i) {
      const int64_t kind = static_cast<int64_t>(rng() % 4);
      const int64_t length = kind == 0 ? 1 + static_cast<int64_t>(rng() % 5)
                             : kind == 1 ? 1 + static_cast<int64_t>(rng() % tokens)
                                         : 1 + static_cast<int64_t>(rng() % (5 * tokens));
      docs.lengths.push_back(length);
    }
    for (LongDocuments policy : {LongDocuments::kSplit, LongDocuments::kTruncate, LongDocuments::kError}) {
      int64_t touched = -1;
      const DocumentLengths fitted = fit_long_documents(docs, tokens, alignment, policy, &touched);
      const PackingSize size = count_packing(docs, tokens, alignment, policy);
      EXPECT_EQ(size.documents, static_cast<int64_t>(fitted.lengths.size()));
      EXPECT_EQ(size.touched, touched);
      bool fits = true;
      for (int64_t length : fitted.lengths) fits = fits && (length + alignment - 1) / alignment * alignment <= tokens;
      if (fits) {
        const DocumentBatches packed = pack_documents(fitted, tokens, alignment);
        EXPECT_EQ(size.batches, static_cast<int64_t>(packed.batches.size()))
            << "round " << round << " tokens " << tokens << " alignment " << alignment;
        // packed_batch builds one of them alone.
        const int64_t index = static_cast<int64_t>(rng() % (packed.batches.size() + 1));
        int64_t count = -1;
        const std::vector<int64_t> one = packed_batch(fitted, tokens, alignment, index, &count);
        EXPECT_EQ(count, size.batches);
        EXPECT_EQ(one, index < count ? packed.batches[static_cast<size_t>(index)] : std::vector<int64_t>{});
      } else {
        EXPECT_EQ(policy, LongDocuments::kError);
      }
    }
  }
}

// The pair balance counts each segment in closed form (segment_pairs): a batch of one
// 2^31-16-token document plans in microseconds, not the seconds a count per query row took
// (5 s for this batch in Release, far more under the sanitizers; tests/fuzz findings, 1).
// The bound is generous for a loaded machine and far below the per-row cost.
TEST(Planner, PairBalanceTakesTimePerDocumentNotPerToken) {
  const int64_t length = (int64_t{1} << 31) - 16;
  DocumentBatches input;
  input.batches = {{length}};
  PlanOptions options;
  options.tokens = length;
  const auto start = std::chrono::steady_clock::now();
  const CapacityPlan plan = plan_capacity(input, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 0.5);
  ASSERT_EQ(plan.per_cp.size(), 4u);
  for (const CpPlan& cp : plan.per_cp) EXPECT_EQ(cp.balance.total_pairs, length * (length + 1) / 2);
}

// A document of 2^31-1 tokens split for batches of 16 rows makes 2^27 pieces: counted in no
// time and no memory, so that a caller can refuse before building them (issue 28, class 1).
TEST(Planner, CountsTheSplitPiecesOfAHugeDocumentWithoutMakingThem) {
  DocumentLengths docs;
  docs.lengths = {std::numeric_limits<int32_t>::max()};
  const PackingSize size = count_packing(docs, 16, 16, LongDocuments::kSplit);
  EXPECT_EQ(size.documents, int64_t{1} << 27);
  EXPECT_EQ(size.batches, int64_t{1} << 27);
  EXPECT_EQ(size.touched, 1);
  // What packing them would hold: two lengths of 16 bytes per piece and more, billions of bytes.
  EXPECT_GT(planning_bytes(size, 0), 4.0 * (1 << 30));
  EXPECT_EQ(count_packing(docs, 16, 16, LongDocuments::kTruncate).documents, 1);
}

}  // namespace
}  // namespace thdcp
