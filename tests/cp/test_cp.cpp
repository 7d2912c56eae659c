// AllGather CP over the in-process communicator equals the single-device result, for
// cp in {1, 2, 3, 4, 8}, every test mask, GQA ratios 1/2/4, bf16 and fp32; local tensors as
// strided views equal contiguous ones bit for bit.
#include <gtest/gtest.h>

#include <mutex>
#include <tuple>
#include <vector>

#include "support/cp_check.h"
#include "support/strided_views.h"

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

// A rank's CP step on its local tensors as views of the given arrangements (q, k, v in one
// buffer, dout in another; out in one, dq, dk, dv in another), with the plan's steps or the
// one-shot calls: the outputs read back through the views, and whether nothing was written
// outside the output views or into the inputs.
struct StridedRank {
  test::Outputs outputs;
  ::testing::AssertionResult kept = ::testing::AssertionSuccess();
};

StridedRank strided_cp_step(Communicator& comm, const test::Batch& b, const Mask& mask, test::Arrangement in,
                            test::Arrangement out, DType grad_dtype, bool one_shot) {
  const LayoutView layout = b.layout.view();
  const int cp = comm.size(), rank = comm.rank();
  const HostTensor q = test::local_part(b.q, layout, cp, rank), k = test::local_part(b.k, layout, cp, rank),
                   v = test::local_part(b.v, layout, cp, rank), dout = test::local_part(b.dout, layout, cp, rank);
  const DType dtype = q.dtype();
  const int64_t rows = q.tokens(), hq = q.heads(), hkv = k.heads(), d = q.head_dim();
  const test::GroupLayout qkv_at = test::arrange(in, rows, {hq, hkv, hkv}, d), dout_at = test::arrange(in, rows, {hq}, d);
  const test::GroupLayout out_at = test::arrange(out, rows, {hq}, d), grads_at = test::arrange(out, rows, {hq, hkv, hkv}, d);
  std::vector<unsigned char> inputs = test::poisoned_image(dtype, qkv_at.elements);
  std::vector<unsigned char> dout_image = test::poisoned_image(dtype, dout_at.elements);
  std::vector<unsigned char> outputs = test::poisoned_image(dtype, out_at.elements);
  std::vector<unsigned char> grads = test::poisoned_image(grad_dtype, grads_at.elements);
  const ThdTensor qs = test::placed_view(inputs.data(), dtype, rows, hq, d, qkv_at.placements[0]);
  const ThdTensor ks = test::placed_view(inputs.data(), dtype, rows, hkv, d, qkv_at.placements[1]);
  const ThdTensor vs = test::placed_view(inputs.data(), dtype, rows, hkv, d, qkv_at.placements[2]);
  const ThdTensor douts = test::placed_view(dout_image.data(), dtype, rows, hq, d, dout_at.placements[0]);
  const ThdTensor outs = test::placed_view(outputs.data(), dtype, rows, hq, d, out_at.placements[0]);
  const ThdTensor dqs = test::placed_view(grads.data(), grad_dtype, rows, hq, d, grads_at.placements[0]);
  const ThdTensor dks = test::placed_view(grads.data(), grad_dtype, rows, hkv, d, grads_at.placements[1]);
  const ThdTensor dvs = test::placed_view(grads.data(), grad_dtype, rows, hkv, d, grads_at.placements[2]);
  test::scatter_into(q, qs);
  test::scatter_into(k, ks);
  test::scatter_into(v, vs);
  test::scatter_into(dout, douts);
  const std::vector<unsigned char> inputs_before = inputs, dout_before = dout_image;

  StridedRank r;
  r.outputs = test::poisoned_outputs(b, rows, grad_dtype, grad_dtype);
  float* lse = r.outputs.lse.data();
  if (one_shot) {
    cp::forward(comm, layout, mask, qs, ks, vs, outs, lse, r.outputs.max_logit.data());
    cp::backward(comm, layout, mask, qs, ks, vs, outs, douts, lse, dqs, dks, dvs);
  } else {
    cp::Problem problem = test::cp_problem(cp, Capacity{layout.num_seqs, layout.total_rows()},
                                           test::Shape{dtype, hq, hkv, d, mask});
    cp::CpuPlan plan(comm, problem);
    plan.forward(layout, ForwardTensors{qs, ks, vs, outs, lse, r.outputs.max_logit.data()});
    plan.backward(layout, BackwardTensors{qs, ks, vs, outs, douts, lse, dqs, dks, dvs});
  }
  r.outputs.out = test::gather_from(outs);
  r.outputs.dq = test::gather_from(dqs);
  r.outputs.dk = test::gather_from(dks);
  r.outputs.dv = test::gather_from(dvs);
  if (!test::poison_kept_outside(outputs, {outs}) || !test::poison_kept_outside(grads, {dqs, dks, dvs})) {
    r.kept = ::testing::AssertionFailure() << "rank " << rank << " wrote outside its output views";
  } else if (inputs != inputs_before || dout_image != dout_before) {
    r.kept = ::testing::AssertionFailure() << "rank " << rank << " wrote into its inputs";
  }
  return r;
}

using CpStrideParam = std::tuple<test::Arrangement /*inputs*/, test::Arrangement /*outputs*/>;

class CpStrides : public ::testing::TestWithParam<CpStrideParam> {};

