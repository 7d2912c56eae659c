// MLA under AllGather CP on the CPU (issue 27): query/key head dim 192 = 128 without position
// plus 64 rotary, value head dim 128. The rotary part of q (a view of its last 64 elements per
// head) and the single shared k_pe head are rotated by the CP-aware THD RoPE on each rank's
// rows, k is [k_nope, k_pe broadcast to every head] (as Megatron's MLA builds it), then CP
// attention; against RoPE then attention on the whole batch, forward and backward.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "support/cp_check.h"
#include "thdcp/cpu/rope.h"

namespace thdcp {
namespace {

constexpr int64_t kHeads = 4, kNope = 128, kRope = 64, kQk = kNope + kRope, kV = 128;

// The rotary part of every head of q [rows, H, 192]: its last 64 elements, a strided view.
ThdTensor rotary_part(HostTensor& q) {
  ThdTensor t = q.view();
  return ThdTensor{static_cast<float*>(t.data) + kNope, DType::kFloat32, t.tokens, t.heads, kRope,
                   t.heads * kQk, kQk};
}

// k [rows, H, 192]: k_nope [rows, H, 128], then the one k_pe head [rows, 1, 64] in every head.
HostTensor mla_keys(const HostTensor& k_nope, const HostTensor& k_pe) {
  HostTensor k(DType::kFloat32, k_nope.tokens(), kHeads, kQk);
  for (int64_t row = 0; row < k.tokens(); ++row) {
    for (int64_t h = 0; h < kHeads; ++h) {
      for (int64_t d = 0; d < kNope; ++d) k.set((row * kHeads + h) * kQk + d, k_nope.get((row * kHeads + h) * kNope + d));
      for (int64_t d = 0; d < kRope; ++d) k.set((row * kHeads + h) * kQk + kNope + d, k_pe.get(row * kRope + d));
    }
  }
  return k;
}

using MlaCase = std::tuple<int /*cp*/, Mask, RopeLayout>;
class CpMla : public ::testing::TestWithParam<MlaCase> {};

TEST_P(CpMla, RopeOnTheRotaryPartThenCpAttentionEqualsTheWholeBatch) {
  const auto [cp, mask, rope_layout] = GetParam();
  const BatchLayout global = make_layout({45, 0, 1, 70, 2 * static_cast<int64_t>(cp) + 1}, cp);
  const LayoutView layout = global.view();
  const int64_t rows = global.total_rows();
  HostTensor q(DType::kFloat32, rows, kHeads, kQk), k_nope(DType::kFloat32, rows, kHeads, kNope),
      k_pe(DType::kFloat32, rows, 1, kRope), v(DType::kFloat32, rows, kHeads, kV),
      dout(DType::kFloat32, rows, kHeads, kV);
  uint64_t seed = 40 + static_cast<uint64_t>(cp);
  for (HostTensor* t : {&q, &k_nope, &k_pe, &v, &dout}) fill_normal(*t, ++seed);
  RopeConfig rope;
  rope.layout = rope_layout;
  rope.theta = 10000.0f;
  AttentionOptions options;
  options.num_threads = 1;

  // The whole batch: RoPE on q's rotary part and on k_pe, then attention (scale 1/sqrt(192)).
  HostTensor q_rot = q, k_pe_rot = k_pe;
  cpu::rope_forward(layout, 1, 0, rope, rotary_part(q_rot));
  cpu::rope_forward(layout, 1, 0, rope, k_pe_rot.view());
  test::Batch whole{global, q_rot, mla_keys(k_nope, k_pe_rot), v, dout};
  const test::Outputs want = test::single_device(whole, mask, options);

  std::vector<::testing::AssertionResult> results(static_cast<size_t>(cp), ::testing::AssertionSuccess());
  run_in_process(cp, [&](Communicator& comm) {
    const int rank = comm.rank();
    // This rank's rows; RoPE at their global positions (cp, rank), on the views as above.
    HostTensor q_local = test::local_part(q, layout, cp, rank), k_pe_local = test::local_part(k_pe, layout, cp, rank);
    cpu::rope_forward(layout, cp, rank, rope, rotary_part(q_local));
    cpu::rope_forward(layout, cp, rank, rope, k_pe_local.view());
    const HostTensor k_local = mla_keys(test::local_part(k_nope, layout, cp, rank), k_pe_local);
    const HostTensor v_local = test::local_part(v, layout, cp, rank), dout_local = test::local_part(dout, layout, cp, rank);
    cp::Problem problem;
    problem.cp = cp;
    problem.capacity = Capacity{layout.num_seqs, rows};
    problem.mask = mask;
    problem.q_heads = problem.kv_heads = kHeads;
    problem.head_dim = kQk;
    problem.v_head_dim = kV;
    problem.dtype = DType::kFloat32;
    cp::CpuPlan plan(comm, problem, options);
    test::Outputs got = test::poisoned_outputs(whole, q_local.tokens(), DType::kFloat32, DType::kFloat32);
    plan.forward(layout, ForwardTensors{q_local.view(), k_local.view(), v_local.view(), got.out.view(),
                                        got.lse.data(), got.max_logit.data()});
    plan.backward(layout, BackwardTensors{q_local.view(), k_local.view(), v_local.view(), got.out.view(),
                                          dout_local.view(), got.lse.data(), got.dq.view(), got.dk.view(),
                                          got.dv.view()});
    const test::Outputs expected = test::local_outputs(want, layout, cp, rank);
    const Tolerance tol = derive_tolerance(DType::kFloat32, Accumulate::kFloat32, 2);
    ::testing::AssertionResult r = test::matches("out", got.out, expected.out, tol);
    if (r) r = test::matches("lse", got.lse, expected.lse, tol);
    if (r) r = test::matches("dq", got.dq, expected.dq, tol);
    if (r) r = test::matches("dk", got.dk, expected.dk, tol);
    if (r) r = test::matches("dv", got.dv, expected.dv, tol);
    results[static_cast<size_t>(rank)] = r;
  });
  for (int rank = 0; rank < cp; ++rank) EXPECT_TRUE(results[static_cast<size_t>(rank)]) << "rank " << rank;
}

std::string mla_name(const ::testing::TestParamInfo<MlaCase>& info) {
  const auto& [cp, mask, rope_layout] = info.param;
  return "cp" + std::to_string(cp) + "_" + test::mask_label(mask) +
         (rope_layout == RopeLayout::kHalfSplit ? "_half_split" : "_interleaved");
}

INSTANTIATE_TEST_SUITE_P(Matrix, CpMla,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(Mask::causal(), Mask::window(9, 0)),
                                            ::testing::Values(RopeLayout::kHalfSplit, RopeLayout::kInterleaved)),
                         mla_name);

}  // namespace
}  // namespace thdcp
