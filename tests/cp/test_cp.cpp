// AllGather CP over the in-process communicator equals the single-device result, for
// cp in {1, 2, 3, 4, 8}, every test mask, GQA ratios 1/2/4, bf16 and fp32.
#include <gtest/gtest.h>

#include <mutex>
#include <tuple>
#include <vector>

#include "support/cp_check.h"

namespace thdcp {
namespace {

void expect_cp_matches_single_device(const test::Batch& b, int cp, const Mask& mask) {
  AttentionOptions options;
  options.num_threads = 1;
  const test::Outputs reference = test::single_device(b, mask, options);
  std::vector<::testing::AssertionResult> results(static_cast<size_t>(cp), ::testing::AssertionSuccess());
  run_in_process(cp, [&](Communicator& comm) {
    results[static_cast<size_t>(comm.rank())] = test::check_cp_rank(comm, b, mask, reference, options);
  });
  for (const auto& r : results) EXPECT_TRUE(r);
}

using CpCase = std::tuple<int /*cp*/, Mask, int /*gqa*/, DType>;

class CpEqualsSingleDevice : public ::testing::TestWithParam<CpCase> {};

TEST_P(CpEqualsSingleDevice, VarlenBatch) {
  const auto [cp, mask, ratio, dtype] = GetParam();
  Rng rng(static_cast<uint64_t>(cp * 1000003 + mask.window_left * 101 + mask.window_right * 7 + ratio * 3 +
                                static_cast<int>(dtype)));
  std::vector<int64_t> lengths = test::random_lengths(rng, 5, 300);
  for (int64_t extra : {int64_t{0}, int64_t{1}, int64_t{2 * cp + 1}}) lengths.push_back(extra);
  const test::Batch b = test::make_batch(make_layout(lengths, cp), dtype, 2 * ratio, 2, 16, rng.next());
  expect_cp_matches_single_device(b, cp, mask);
}

std::string case_name(const ::testing::TestParamInfo<CpCase>& param_info) {
  const auto& [cp, mask, ratio, dtype] = param_info.param;
  return "cp" + std::to_string(cp) + "_" + test::mask_label(mask) + "_gqa" + std::to_string(ratio) + "_" +
         dtype_name(dtype);
}

INSTANTIATE_TEST_SUITE_P(Matrix, CpEqualsSingleDevice,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 8), ::testing::ValuesIn(test::all_test_masks()),
                                            ::testing::Values(1, 2, 4),
                                            ::testing::Values(DType::kBFloat16, DType::kFloat32)),
                         case_name);

class CpLongSequence : public ::testing::TestWithParam<std::tuple<int, Mask>> {};

TEST_P(CpLongSequence, OneSequenceFillsTheBatch) {
  const auto [cp, mask] = GetParam();
  const test::Batch b = test::make_batch(make_layout({2500}, cp), DType::kBFloat16, 4, 1, 32, 77 + cp);
  expect_cp_matches_single_device(b, cp, mask);
}

INSTANTIATE_TEST_SUITE_P(Long, CpLongSequence,
                         ::testing::Combine(::testing::Values(2, 3, 8),
                                            ::testing::Values(Mask::causal(), Mask::window(1000, 0),
                                                              Mask::window(64, 200))),
                         [](const ::testing::TestParamInfo<std::tuple<int, Mask>>& param_info) {
                           return "cp" + std::to_string(std::get<0>(param_info.param)) + "_" +
                                  test::mask_label(std::get<1>(param_info.param));
                         });

TEST(CpErrors, EveryRankThrowsWhenOneRankIsWrong) {
  const BatchLayout layout = make_layout({10, 7}, 2);
  const test::Batch b = test::make_batch(layout, DType::kBFloat16, 2, 2, 16, 3);
  std::vector<std::string> messages(2);
  try {
    run_in_process(2, [&](Communicator& comm) {
      const int64_t rows = comm.rank() == 1 ? 5 : layout.total_rows() / 2;  // rank 1 passes too few rows
      HostTensor q(DType::kBFloat16, rows, 2, 16), k(DType::kBFloat16, rows, 2, 16), v(DType::kBFloat16, rows, 2, 16);
      HostTensor out(DType::kBFloat16, rows, 2, 16);
      std::vector<float> lse(static_cast<size_t>(2 * rows));
      try {
        cp::forward(comm, layout.view(), Mask::causal(), q.view(), k.view(), v.view(), out.view(), lse.data(),
                    nullptr);
      } catch (const Error& e) {
        messages[static_cast<size_t>(comm.rank())] = e.what();
        throw;
      }
    });
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q is [5, 2, 16] but must be [T/cp=10, q_heads=2, head_dim=16]"), std::string::npos)
        << e.what();
  }
  // Rank 0 was fine itself, and learnt of rank 1's error in the exchange.
  EXPECT_NE(messages[0].find("rank 1: q is [5, 2, 16]"), std::string::npos) << messages[0];
  EXPECT_NE(messages[1].find("q is [5, 2, 16]"), std::string::npos) << messages[1];
}

