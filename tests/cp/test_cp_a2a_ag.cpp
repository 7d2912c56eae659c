// a2a+ag CP (cp::CpComm::kA2aAg, issue 31) on the CPU backend: an all-to-all inside groups of
// a2a_size consecutive ranks, AllGather CP across the cp / a2a_size groups.
//  - Against the single-device CPU result (fp32 tolerance of the dtype), forward and backward
//    with and without sinks, both layouts, cp 4 (2x2), 6 (2x3, 3x2), 8 (2x4, 4x2), on the
//    edge-case table: lengths 0, 1, 2cp+1 (not a multiple of cp), one sequence filling the
//    batch, windows wider than a rank's piece, full / causal / windowed masks, GQA 1/4/8.
//  - Bit for bit: a2a_size 1 equals all_gather and a2a_size cp equals all_to_all on every rank
//    (out, lse, max_logit, dq, dk, dv, dsinks), and the halo gather across the groups equals
//    the whole one.
//  - Refusals at plan time, on every rank: group sizes that do not multiply to cp, heads that
//    a2a_size does not divide (naming the values and the a2a_sizes that would do), a2a_size
//    with another comm, ranks that disagree on a2a_size.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "support/cp_check.h"
#include "support/cp_halo_step.h"

namespace thdcp {
namespace {

BatchLayout layout_for(CpLayout layout, const std::vector<int64_t>& lengths, int cp) {
  return layout == CpLayout::kDualChunk ? make_layout(lengths, cp) : make_contiguous_layout(lengths, cp);
}

std::vector<float> sinks_for(int64_t q_heads) {
  std::vector<float> sinks;
  for (int64_t h = 0; h < q_heads; ++h) sinks.push_back(0.75f * static_cast<float>(h % 5) - 1.0f);
  return sinks;
}

cp::Problem a2a_ag_problem(const test::Batch& b, int cp, int a2a_size, CpLayout layout, const Mask& mask) {
  cp::Problem problem =
      test::cp_problem(cp, Capacity{b.layout.num_seqs(), b.layout.total_rows()}, test::batch_shape(b, mask));
  problem.layout = layout;
  problem.comm = cp::CpComm::kA2aAg;
  problem.a2a_size = a2a_size;
  return problem;
}

// Every rank of a2a+ag against the rows of the single-device result it owns; dsinks the same
// bits on every rank.
void expect_matches_single_device(const test::Batch& b, int cp, int a2a_size, CpLayout layout, const Mask& mask,
                                  bool with_sinks) {
  test::expect_cp_plan_matches_single_device(b, mask, a2a_ag_problem(b, cp, a2a_size, layout, mask),
                                             with_sinks ? sinks_for(b.q.heads()) : std::vector<float>{});
}

using Factors = std::pair<int, int>;  // (cp, a2a_size)
using MatrixCase = std::tuple<Factors, CpLayout, Mask>;

class A2aAg : public ::testing::TestWithParam<MatrixCase> {};

// A varlen batch with lengths 0, 1, 2cp+1 and 97 among random ones; the GQA ratio, dtype and
// sinks vary with the case.
TEST_P(A2aAg, VarlenBatchEqualsSingleDevice) {
  const auto [factors, layout, mask] = GetParam();
  const auto [cp, a2a_size] = factors;
  const int index = cp + a2a_size + (mask.window_left + 1) + 3 * (mask.window_right + 1) + static_cast<int>(layout);
  const int ratio = std::vector<int>{1, 4, 8}[static_cast<size_t>(index % 3)];
  const bool with_sinks = (index / 3) % 2 == 1;
  const DType dtype = index % 2 == 0 ? DType::kBFloat16 : DType::kFloat32;
  Rng rng(static_cast<uint64_t>(index * 131 + a2a_size * 17 + 3));
  std::vector<int64_t> lengths = test::random_lengths(rng, 4, 60);
  for (int64_t extra : {int64_t{0}, int64_t{1}, int64_t{2 * cp + 1}, int64_t{97}}) lengths.push_back(extra);
  const test::Batch b =
      test::make_batch(layout_for(layout, lengths, cp), dtype, a2a_size * ratio, a2a_size, 16, rng.next());
  SCOPED_TRACE("gqa " + std::to_string(ratio) + (with_sinks ? " sinks " : " no sinks ") + dtype_name(dtype));
  expect_matches_single_device(b, cp, a2a_size, layout, mask, with_sinks);
}

std::string factors_label(const Factors& f) {
  return "cp" + std::to_string(f.first) + "_a2a" + std::to_string(f.second) + "x" + std::to_string(f.first / f.second);
}

const std::vector<Factors> kFactors = {{4, 2}, {6, 2}, {6, 3}, {8, 2}, {8, 4}};

std::string matrix_case_name(const ::testing::TestParamInfo<MatrixCase>& param_info) {
  const auto& [factors, layout, mask] = param_info.param;
  return factors_label(factors) + "_" + cp_layout_name(layout) + "_" + test::mask_label(mask);
}

INSTANTIATE_TEST_SUITE_P(Matrix, A2aAg,
                         ::testing::Combine(::testing::ValuesIn(kFactors),
                                            ::testing::Values(CpLayout::kDualChunk, CpLayout::kContiguous),
                                            ::testing::Values(Mask::full(), Mask::causal(), Mask::window(40, 0),
                                                              Mask::window(7, 3))),
                         matrix_case_name);

// One sequence fills the batch; windows wider than a rank's piece and than a group's; sinks on.
TEST(A2aAgLong, OneSequenceFillsTheBatch) {
  for (const Factors& factors : {Factors{6, 3}, Factors{8, 2}}) {
    for (CpLayout layout : {CpLayout::kDualChunk, CpLayout::kContiguous}) {
      const auto [cp, a2a_size] = factors;
      SCOPED_TRACE(factors_label(factors) + " " + cp_layout_name(layout));
      const test::Batch b = test::make_batch(layout_for(layout, {500}, cp), DType::kBFloat16, 2 * a2a_size, a2a_size,
                                             16, static_cast<uint64_t>(cp * 3 + a2a_size));
      for (const Mask& mask : {Mask::causal(), Mask::window(150, 0), Mask::window(20, 90)}) {
        SCOPED_TRACE(test::mask_label(mask));
        expect_matches_single_device(b, cp, a2a_size, layout, mask, /*with_sinks=*/true);
      }
    }
  }
}

std::vector<test::RankStep> run_ranks(const test::Batch& b, const cp::Problem& problem,
                                      const std::vector<float>& sinks) {
  std::vector<test::RankStep> steps(static_cast<size_t>(problem.cp));
  run_in_process(problem.cp, [&](Communicator& comm) {
    steps[static_cast<size_t>(comm.rank())] = test::run_counted_step(comm, b, problem, sinks);
  });
  return steps;
}

void expect_same_bits(const std::vector<test::RankStep>& got, const std::vector<test::RankStep>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < got.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_TRUE(test::all_written(got[r].outputs));
    EXPECT_TRUE(test::identical(got[r].outputs, want[r].outputs));
    EXPECT_TRUE(test::same_bits(got[r].dsinks, want[r].dsinks));
  }
}

// a2a_size 1 is all_gather and a2a_size cp is all_to_all, with the same arithmetic in the
// same order: the same bits on every rank (and with kv_gather halo across the groups, the
// whole gather's). bf16 inputs, so that a difference in rounding would show.
TEST(A2aAgDegenerate, EqualsAllGatherAndAllToAllBitForBit) {
  for (int cp : {4, 6}) {
    for (CpLayout layout : {CpLayout::kDualChunk, CpLayout::kContiguous}) {
      for (const Mask& mask : {Mask::causal(), Mask::window(7, 3), Mask::full()}) {
        SCOPED_TRACE("cp " + std::to_string(cp) + " " + cp_layout_name(layout) + " " + test::mask_label(mask));
        Rng rng(static_cast<uint64_t>(cp * 11 + static_cast<int>(layout)));
        std::vector<int64_t> lengths = test::random_lengths(rng, 4, 60);
        for (int64_t extra : {int64_t{0}, int64_t{1}, int64_t{2 * cp + 1}}) lengths.push_back(extra);
        const test::Batch b =
            test::make_batch(layout_for(layout, lengths, cp), DType::kBFloat16, 4 * cp, cp, 16, rng.next());
        const std::vector<float> sinks = sinks_for(b.q.heads());
        cp::Problem problem = a2a_ag_problem(b, cp, 1, layout, mask);
        const std::vector<test::RankStep> one = run_ranks(b, problem, sinks);
        problem.a2a_size = cp;
        const std::vector<test::RankStep> all = run_ranks(b, problem, sinks);
        problem.comm = cp::CpComm::kAllGather;
        problem.a2a_size = 1;
        expect_same_bits(one, run_ranks(b, problem, sinks));
        problem.comm = cp::CpComm::kAllToAll;
        expect_same_bits(all, run_ranks(b, problem, sinks));

        // 2 x cp/2: the halo across the groups equals the whole gather.
        problem = a2a_ag_problem(b, cp, 2, layout, mask);
        problem.kv_gather = cp::KvGather::kWhole;
        const std::vector<test::RankStep> whole = run_ranks(b, problem, sinks);
        problem.kv_gather = cp::KvGather::kHalo;
        const std::vector<test::RankStep> halo = run_ranks(b, problem, sinks);
        expect_same_bits(halo, whole);
        EXPECT_EQ(whole[0].traffic.gather, cp::KvGather::kWhole);
        EXPECT_EQ(halo[0].traffic.gather, cp::KvGather::kHalo);
      }
    }
  }
}

cp::Problem problem_of(int cp, int a2a_size, int64_t q_heads, int64_t kv_heads) {
  cp::Problem p = test::cp_problem(cp, Capacity{4, 16 * cp}, test::Shape{DType::kBFloat16, q_heads, kv_heads, 16});
  p.comm = cp::CpComm::kA2aAg;
  p.a2a_size = a2a_size;
  return p;
}

TEST(A2aAgErrors, GroupSizesMustMultiplyToCp) {
  for (int a2a_size : {3, 0, 8, -2}) {
    const cp::Problem p = problem_of(4, a2a_size, 8, 8);
    test::expect_every_rank_says(test::plan_messages(p, p), "a2a+ag with a2a_size=" + std::to_string(a2a_size) +
                                                    " and cp=4: the group sizes do not multiply to cp (cp = a2a_size "
                                                    "* ag_size ranks); use an a2a_size that divides cp: {1, 2, 4}");
  }
  const cp::Problem fits = problem_of(6, 3, 6, 3);
  for (const std::string& message : test::plan_messages(fits, fits)) EXPECT_EQ(message, "");
}

TEST(A2aAgErrors, HeadsMustBeMultiplesOfA2aSize) {
  const cp::Problem kv = problem_of(8, 4, 8, 2);
  test::expect_every_rank_says(test::plan_messages(kv, kv),
                         "a2a+ag with kv_heads=2 and a2a_size=4: kv_heads must be a multiple of a2a_size (each rank of "
                         "an all-to-all group takes kv_heads/a2a_size heads); use an a2a_size that divides cp=8, "
                         "q_heads=8 and kv_heads=2: {1, 2}, or comm=all_gather");
  const cp::Problem q = problem_of(6, 3, 4, 1);
  test::expect_every_rank_says(test::plan_messages(q, q), "a2a+ag with q_heads=4 and a2a_size=3");
}

TEST(A2aAgErrors, A2aSizeBelongsToA2aAgAndRanksAgreeOnIt) {
  cp::Problem p = problem_of(4, 2, 4, 4);
  p.comm = cp::CpComm::kAllGather;
  test::expect_every_rank_says(test::plan_messages(p, p), "a2a_size=2 with comm=all_gather: a2a_size is the all-to-all group of "
                                              "comm=a2a+ag; use comm=a2a+ag, or leave a2a_size=1");
  p = problem_of(4, 2, 4, 4);
  cp::Problem other = p;
  other.a2a_size = 4;
  test::expect_every_rank_says(test::plan_messages(p, other), "rank 1 passed a2a_size=4 but rank 0 passed a2a_size=2");
  other = p;
  other.comm = cp::CpComm::kAllToAll;
  other.a2a_size = 1;
  test::expect_every_rank_says(test::plan_messages(p, other), "rank 1 passed layout=dual_chunk comm=all_to_all but rank 0 passed "
                                                  "layout=dual_chunk comm=a2a+ag");
}

}  // namespace
}  // namespace thdcp
