// Problem::head_slices under all_gather on the CPU backend, which runs the orchestration the
// CUDA backend runs (allgather_steps.h: the forward gathers, reorders and attends one slice of
// heads at a time). Each head is computed alone, so every slice count gives the bits of one
// slice on every rank: out, lse, max_logit, dq, dk, dv and dsinks; and the single-device result
// within the usual tolerance. Both layouts, GQA 2 and 4, sinks, cp 2 to 4.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "support/cp_check.h"
#include "support/outputs.h"

namespace thdcp {
namespace {

struct RankResult {
  test::Outputs outputs;
  std::vector<float> dsinks;
};

std::vector<RankResult> run_ranks(const test::Batch& b, const cp::Problem& problem, const std::vector<float>& sinks) {
  AttentionOptions options;
  options.num_threads = 1;
  std::vector<RankResult> got(static_cast<size_t>(problem.cp));
  run_in_process(problem.cp, [&](Communicator& comm) {
    RankResult& mine = got[static_cast<size_t>(comm.rank())];
    mine.outputs = test::cp_plan_rank_outputs(comm, b, problem, options, sinks, &mine.dsinks);
  });
  return got;
}

// The CP problem of `b` under `layout` and `mask` on cp ranks.
cp::Problem problem_for(const test::Batch& b, int cp, CpLayout layout, const Mask& mask) {
  cp::Problem problem = test::cp_problem(cp, Capacity{b.layout.num_seqs(), b.layout.total_rows()},
                                         test::batch_shape(b, mask));
  problem.layout = layout;
  return problem;
}

using SliceCase = std::tuple<CpLayout, int /*cp*/, int /*gqa ratio*/>;

class CpAllGatherHeadSlices : public ::testing::TestWithParam<SliceCase> {};

TEST_P(CpAllGatherHeadSlices, EverySliceCountGivesTheBitsOfOne) {
  const auto [layout, cp, ratio] = GetParam();
  Rng rng(static_cast<uint64_t>(cp * 11 + ratio * 5 + static_cast<int>(layout)));
  std::vector<int64_t> lengths = test::random_lengths(rng, 5, 70);
  for (int64_t extra : {int64_t{0}, int64_t{1}, int64_t{2 * cp + 1}}) lengths.push_back(extra);
  const BatchLayout rows = layout == CpLayout::kDualChunk ? make_layout(lengths, cp) : make_contiguous_layout(lengths, cp);
  const int64_t kv_heads = 8 / ratio;
  const test::Batch b = test::make_batch(rows, DType::kBFloat16, 8, kv_heads, 16, rng.next());
  std::vector<float> sinks;
  if (ratio == 2) {
    for (int64_t h = 0; h < b.q.heads(); ++h) sinks.push_back(0.5f * static_cast<float>(h % 4) - 0.75f);
  }
  for (const Mask& mask : {Mask::causal(), Mask::window(9, 3), Mask::full()}) {
    SCOPED_TRACE(test::mask_label(mask));
    cp::Problem problem = problem_for(b, cp, layout, mask);
    const std::vector<RankResult> one = run_ranks(b, problem, sinks);
    for (int slices = 2; slices <= kv_heads; slices *= 2) {
      SCOPED_TRACE("head_slices " + std::to_string(slices));
      problem.head_slices = slices;
      const std::vector<RankResult> sliced = run_ranks(b, problem, sinks);
      for (size_t r = 0; r < one.size(); ++r) {
        SCOPED_TRACE("rank " + std::to_string(r));
        EXPECT_TRUE(test::all_written(sliced[r].outputs));
        EXPECT_TRUE(test::identical(sliced[r].outputs, one[r].outputs));
        EXPECT_TRUE(test::same_bits(sliced[r].dsinks, one[r].dsinks));
      }
      test::expect_cp_plan_matches_single_device(b, mask, problem, sinks);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Matrix, CpAllGatherHeadSlices,
                         ::testing::Combine(::testing::Values(CpLayout::kDualChunk, CpLayout::kContiguous),
                                            ::testing::Values(2, 3, 4), ::testing::Values(2, 4)),
                         [](const ::testing::TestParamInfo<SliceCase>& param_info) {
                           return std::string(cp_layout_name(std::get<0>(param_info.param))) + "_cp" +
                                  std::to_string(std::get<1>(param_info.param)) + "_gqa" +
                                  std::to_string(std::get<2>(param_info.param));
                         });

// kv_gather auto, which would take the halo for a two-sided window under the contiguous
// layout, gathers the whole K/V with slices, and gives the bits of the whole gather.
TEST(CpAllGatherHeadSlicesAuto, AutoGathersTheWholeWithSlices) {
  Rng rng(23);
  const test::Batch b = test::make_batch(make_contiguous_layout(test::random_lengths(rng, 6, 120), 4),
                                         DType::kBFloat16, 4, 2, 16, rng.next());
  cp::Problem whole = problem_for(b, 4, CpLayout::kContiguous, Mask::window(6, 2));
  whole.kv_gather = cp::KvGather::kWhole;
  cp::Problem sliced = whole;
  sliced.kv_gather = cp::KvGather::kAuto;
  sliced.head_slices = 2;
  const std::vector<RankResult> want = run_ranks(b, whole, {}), got = run_ranks(b, sliced, {});
  for (size_t r = 0; r < want.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_TRUE(test::identical(got[r].outputs, want[r].outputs));
  }
}

}  // namespace
}  // namespace thdcp
