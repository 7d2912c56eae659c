// Every CP mode of the CPU backend (layout dual_chunk or contiguous, communication all_gather
// or all_to_all) equals the single-device CPU result, forward and backward, with and without
// sinks, on the edge-case table: lengths 0, 1, not multiples of cp, one sequence filling the
// batch, windows wider than a rank's piece, full / causal / windowed masks, GQA 1/4/8, cp in
// {1, 2, 3, 4, 8}. Problems a mode cannot run are refused at plan time on every rank.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "support/cp_check.h"

namespace thdcp {
namespace {

struct Mode {
  CpLayout layout;
  cp::CpComm comm;
};

std::string mode_label(const Mode& m) { return std::string(cp_layout_name(m.layout)) + "_" + cp::cp_comm_name(m.comm); }

std::vector<Mode> all_modes() {
  return {{CpLayout::kDualChunk, cp::CpComm::kAllGather},
          {CpLayout::kContiguous, cp::CpComm::kAllGather},
          {CpLayout::kDualChunk, cp::CpComm::kAllToAll},
          {CpLayout::kContiguous, cp::CpComm::kAllToAll}};
}

// The layout of `lengths` for a mode: padded to 2*cp per document (dual chunk) or packed
// with no padding but the last document's (contiguous).
BatchLayout layout_for(const Mode& mode, const std::vector<int64_t>& lengths, int cp) {
  return mode.layout == CpLayout::kDualChunk ? make_layout(lengths, cp) : make_contiguous_layout(lengths, cp);
}

// Runs `b` under `mode` on cp in-process ranks and checks every rank against the single
// device, with sinks when `with_sinks`; every rank's dsinks must be the same bits.
void expect_mode_matches_single_device(const Mode& mode, const test::Batch& b, int cp, const Mask& mask,
                                       bool with_sinks) {
  std::vector<float> sinks;
  for (int64_t h = 0; with_sinks && h < b.q.heads(); ++h) sinks.push_back(0.75f * static_cast<float>(h % 5) - 1.0f);
  cp::Problem problem = test::cp_problem(cp, Capacity{b.layout.num_seqs(), b.layout.total_rows()},
                                         test::batch_shape(b, mask));
  problem.layout = mode.layout;
  problem.comm = mode.comm;
  test::expect_cp_plan_matches_single_device(b, mask, problem, sinks);
}

// Heads for a mode: all_to_all needs both counts to be multiples of cp.
std::pair<int64_t, int64_t> heads_for(const Mode& mode, int cp, int ratio) {
  const int64_t kv_heads = mode.comm == cp::CpComm::kAllToAll ? cp : 2;
  return {kv_heads * ratio, kv_heads};
}

using ModeCase = std::tuple<Mode, int /*cp*/, Mask>;

class CpModes : public ::testing::TestWithParam<ModeCase> {};

// A varlen batch with lengths 0, 1 and 2*cp + 1 among random ones; the GQA ratio, the dtype
// and the sinks vary with the case so that the matrix covers each of them with every mode.
TEST_P(CpModes, VarlenBatchEqualsSingleDevice) {
  const auto [mode, cp, mask] = GetParam();
  const int index = cp + (mask.window_left + 1) + 3 * (mask.window_right + 1) + static_cast<int>(mode.comm);
  const int ratio = std::vector<int>{1, 4, 8}[static_cast<size_t>(index % 3)];
  const bool with_sinks = (index / 3 + static_cast<int>(mode.layout)) % 2 == 1;
  const DType dtype = index % 2 == 0 ? DType::kBFloat16 : DType::kFloat32;
  Rng rng(static_cast<uint64_t>(index * 131 + static_cast<int>(mode.layout) * 17 + 5));
  std::vector<int64_t> lengths = test::random_lengths(rng, 4, 60);
  for (int64_t extra : {int64_t{0}, int64_t{1}, int64_t{2 * cp + 1}, int64_t{97}}) lengths.push_back(extra);
  const auto [q_heads, kv_heads] = heads_for(mode, cp, ratio);
  const test::Batch b = test::make_batch(layout_for(mode, lengths, cp), dtype, q_heads, kv_heads, 16, rng.next());
  SCOPED_TRACE("gqa " + std::to_string(ratio) + (with_sinks ? " sinks " : " no sinks ") + dtype_name(dtype));
  expect_mode_matches_single_device(mode, b, cp, mask, with_sinks);
}

std::string mode_case_name(const ::testing::TestParamInfo<ModeCase>& info) {
  const auto& [mode, cp, mask] = info.param;
  return mode_label(mode) + "_cp" + std::to_string(cp) + "_" + test::mask_label(mask);
}

INSTANTIATE_TEST_SUITE_P(Matrix, CpModes,
                         ::testing::Combine(::testing::ValuesIn(all_modes()), ::testing::Values(1, 2, 3, 4, 8),
                                            ::testing::Values(Mask::full(), Mask::causal(), Mask::window(40, 0),
                                                              Mask::window(7, 3))),
                         mode_case_name);

using LongCase = std::tuple<Mode, int /*cp*/>;
class CpModesLong : public ::testing::TestWithParam<LongCase> {};

// One sequence fills the batch; windows wider than a rank's piece (150 > 500 / cp for cp 8
// and 3's pieces cut mid-window), sinks on.
TEST_P(CpModesLong, OneSequenceFillsTheBatch) {
  const auto [mode, cp] = GetParam();
  const auto [q_heads, kv_heads] = heads_for(mode, cp, 1);
  const test::Batch b = test::make_batch(layout_for(mode, {500}, cp), DType::kBFloat16, q_heads, kv_heads, 16,
                                         static_cast<uint64_t>(cp * 3 + static_cast<int>(mode.comm)));
  for (const Mask& mask : {Mask::causal(), Mask::window(150, 0), Mask::window(20, 90)}) {
    SCOPED_TRACE(test::mask_label(mask));
    expect_mode_matches_single_device(mode, b, cp, mask, /*with_sinks=*/true);
  }
}

INSTANTIATE_TEST_SUITE_P(Long, CpModesLong, ::testing::Combine(::testing::ValuesIn(all_modes()), ::testing::Values(3, 8)),
                         [](const ::testing::TestParamInfo<LongCase>& param_info) {
                           return mode_label(std::get<0>(param_info.param)) + "_cp" + std::to_string(std::get<1>(param_info.param));
                         });

cp::Problem problem_of(int cp, int64_t rows, int64_t q_heads, int64_t kv_heads, CpLayout layout, cp::CpComm comm) {
  cp::Problem p = test::cp_problem(cp, Capacity{4, rows}, test::Shape{DType::kBFloat16, q_heads, kv_heads, 16});
  p.layout = layout;
  p.comm = comm;
  return p;
}

void expect_planned(const cp::Problem& problem) {
  for (const std::string& message : test::plan_messages(problem, problem)) EXPECT_EQ(message, "");
}

TEST(CpModesErrors, ContiguousRowsMustBeAMultipleOfCp) {
  const cp::Problem p = problem_of(4, 18, 4, 4, CpLayout::kContiguous, cp::CpComm::kAllGather);
  test::expect_every_rank_says(test::plan_messages(p, p), "capacity.max_tokens=18 is not a multiple of cp=4 (layout=contiguous");
  // 20 rows: a multiple of cp but not of 2*cp, which only the dual-chunk layout needs.
  cp::Problem fits = problem_of(4, 20, 4, 4, CpLayout::kContiguous, cp::CpComm::kAllGather);
  expect_planned(fits);
  fits.layout = CpLayout::kDualChunk;
  test::expect_every_rank_says(test::plan_messages(fits, fits), "is not a multiple of 2*cp=8 (layout=dual_chunk)");
}

TEST(CpModesErrors, AllToAllNeedsHeadsDivisibleByCp) {
  const cp::Problem kv = problem_of(4, 32, 8, 2, CpLayout::kDualChunk, cp::CpComm::kAllToAll);
  test::expect_every_rank_says(test::plan_messages(kv, kv),
                         "all_to_all with kv_heads=2 and cp=4: kv_heads must be a multiple of cp (each rank takes "
                         "kv_heads/cp heads); use comm=all_gather, or a cp that divides q_heads and kv_heads");
  const cp::Problem q = problem_of(3, 30, 6, 3, CpLayout::kContiguous, cp::CpComm::kAllToAll);
  expect_planned(q);
  const cp::Problem q4 = problem_of(4, 32, 6, 2, CpLayout::kContiguous, cp::CpComm::kAllToAll);
  test::expect_every_rank_says(test::plan_messages(q4, q4), "all_to_all with q_heads=6 and cp=4");
}

// Problem::head_slices: under all_to_all a divisor of both head counts per rank, under
// all_gather a divisor of both head counts with the whole gather; not a2a+ag; the same on
// every rank.
TEST(CpModesErrors, HeadSlicesDivideTheirHeadsUnderAllToAllAndAllGatherOnly) {
  // all_to_all slices a rank's share of the heads (8:4 over 2 ranks: 4:2), all_gather every head.
  struct Slices {
    cp::CpComm comm;
    int fits, refused;
    const char* says;
  };
  for (const Slices& c : {Slices{cp::CpComm::kAllToAll, 2, 4,
                                 "head_slices=4 with q_heads/cp=4 and kv_heads/cp=2 heads per rank: each slice "
                                 "takes as many of both; use one of 1, 2"},
                          Slices{cp::CpComm::kAllGather, 4, 3,
                                 "head_slices=3 with q_heads=8 and kv_heads=4 heads: each slice takes as many of "
                                 "both; use one of 1, 2, 4"}}) {
    SCOPED_TRACE(cp::cp_comm_name(c.comm));
    cp::Problem p = problem_of(2, 16, 8, 4, CpLayout::kDualChunk, c.comm);
    p.head_slices = c.fits;
    expect_planned(p);
    p.head_slices = c.refused;
    test::expect_every_rank_says(test::plan_messages(p, p), c.says);
    p.head_slices = 0;
    test::expect_every_rank_says(test::plan_messages(p, p), "head_slices=0 must be >= 1");
  }
  cp::Problem gather = problem_of(2, 16, 8, 4, CpLayout::kDualChunk, cp::CpComm::kAllGather);
  gather.head_slices = 2;
  gather.kv_gather = cp::KvGather::kHalo;
  test::expect_every_rank_says(test::plan_messages(gather, gather),
                               "head_slices=2 with kv_gather=halo: all_gather's slices gather the whole K/V");
  cp::Problem hybrid = problem_of(2, 16, 8, 4, CpLayout::kDualChunk, cp::CpComm::kA2aAg);
  hybrid.a2a_size = 2;
  hybrid.head_slices = 2;
  test::expect_every_rank_says(test::plan_messages(hybrid, hybrid),
                               "head_slices=2 with comm=a2a+ag: slices are all_to_all's and all_gather's; leave "
                               "head_slices=1");
  cp::Problem one = problem_of(2, 16, 8, 4, CpLayout::kDualChunk, cp::CpComm::kAllToAll), two = one;
  two.head_slices = 2;
  test::expect_every_rank_says(test::plan_messages(one, two), "rank 1 passed head_slices=2 but rank 0 passed head_slices=1");
}

TEST(CpModesErrors, RanksMustAgreeOnTheMode) {
  const cp::Problem p = problem_of(2, 16, 2, 2, CpLayout::kDualChunk, cp::CpComm::kAllGather);
  cp::Problem other = p;
  other.comm = cp::CpComm::kAllToAll;
  test::expect_every_rank_says(test::plan_messages(p, other), "rank 1 passed layout=dual_chunk comm=all_to_all but rank 0 passed "
                                                  "layout=dual_chunk comm=all_gather");
  other = p;
  other.layout = CpLayout::kContiguous;
  test::expect_every_rank_says(test::plan_messages(p, other), "rank 1 passed layout=contiguous comm=all_gather");
}

}  // namespace
}  // namespace thdcp