// Every rank's local tensors as strided views (k and v gathered from them, dk and dv cast
// into them) give the bits of the same step on contiguous local tensors, at cp 2 and 3, GQA,
// with the plan's steps and the one-shot calls, and fp32 gradients.
TEST_P(CpStrides, LocalViewsEqualContiguousLocalTensors) {
  const auto [in, out] = GetParam();
  for (int cp : {2, 3}) {
    for (const Mask& mask : {Mask::causal(), Mask::window(9, 4)}) {
      for (bool fp32_grads : {false, true}) {
        SCOPED_TRACE("cp " + std::to_string(cp) + " " + test::mask_label(mask) + (fp32_grads ? " fp32 grads" : ""));
        const test::Batch b =
            test::make_batch(make_layout({45, 1, 0, 30}, cp), DType::kBFloat16, 8, 2, 16, 40 + static_cast<uint64_t>(cp));
        const DType grad_dtype = fp32_grads ? DType::kFloat32 : DType::kBFloat16;
        std::vector<StridedRank> contiguous(static_cast<size_t>(cp)), strided(static_cast<size_t>(cp));
        run_in_process(cp, [&](Communicator& comm) {
          const size_t rank = static_cast<size_t>(comm.rank());
          contiguous[rank] = strided_cp_step(comm, b, mask, test::Arrangement::kContiguous,
                                             test::Arrangement::kContiguous, grad_dtype, false);
          const bool one_shot = fp32_grads;  // each path once per mask
          strided[rank] = strided_cp_step(comm, b, mask, in, out, grad_dtype, one_shot);
        });
        for (int rank = 0; rank < cp; ++rank) {
          EXPECT_TRUE(test::identical(strided[rank].outputs, contiguous[rank].outputs)) << "rank " << rank;
          EXPECT_TRUE(strided[rank].kept);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Arrangements, CpStrides,
                         ::testing::Combine(::testing::ValuesIn(test::all_arrangements()),
                                            ::testing::Values(test::Arrangement::kPacked, test::Arrangement::kHeadMajor,
                                                              test::Arrangement::kInterleaved)),
                         [](const ::testing::TestParamInfo<CpStrideParam>& param_info) {
                           return std::string("inputs_") + test::arrangement_name(std::get<0>(param_info.param)) +
                                  "_outputs_" + test::arrangement_name(std::get<1>(param_info.param));
                         });

// Outputs that overlap an input are refused on every rank, naming them.
TEST(CpErrors, OverlappingOutputsAreRefused) {
  const BatchLayout layout = make_layout({10, 6}, 2);
  const int64_t rows = layout.total_rows() / 2;
  EXPECT_THDCP_ERROR(run_in_process(2,
                                    [&](Communicator& comm) {
                                      HostTensor q(DType::kBFloat16, rows, 2, 16), kv(DType::kBFloat16, rows, 2, 16);
                                      std::vector<float> lse(static_cast<size_t>(2 * rows));
                                      cp::forward(comm, layout.view(), Mask::causal(), q.view(), kv.view(), kv.view(),
                                                  kv.view(), lse.data(), nullptr);
                                    }),
                     "out and k share memory");
}

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
                                      HostTensor t(DType::kBFloat16, 8, 1, 16), out(DType::kBFloat16, 8, 1, 16);
                                      std::vector<float> lse(8);
                                      cp::forward(comm, layout.view(), Mask::causal(), t.view(), t.view(), t.view(),
                                                  out.view(), lse.data(), nullptr);
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

// A local view whose rows overlap (two heads 16 elements apart, rows 16 elements apart) is
// read in place as k, and refused as dv, naming it, by a plan's steps and by a one-shot call's
// agreement. Before strides were honoured, the step set gathered k and v and cast dk and dv
// as contiguous rows: wrong rows, or past the memory of such a view (tests/fuzz findings, 5);
// strided local views' values are CpStrides' business.
TEST(CpErrors, LocalViewsWithOverlappingRowsAreReadAsInputsAndRefusedAsOutputs) {
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
      HostTensor out(DType::kBFloat16, rows, 2, 16), dq(DType::kBFloat16, rows, 2, 16), dk(DType::kBFloat16, rows, 2, 16);
      HostTensor memory(DType::kBFloat16, rows + 1, 1, 16);
      fill_normal(memory, 5);
      const ThdTensor overlapping(memory.data(), DType::kBFloat16, rows, 2, 16, 16, 16);
      std::vector<float> lse(static_cast<size_t>(2 * rows));
      if (!backward) {
        if (one_shot) {
          cp::forward(comm, layout.view(), Mask::causal(), q.view(), overlapping, kv.view(), out.view(), lse.data(),
                      nullptr);
        } else {
          cp::CpuPlan(comm, problem).forward(layout.view(), ForwardTensors{q.view(), overlapping, kv.view(),
                                                                           out.view(), lse.data(), nullptr});
        }
      } else if (one_shot) {
        cp::backward(comm, layout.view(), Mask::causal(), q.view(), kv.view(), kv.view(), out.view(), out.view(),
                     lse.data(), dq.view(), dk.view(), overlapping);
      } else {
        cp::CpuPlan(comm, problem).backward(layout.view(),
                                            BackwardTensors{q.view(), kv.view(), kv.view(), out.view(), out.view(),
                                                            lse.data(), dq.view(), dk.view(), overlapping});
      }
    });
  };
  EXPECT_NO_THROW(step(false, false));
  EXPECT_NO_THROW(step(false, true));
  const std::string refusal = "dv is [" + std::to_string(rows) + ", 2, 16] with row_stride=16 and head_stride=16: its "
                                                                 "elements (row 1, head 0, d 0) and (row 0, head 1, "
                                                                 "d 0) share an address";
  EXPECT_THDCP_ERROR(step(true, false), refusal);
  EXPECT_THDCP_ERROR(step(true, true), refusal);
}

}  // namespace
}  // namespace thdcp
