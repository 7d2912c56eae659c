// Problem::reduce_dtype on the CPU backend (the reference of the CUDA one): dK/dV partial sums
// cross ranks in the problem's bf16 or fp16 (each rank's fp32 partials rounded once, the sum
// rounded once). The forward and dq keep their bits; dk and dv stay within the tolerance the
// header of thdcp/cp/cp.h derives (the storage tolerance plus 2 cp u max|ref|, a margin of 2
// for partials that cancel) and differ from the fp32 reduce-scatter's somewhere (the option
// acts); the halo's edges cross in fp32, so there the bits are the fp32 ones; a reduce dtype
// other than fp32 and the problem's is refused on every rank.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "support/cp_check.h"

namespace thdcp {
namespace {

using ReduceCase = std::tuple<CpLayout, int /*cp*/, DType>;

class CpReduceDtype : public ::testing::TestWithParam<ReduceCase> {};

std::vector<test::Outputs> run_ranks(const test::Batch& b, const cp::Problem& problem) {
  AttentionOptions options;
  options.num_threads = 1;
  std::vector<test::Outputs> got(static_cast<size_t>(problem.cp));
  run_in_process(problem.cp, [&](Communicator& comm) {
    got[static_cast<size_t>(comm.rank())] = test::cp_plan_rank_outputs(comm, b, problem, options);
  });
  return got;
}

TEST_P(CpReduceDtype, GradientsWithinTheDerivedToleranceAndTheRestUnchanged) {
  const auto [layout, cp, dtype] = GetParam();
  Rng rng(static_cast<uint64_t>(cp * 7 + static_cast<int>(dtype) * 3 + static_cast<int>(layout)));
  std::vector<int64_t> lengths = test::random_lengths(rng, 5, 90);
  lengths.push_back(0);
  lengths.push_back(2 * cp + 1);
  const BatchLayout rows = layout == CpLayout::kDualChunk ? make_layout(lengths, cp) : make_contiguous_layout(lengths, cp);
  const test::Batch b = test::make_batch(rows, dtype, 8, 2, 16, rng.next());
  const Mask mask = Mask::causal();
  cp::Problem exact = test::cp_problem(cp, Capacity{b.layout.num_seqs(), b.layout.total_rows()}, test::batch_shape(b, mask));
  exact.layout = layout;
  exact.kv_gather = cp::KvGather::kWhole;
  cp::Problem rounded = exact;
  rounded.reduce_dtype = dtype;

  AttentionOptions options;
  options.num_threads = 1;
  const test::Outputs reference = test::single_device(b, mask, options);
  const std::vector<test::Outputs> by_fp32 = run_ranks(b, exact), by_dtype = run_ranks(b, rounded);
  Tolerance grads = derive_tolerance(dtype, options.accumulate, 2);
  grads.atol_scale += 2.0 * cp * dtype_unit_roundoff(dtype);
  const bool differs = test::expect_reduced_gradients(by_dtype, by_fp32, reference, b, layout, grads);
  EXPECT_TRUE(differs) << "reduce_dtype=" << dtype_name(dtype) << " gave the fp32 reduce-scatter's bits everywhere";
}

INSTANTIATE_TEST_SUITE_P(Matrix, CpReduceDtype,
                         ::testing::Combine(::testing::Values(CpLayout::kDualChunk, CpLayout::kContiguous),
                                            ::testing::Values(2, 3, 4, 8),
                                            ::testing::Values(DType::kBFloat16, DType::kFloat16)),
                         [](const ::testing::TestParamInfo<ReduceCase>& param_info) {
                           return std::string(cp_layout_name(std::get<0>(param_info.param))) + "_cp" +
                                  std::to_string(std::get<1>(param_info.param)) + "_" +
                                  dtype_name(std::get<2>(param_info.param));
                         });

// The halo's edges cross in fp32 whatever reduce_dtype says: every output keeps its bits.
TEST(CpReduceDtypeHalo, EdgesCrossInFp32) {
  const int cp = 4;
  Rng rng(41);
  const BatchLayout rows = make_contiguous_layout(test::random_lengths(rng, 6, 120), cp);
  const test::Batch b = test::make_batch(rows, DType::kBFloat16, 4, 2, 16, rng.next());
  const Mask mask = Mask::window(24, 0);
  cp::Problem exact = test::cp_problem(cp, Capacity{b.layout.num_seqs(), b.layout.total_rows()}, test::batch_shape(b, mask));
  exact.layout = CpLayout::kContiguous;
  exact.kv_gather = cp::KvGather::kHalo;
  cp::Problem rounded = exact;
  rounded.reduce_dtype = DType::kBFloat16;
  const std::vector<test::Outputs> by_fp32 = run_ranks(b, exact), by_bf16 = run_ranks(b, rounded);
  for (int rank = 0; rank < cp; ++rank) {
    EXPECT_TRUE(test::identical(by_bf16[static_cast<size_t>(rank)], by_fp32[static_cast<size_t>(rank)])) << rank;
  }
}

TEST(CpReduceDtypeErrors, OnlyFp32OrTheProblemsDtype) {
  cp::Problem p = test::cp_problem(2, Capacity{4, 64}, test::Shape{DType::kBFloat16, 4, 2, 16});
  p.reduce_dtype = DType::kFloat16;
  test::expect_every_rank_says(test::plan_messages(p, p),
                               "reduce_dtype=fp16 with dtype=bf16: dK/dV partial sums cross ranks in fp32 (the "
                               "default, the tightest) or in the problem's dtype (half the bytes); use "
                               "reduce_dtype=fp32 or bf16");
  cp::Problem other = p;
  other.reduce_dtype = DType::kBFloat16;
  cp::Problem fp32 = other;
  fp32.reduce_dtype = DType::kFloat32;
  test::expect_every_rank_says(test::plan_messages(other, fp32), "passed reduce_dtype=fp32 but rank 0 passed "
                                                                 "reduce_dtype=bf16");
}

}  // namespace
}  // namespace thdcp
