// AllGather CP on the CPU with attention sinks and a value head dim of its own (D_v != D_qk)
// equals the single-device CPU reference, cp 1 to 4: every rank counts each query row's sink
// once, and dsinks (summed over the ranks' rows) equals the single-device one (issue 27).
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "support/cp_check.h"

namespace thdcp {
namespace {

using SinkCpCase = std::tuple<int /*cp*/, Mask, bool /*sinks*/>;
class CpSinks : public ::testing::TestWithParam<SinkCpCase> {};

TEST_P(CpSinks, EqualSingleDevice) {
  const auto [cp, mask, with_sinks] = GetParam();
  const int64_t hq = 4, dqk = 48, dv = 24;
  const test::Batch b =
      test::make_batch(make_layout({45, 0, 1, 70, 2 * static_cast<int64_t>(cp) + 1}, cp), DType::kFloat32, hq, 2,
                       dqk, static_cast<uint64_t>(cp * 7 + mask.window_left), dv);
  const LayoutView layout = b.layout.view();
  std::vector<float> sinks{1.5f, -0.5f, 8.0f, 0.25f};
  AttentionOptions options;
  options.num_threads = 1;

  // Single device.
  test::Outputs want = test::outputs_for(b, b.q.tokens(), DType::kFloat32, DType::kFloat32);
  std::vector<float> want_dsinks(hq);
  const SegmentTable table = build_segment_table(layout, mask);
  const float* s = with_sinks ? sinks.data() : nullptr;
  cpu::attention_forward(table, ForwardTensors{b.q.view(), b.k.view(), b.v.view(), want.out.view(), want.lse.data(),
                                               want.max_logit.data(), s},
                         options);
  BackwardTensors wb{b.q.view(),  b.k.view(),          b.v.view(),  want.out.view(), b.dout.view(),
                     want.lse.data(), want.dq.view(), want.dk.view(), want.dv.view()};
  wb.sinks = s;
  wb.dsinks = with_sinks ? want_dsinks.data() : nullptr;
  cpu::attention_backward(table, wb, options);

  std::vector<::testing::AssertionResult> results(static_cast<size_t>(cp), ::testing::AssertionSuccess());
  std::vector<std::vector<float>> dsinks(static_cast<size_t>(cp), std::vector<float>(hq, NAN));
  run_in_process(cp, [&](Communicator& comm) {
    const int rank = comm.rank();
    cp::Problem problem;
    problem.cp = cp;
    problem.capacity = Capacity{layout.num_seqs, layout.total_rows()};
    problem.mask = mask;
    problem.q_heads = hq;
    problem.kv_heads = 2;
    problem.head_dim = dqk;
    problem.v_head_dim = dv;
    problem.dtype = DType::kFloat32;
    cp::CpuPlan plan(comm, problem, options);
    const HostTensor q = test::local_part(b.q, layout, cp, rank), k = test::local_part(b.k, layout, cp, rank),
                     v = test::local_part(b.v, layout, cp, rank), dout = test::local_part(b.dout, layout, cp, rank);
    test::Outputs got = test::poisoned_outputs(b, q.tokens(), DType::kFloat32, DType::kFloat32);
    plan.forward(layout, ForwardTensors{q.view(), k.view(), v.view(), got.out.view(), got.lse.data(),
                                        got.max_logit.data(), s});
    BackwardTensors t{q.view(), k.view(), v.view(), got.out.view(), dout.view(), got.lse.data(),
                      got.dq.view(), got.dk.view(), got.dv.view()};
    t.sinks = s;
    t.dsinks = with_sinks ? dsinks[static_cast<size_t>(rank)].data() : nullptr;
    plan.backward(layout, t);
    const test::Outputs expected = test::local_outputs(want, layout, cp, rank);
    const Tolerance tol = derive_tolerance(DType::kFloat32, Accumulate::kFloat32, 2);
    ::testing::AssertionResult r = ::testing::AssertionSuccess();
    for (auto [name, a, e] : {std::make_tuple("out", &got.out, &expected.out), std::make_tuple("dq", &got.dq, &expected.dq),
                              std::make_tuple("dk", &got.dk, &expected.dk), std::make_tuple("dv", &got.dv, &expected.dv)}) {
      if (r) r = test::matches(name, *a, *e, tol);
    }
    if (r) r = test::matches("lse", got.lse, expected.lse, tol);
    if (r) r = test::matches("max_logit", got.max_logit, expected.max_logit, tol);
    results[static_cast<size_t>(rank)] = r;
  });
  for (const auto& r : results) EXPECT_TRUE(r);
  if (with_sinks) {
    const Tolerance tol = derive_tolerance(DType::kFloat32, Accumulate::kFloat32, 2);
    for (int r = 0; r < cp; ++r) {
      EXPECT_TRUE(test::matches("dsinks", dsinks[static_cast<size_t>(r)], want_dsinks, tol)) << "rank " << r;
      EXPECT_TRUE(test::same_bits(dsinks[static_cast<size_t>(r)], dsinks[0])) << "rank " << r;
    }
  }
}

std::string sink_cp_name(const ::testing::TestParamInfo<SinkCpCase>& info) {
  const auto& [cp, mask, with_sinks] = info.param;
  return "cp" + std::to_string(cp) + "_" + test::mask_label(mask) + (with_sinks ? "_sinks" : "_nosinks");
}

INSTANTIATE_TEST_SUITE_P(Matrix, CpSinks,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(Mask::causal(), Mask::full(), Mask::window(9, 0)),
                                            ::testing::Bool()),
                         sink_cp_name);

}  // namespace
}  // namespace thdcp
