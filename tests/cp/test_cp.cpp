// AllGather CP over the in-process communicator equals the single-device result, for
// cp in {1, 2, 3, 4, 8}, every test mask, GQA ratios 1/2/4, bf16 and fp32.
#include <gtest/gtest.h>

#include <mutex>
#include <tuple>
#include <vector>

#include "cp/allgather_steps.h"
#include "support/cp_check.h"

namespace thdcp {
namespace {

void expect_cp_matches_single_device(const test::Batch& b, int cp, const Mask& mask) {
  AttentionOptions options;
  options.num_threads = 1;
  const test::GlobalResult reference = test::single_device(b, mask, options);
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
    EXPECT_NE(std::string(e.what()).find("q has 5 rows but this rank holds T/cp=10 rows"), std::string::npos)
        << e.what();
  }
  // Rank 0 was fine itself, and learnt of rank 1's error in the exchange.
  EXPECT_NE(messages[0].find("rank 1: q has 5 rows"), std::string::npos) << messages[0];
  EXPECT_NE(messages[1].find("q has 5 rows"), std::string::npos) << messages[1];
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

// head_groups is checked with the problem: a divisor of kv_heads, at most kMaxHeadGroups.
TEST(CpErrors, HeadGroupsAreChecked) {
  cp::Problem p;
  p.cp = 2;
  p.capacity = Capacity{4, 64};
  p.q_heads = 8;
  p.kv_heads = 2;
  p.head_dim = 16;
  EXPECT_EQ(p.head_groups, 1);
  for (int bad : {-1, 0, 3, 4}) {
    p.head_groups = bad;
    EXPECT_THDCP_ERROR(run_in_process(2, [&](Communicator& comm) { cp::CpuPlan plan(comm, p, {}); }),
                       "head_groups=" + std::to_string(bad) + " with kv_heads=2: use a divisor of kv_heads");
  }
  p.head_groups = 2;  // the CPU backend accepts it and runs every head at once
  run_in_process(2, [&](Communicator& comm) { cp::CpuPlan plan(comm, p, {}); });
}

// The views of a head group (the CP algorithm's split of the heads) address exactly that
// group's heads of every row, for contiguous tensors and for views of a wider buffer.
TEST(CpHeadGroups, ViewsAddressTheirHeads) {
  const int64_t rows = 3, dim = 4;
  HostTensor buffer(DType::kFloat32, rows, 12, dim);  // e.g. a packed QKV buffer: 12 heads a row
  for (int64_t i = 0; i < buffer.numel(); ++i) buffer.set(i, static_cast<float>(i));
  auto at = [&](const ThdTensor& t, int64_t r, int64_t h, int64_t d) {
    return static_cast<const float*>(t.data)[r * t.row_step() + h * t.head_step() + d];
  };
  auto expected = [&](int64_t r, int64_t h, int64_t d) { return static_cast<float>((r * 12 + h) * dim + d); };

  // Contiguous: all 12 heads, 3 groups of 4.
  const ThdTensor whole = buffer.view();
  for (int g = 0; g < 3; ++g) {
    const ThdTensor group = cp::detail::head_group(whole, g, 3);
    EXPECT_EQ(group.heads, 4);
    EXPECT_FALSE(group.contiguous());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t h = 0; h < 4; ++h) {
        for (int64_t d = 0; d < dim; ++d) EXPECT_EQ(at(group, r, h, d), expected(r, g * 4 + h, d));
      }
    }
  }
  EXPECT_TRUE(cp::detail::head_group(whole, 0, 1).contiguous());

  // A view of heads 4..11 (row_stride 12 heads), const, 4 groups of 2: group 3 is heads 10, 11.
  const ConstThdTensor kv(static_cast<const float*>(buffer.data()) + 4 * dim, DType::kFloat32, rows, 8, dim,
                          12 * dim, 0);
  const ConstThdTensor group = cp::detail::head_group(kv, 3, 4);
  EXPECT_EQ(group.heads, 2);
  EXPECT_EQ(group.row_step(), 12 * dim);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t d = 0; d < dim; ++d) {
        EXPECT_EQ(static_cast<const float*>(group.data)[r * group.row_step() + h * group.head_step() + d],
                  expected(r, 10 + h, d));
      }
    }
  }

  // [Hq, rows] per-head arrays (lse): group g starts at row g * Hq/G; absent stays absent.
  std::vector<float> lse(8 * 5);
  EXPECT_EQ(cp::detail::head_group_rows(lse.data(), 5, 8, 2, 4), lse.data() + 2 * 2 * 5);
  EXPECT_EQ(cp::detail::head_group_rows(static_cast<float*>(nullptr), 5, 8, 2, 4), nullptr);
}

}  // namespace
}  // namespace thdcp