TEST(CpErrors, RanksMustAgreeOnLayoutAndMask) {
  const BatchLayout a = make_layout({10, 6}, 2), c = make_layout({6, 10}, 2);
  auto attempt = [&](bool differ_layout) {
    run_in_process(2, [&](Communicator& comm) {
      const BatchLayout& layout = (differ_layout && comm.rank() == 1) ? c : a;
      const Mask mask = (!differ_layout && comm.rank() == 1) ? Mask::full() : Mask::causal();
      const int64_t rows = layout.total_rows() / 2;
      HostTensor q(DType::kBFloat16, rows, 2, 16), k(DType::kBFloat16, rows, 2, 16), v(DType::kBFloat16, rows, 2, 16);
      HostTensor out(DType::kBFloat16, rows, 2, 16);
      std::vector<float> lse(static_cast<size_t>(2 * rows));
      cp::forward(comm, layout.view(), mask, q.view(), k.view(), v.view(), out.view(), lse.data(), nullptr);
    });
  };
  EXPECT_THDCP_ERROR(attempt(true), "rank 1 passed a different layout than rank 0");
  EXPECT_THDCP_ERROR(attempt(false), "rank 1 passed mask (-1,-1) but rank 0 passed (-1,0)");
}

TEST(CpErrors, MisalignedLayoutIsRejected) {
  const BatchLayout layout = make_layout({10, 6}, 1);  // padded to multiples of 2, not of 2*cp = 4
  EXPECT_THDCP_ERROR(run_in_process(2,
                                    [&](Communicator& comm) {
                                      HostTensor t(DType::kBFloat16, 8, 1, 16);
                                      std::vector<float> lse(8);
                                      cp::forward(comm, layout.view(), Mask::causal(), t.view(), t.view(), t.view(),
                                                  t.view(), lse.data(), nullptr);
                                    }),
                     "is not a multiple of 2*cp=4");
}

// A plan's message prints 2*cp in 64 bits: from cp = 2^30 on it does not fit an int (signed
// overflow under UBSan before; tests/fuzz findings, 4).
TEST(CpErrors, MessagesPrintTwiceTheLargestCp) {
  cp::Problem problem;
  problem.cp = 1 << 30;
  problem.capacity = Capacity{1, 16};
  problem.q_heads = problem.kv_heads = 1;
  problem.head_dim = 16;
  EXPECT_THDCP_ERROR(run_in_process(1, [&](Communicator& comm) { cp::CpuPlan plan(comm, problem); }),
                     "capacity.max_tokens=16 is not a multiple of 2*cp=2147483648");
}

// The CPU step set gathers k and v and casts dk and dv as contiguous rows: a strided view
// (here rows padded to 3 heads) is refused, naming it, by a plan's steps and by a one-shot
// call's agreement. Before, it was read or written as if contiguous: wrong rows, or past the
// memory of a view whose rows overlap (tests/fuzz findings, 5).
TEST(CpErrors, StridedTensorsAreRefused) {
  const BatchLayout layout = make_layout({10, 6}, 2);
  const int64_t rows = layout.total_rows() / 2;
  cp::Problem problem;
  problem.cp = 2;
  problem.capacity = Capacity{layout.num_seqs(), layout.total_rows()};
  problem.q_heads = problem.kv_heads = 2;
  problem.head_dim = 16;
  auto step = [&](bool backward, bool one_shot) {
    run_in_process(2, [&](Communicator& comm) {
      HostTensor q(DType::kBFloat16, rows, 2, 16), kv(DType::kBFloat16, rows, 2, 16);
      HostTensor out(DType::kBFloat16, rows, 2, 16), grads(DType::kBFloat16, rows, 2, 16);
      HostTensor padded(DType::kBFloat16, rows, 3, 16);
      const ThdTensor strided(padded.data(), DType::kBFloat16, rows, 2, 16, 3 * 16);
      std::vector<float> lse(static_cast<size_t>(2 * rows));
      if (!backward) {
        if (one_shot) {
          cp::forward(comm, layout.view(), Mask::causal(), q.view(), strided, kv.view(), out.view(), lse.data(),
                      nullptr);
        } else {
          cp::CpuPlan(comm, problem).forward(layout.view(), ForwardTensors{q.view(), strided, kv.view(), out.view(),
                                                                           lse.data(), nullptr});
        }
      } else if (one_shot) {
        cp::backward(comm, layout.view(), Mask::causal(), q.view(), kv.view(), kv.view(), out.view(), out.view(),
                     lse.data(), grads.view(), grads.view(), strided);
      } else {
        cp::CpuPlan(comm, problem).backward(layout.view(),
                                            BackwardTensors{q.view(), kv.view(), kv.view(), out.view(), out.view(),
                                                            lse.data(), grads.view(), grads.view(), strided});
      }
    });
  };
  EXPECT_THDCP_ERROR(step(false, false), "k is strided (row_stride=48, head_stride=0)");
  EXPECT_THDCP_ERROR(step(false, true), "k is strided");
  EXPECT_THDCP_ERROR(step(true, false), "dv is strided (row_stride=48, head_stride=0)");
  EXPECT_THDCP_ERROR(step(true, true), "dv is strided");
}

}  // namespace
}  // namespace thdcp
