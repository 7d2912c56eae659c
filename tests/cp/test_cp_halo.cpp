// Halo gathers (cp::Problem::kv_gather, issue 31) on the CPU backend: every output of a halo
// step (out, lse, max_logit, dq, dk, dv, dsinks) equals the whole gather's bit for bit, and the
// bytes the communicator moves are the plan's count (CpuPlan::kv_traffic), which is the halo
// of thdcp/plan/halo.h (tests/plan/test_halo.cpp checks it against a brute force). Both
// layouts, cp 2/3/4/8, windows narrower and wider than a rank's piece, lengths 0 and 1,
// documents across rank boundaries, GQA.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "support/cp_check.h"
#include "support/cp_halo_step.h"
#include "support/expect_error.h"
#include "thdcp/plan/halo.h"

namespace thdcp {
namespace {

using test::RankStep;

std::vector<RankStep> run_ranks(const test::Batch& b, const cp::Problem& problem, const std::vector<float>& sinks) {
  std::vector<RankStep> steps(static_cast<size_t>(problem.cp));
  run_in_process(problem.cp, [&](Communicator& comm) {
    steps[static_cast<size_t>(comm.rank())] = test::run_counted_step(comm, b, problem, sinks);
  });
  return steps;
}

// Runs `b` with kv_gather whole and halo (and auto) and checks, on every rank: identical
// outputs, every output written, bytes moved = the plan's count = the halo's rows (whole: every
// other rank's rows), auto choosing the halo exactly when it moves fewer bytes in all.
void expect_halo_equals_whole(const test::Batch& b, int cp, CpLayout layout, const Mask& mask, bool with_sinks) {
  cp::Problem problem = test::cp_problem(cp, Capacity{b.layout.num_seqs(), b.layout.total_rows()},
                                         test::batch_shape(b, mask));
  problem.layout = layout;
  std::vector<float> sinks;
  for (int64_t h = 0; with_sinks && h < b.q.heads(); ++h) sinks.push_back(0.5f * static_cast<float>(h % 3) - 0.25f);
  problem.kv_gather = cp::KvGather::kWhole;
  const std::vector<RankStep> whole = run_ranks(b, problem, sinks);
  problem.kv_gather = cp::KvGather::kHalo;
  const std::vector<RankStep> halo = run_ranks(b, problem, sinks);
  problem.kv_gather = cp::KvGather::kAuto;
  const std::vector<RankStep> automatic = run_ranks(b, problem, sinks);

  const int64_t width = b.k.heads() * (b.k.head_dim() + b.v.head_dim());
  const int64_t kv_row_bytes = width * static_cast<int64_t>(dtype_size(b.k.dtype()));
  const int64_t grad_row_bytes = width * static_cast<int64_t>(sizeof(float));
  const int64_t local_rows = b.layout.total_rows() / cp;
  int64_t halo_total = 0, whole_total = 0;
  for (int rank = 0; rank < cp; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const size_t r = static_cast<size_t>(rank);
    EXPECT_TRUE(test::all_written(whole[r].outputs));
    EXPECT_TRUE(test::identical(halo[r].outputs, whole[r].outputs));
    EXPECT_TRUE(test::same_bits(halo[r].dsinks, whole[r].dsinks));
    EXPECT_TRUE(test::identical(automatic[r].outputs, whole[r].outputs));

    // The bytes: what the communicator moved is what the plan reports.
    for (const RankStep* step : {&whole[r], &halo[r], &automatic[r]}) {
      EXPECT_EQ(step->forward_bytes, step->traffic.forward_bytes[r]);
      EXPECT_EQ(step->backward_bytes, step->traffic.backward_bytes[r]);
    }
    EXPECT_EQ(whole[r].traffic.gather, cp::KvGather::kWhole);
    EXPECT_EQ(halo[r].traffic.gather, cp::KvGather::kHalo);
    EXPECT_EQ(whole[r].forward_bytes, (cp - 1) * local_rows * kv_row_bytes);
    EXPECT_EQ(whole[r].backward_bytes, (cp - 1) * local_rows * (kv_row_bytes + grad_row_bytes));
    // ... and the halo's: this rank's halo in, the rows of the others' halos it holds back.
    const int64_t in = halo_row_count(halo_rows(b.layout.view(), cp, rank, mask, layout));
    int64_t back = 0;
    for (int other = 0; other < cp; ++other) {
      back += halo_row_count(halo_rows(b.layout.view(), cp, other, mask, layout), rank);
    }
    EXPECT_EQ(halo[r].forward_bytes, in * kv_row_bytes);
    EXPECT_EQ(halo[r].backward_bytes, in * kv_row_bytes + back * grad_row_bytes);
    halo_total += halo[r].forward_bytes;
    whole_total += whole[r].forward_bytes;
  }
  const cp::KvGather chosen = halo_total < whole_total ? cp::KvGather::kHalo : cp::KvGather::kWhole;
  for (const RankStep& step : automatic) EXPECT_EQ(step.traffic.gather, chosen);
}

using HaloCase = std::tuple<CpLayout, int /*cp*/, Mask>;
class HaloGather : public ::testing::TestWithParam<HaloCase> {};

// Random documents with lengths 0, 1 and 2*cp + 1 among them and one of 300 rows that crosses
// ranks; GQA 1/4/8, dtype and sinks varying with the case.
TEST_P(HaloGather, EqualsWholeGatherBitForBit) {
  const auto [layout, cp, mask] = GetParam();
  const int index = cp + 3 * static_cast<int>(layout) + (mask.window_left % 7) + (mask.window_right + 1);
  const int ratio = std::vector<int>{1, 4, 8}[static_cast<size_t>(index % 3)];
  const DType dtype = index % 2 == 0 ? DType::kBFloat16 : DType::kFloat32;
  const bool with_sinks = index % 4 == 1;
  Rng rng(static_cast<uint64_t>(700 + index * 31 + static_cast<int>(layout)));
  std::vector<int64_t> lengths = test::random_lengths(rng, 4, 80);
  for (int64_t extra : {int64_t{0}, int64_t{1}, int64_t{2 * cp + 1}, int64_t{300}}) lengths.push_back(extra);
  const BatchLayout batch_layout =
      layout == CpLayout::kDualChunk ? make_layout(lengths, cp) : make_contiguous_layout(lengths, cp);
  const test::Batch b = test::make_batch(batch_layout, dtype, 2 * ratio, 2, 16, rng.next());
  SCOPED_TRACE("gqa " + std::to_string(ratio) + " " + dtype_name(dtype) + (with_sinks ? " sinks" : ""));
  expect_halo_equals_whole(b, cp, layout, mask, with_sinks);
}

INSTANTIATE_TEST_SUITE_P(Matrix, HaloGather,
                         ::testing::Combine(::testing::Values(CpLayout::kDualChunk, CpLayout::kContiguous),
                                            ::testing::Values(2, 3, 4, 8),
                                            // narrower than every piece, around a piece, wider than
                                            // several, two-sided, a right side only, no left window
                                            ::testing::Values(Mask::window(3, 0), Mask::window(40, 0),
                                                              Mask::window(150, 0), Mask::window(7, 3),
                                                              Mask::window(20, 90), Mask::causal())),
                         [](const ::testing::TestParamInfo<HaloCase>& param_info) {
                           return std::string(cp_layout_name(std::get<0>(param_info.param))) + "_cp" +
                                  std::to_string(std::get<1>(param_info.param)) + "_" +
                                  test::mask_label(std::get<2>(param_info.param));
                         });

// One document fills the batch (every piece of it crosses a rank boundary): a window narrower
// than a rank's piece moves less than the whole gather and auto takes it.
TEST(HaloGatherOneDocument, NarrowWindowOverOneDocumentMovesLess) {
  for (CpLayout layout : {CpLayout::kDualChunk, CpLayout::kContiguous}) {
    const int cp = 4;
    const BatchLayout one = layout == CpLayout::kDualChunk ? make_layout({640}, cp) : make_contiguous_layout({640}, cp);
    const test::Batch b = test::make_batch(one, DType::kBFloat16, 4, 1, 16, 5);
    expect_halo_equals_whole(b, cp, layout, Mask::window(10, 0), false);
    cp::Problem problem = test::cp_problem(cp, Capacity{one.num_seqs(), one.total_rows()},
                                           test::batch_shape(b, Mask::window(10, 0)));
    problem.layout = layout;
    run_in_process(cp, [&](Communicator& comm) {
      const cp::KvTraffic traffic = cp::CpuPlan(comm, problem).kv_traffic(one.view());
      EXPECT_EQ(traffic.gather, cp::KvGather::kHalo);
      // 10 rows before each piece held elsewhere: contiguous, every piece but the first;
      // dual chunk (chunks of 80, rank r holding r and 7 - r), both chunks of ranks 1 and 2,
      // one of rank 0 (chunk 0 has none) and of rank 3 (chunk 4 follows its own chunk 3).
      const int64_t row_bytes = 2 * 16 * 2;  // a K row and a V row: 1 head of 16 bf16 each
      const bool end_rank = comm.rank() == 0 || comm.rank() == cp - 1;
      const int64_t rows = layout == CpLayout::kContiguous ? (comm.rank() == 0 ? 0 : 10) : (end_rank ? 10 : 20);
      EXPECT_EQ(traffic.forward_bytes[static_cast<size_t>(comm.rank())], rows * row_bytes) << cp_layout_name(layout);
    });
  }
}

// A full mask over one document reaches every row: the halo is the whole gather, auto keeps
// the whole gather.
TEST(HaloGatherOneDocument, FullMaskOverOneDocumentKeepsTheWholeGather) {
  const BatchLayout one = make_contiguous_layout({96}, 3);
  const test::Batch b = test::make_batch(one, DType::kFloat32, 2, 2, 16, 6);
  expect_halo_equals_whole(b, 3, CpLayout::kContiguous, Mask::full(), true);
  cp::Problem problem = test::cp_problem(3, Capacity{one.num_seqs(), one.total_rows()}, test::batch_shape(b, Mask::full()));
  problem.layout = CpLayout::kContiguous;
  run_in_process(3, [&](Communicator& comm) {
    EXPECT_EQ(cp::CpuPlan(comm, problem).kv_traffic(one.view()).gather, cp::KvGather::kWhole);
  });
}

TEST(HaloGatherErrors, RefusedWithWhatToChange) {
  cp::Problem p = test::cp_problem(2, Capacity{4, 32}, test::Shape{DType::kBFloat16, 2, 2, 16, Mask::window(4, 0)});
  p.kv_gather = cp::KvGather::kHalo;
  p.comm = cp::CpComm::kAllToAll;
  test::expect_every_rank_says(test::plan_messages(p, p),
                         "kv_gather=halo with comm=all_to_all: all_to_all moves heads, not K/V rows, so there is no "
                         "halo to gather; use kv_gather=auto or whole, or comm=all_gather");
  p.comm = cp::CpComm::kAllGather;
  p.kv_gather = static_cast<cp::KvGather>(7);
  test::expect_every_rank_says(test::plan_messages(p, p), "kv_gather=7 is not a K/V gather: use auto, whole or halo");
  p.kv_gather = cp::KvGather::kHalo;
  cp::Problem other = p;
  other.kv_gather = cp::KvGather::kWhole;
  test::expect_every_rank_says(test::plan_messages(p, other), "rank 1 passed kv_gather=whole but rank 0 passed kv_gather=halo");

  // kv_traffic: all_to_all has no gather; a layout the plan refuses is named.
  p.kv_gather = cp::KvGather::kAuto;
  p.comm = cp::CpComm::kAllToAll;
  const BatchLayout layout = make_layout({10, 7}, 2, Capacity{4, 32});
  run_in_process(2, [&](Communicator& comm) {
    EXPECT_THDCP_ERROR(cp::CpuPlan(comm, p).kv_traffic(layout.view()),
                       "kv_traffic: comm=all_to_all gathers no K/V rows");
  });
  p.comm = cp::CpComm::kAllGather;
  const BatchLayout bigger = make_layout({40}, 2);
  run_in_process(2, [&](Communicator& comm) {
    EXPECT_THDCP_ERROR(cp::CpuPlan(comm, p).kv_traffic(bigger.view()), "cu_seqlens_padded[1]=40 must equal the number of rows of the tensors, T=32");
  });
}

}  // namespace
}  // namespace thdcp
