// AllGather CP through the C ABI, CPU backend: an in-process group whose ranks are threads of
// the test, each splitting the global tensors with thdcp_cp_split, running a CP plan, and
// merging its rows back with thdcp_cp_merge; the merged result equals the single-device
// C ABI result within the tolerance of a sum in another order (as tests/cp does). With a value
// head dim of its own and attention sinks (thdcp_cp_forward_ex / _backward_ex) too: dsinks, the
// same bits on every rank, within that tolerance of the single device's (issue 27).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "support/capi/capi_support.h"
#include "support/outputs.h"
#include "support/random_batch.h"
#include "thdcp/plan/rank_split.h"
#include "thdcp/thdcp.h"

namespace thdcp {
namespace {

using test::c_layout;
using test::c_local_rows;
using test::c_tensor;
using test::Outputs;

// Attention sinks of a case: none, or one logit per query head (with room for their gradient).
struct Sinks {
  std::vector<float> sinks, dsinks;
  thdcp_attention_extras extras(bool backward) {
    thdcp_attention_extras e = THDCP_ATTENTION_EXTRAS_INIT;
    e.sinks = sinks.empty() ? nullptr : sinks.data();
    e.dsinks = backward && !sinks.empty() ? dsinks.data() : nullptr;
    return e;
  }
};

Sinks sinks_for(int64_t q_heads, bool with_sinks) {
  Sinks s;
  for (int64_t h = 0; with_sinks && h < q_heads; ++h) s.sinks.push_back(1.5f * std::cos(static_cast<float>(h)));
  s.dsinks.assign(s.sinks.size(), std::nanf(""));
  return s;
}

// The whole batch through a single-device plan (thdcp_attention_forward_ex / _backward_ex).
Outputs single_device(const test::Batch& b, const Mask& mask, Sinks& s) {
  Outputs r = test::poisoned_outputs(b, b.q.tokens(), b.q.dtype(), b.k.dtype());
  thdcp_attention_params p;
  thdcp_attention_params_init(&p);
  test::set_shape(p, test::batch_shape(b, mask), Capacity{b.layout.num_seqs(), b.q.tokens()});
  p.v_head_dim = b.v.head_dim();
  p.num_threads = 1;
  thdcp_attention_plan_t plan = nullptr;
  EXPECT_C_OK(thdcp_attention_plan_create(&p, nullptr, 0, &plan));
  const thdcp_layout_t layout = c_layout(b.layout);
  const thdcp_tensor_t q = c_tensor(b.q), k = c_tensor(b.k), v = c_tensor(b.v), dout = c_tensor(b.dout);
  const thdcp_tensor_t out = c_tensor(r.out), dq = c_tensor(r.dq), dk = c_tensor(r.dk), dv = c_tensor(r.dv);
  const thdcp_attention_extras forward = s.extras(false), backward = s.extras(true);
  EXPECT_C_OK(thdcp_attention_forward_ex(plan, &layout, &q, &k, &v, &out, r.lse.data(), r.max_logit.data(), &forward,
                                         nullptr));
  EXPECT_C_OK(thdcp_attention_backward_ex(plan, &layout, &q, &k, &v, &out, &dout, r.lse.data(), &dq, &dk, &dv,
                                          &backward, nullptr));
  EXPECT_C_OK(thdcp_attention_plan_destroy(plan));
  return r;
}

// One rank: split, plan, forward, backward, merge its rows into `merged` (disjoint rows per
// rank, so the ranks write it at the same time without a race).
// `s`: the rank's own sinks and dsinks (every rank passes the same sinks).
void run_rank(thdcp_communicator_t comm, const test::Batch& b, const Mask& mask, int cp, Sinks s, Outputs& merged,
              std::vector<float>& rank_dsinks) {
  int rank = -1;
  EXPECT_C_OK(thdcp_communicator_rank(comm, &rank));
  const thdcp_layout_t layout = c_layout(b.layout);
  const int64_t rows = b.q.tokens(), local_rows = rows / cp;
  const HostTensor q = c_local_rows(b.q, layout, cp, rank), k = c_local_rows(b.k, layout, cp, rank),
                   v = c_local_rows(b.v, layout, cp, rank), dout = c_local_rows(b.dout, layout, cp, rank);
  Outputs local = test::poisoned_outputs(b, local_rows, b.q.dtype(), b.k.dtype());

  thdcp_cp_params p;
  thdcp_cp_params_init(&p);
  p.cp_size = cp;
  // Fewer sequences than the capacity.
  test::set_shape(p, test::batch_shape(b, mask), Capacity{b.layout.num_seqs() + 2, rows});
  p.v_head_dim = b.v.head_dim() == b.q.head_dim() ? 0 : b.v.head_dim();
  p.num_threads = 1;
  size_t workspace = 1;
  EXPECT_C_OK(thdcp_cp_plan_workspace_size(&p, &workspace));
  EXPECT_EQ(workspace, 0u);
  thdcp_cp_plan_t plan = nullptr;
  ASSERT_C_OK(thdcp_cp_plan_create(comm, &p, nullptr, 0, &plan));
  const thdcp_tensor_t cq = c_tensor(q), ck = c_tensor(k), cv = c_tensor(v), cdout = c_tensor(dout);
  const thdcp_tensor_t out = c_tensor(local.out), dq = c_tensor(local.dq), dk = c_tensor(local.dk),
                       dv = c_tensor(local.dv);
  const thdcp_attention_extras forward = s.extras(false), backward = s.extras(true);
  EXPECT_C_OK(thdcp_cp_forward_ex(plan, &layout, &cq, &ck, &cv, &out, local.lse.data(), local.max_logit.data(),
                                  &forward, nullptr));
  EXPECT_C_OK(thdcp_cp_backward_ex(plan, &layout, &cq, &ck, &cv, &out, &cdout, local.lse.data(), &dq, &dk, &dv,
                                   &backward, nullptr));
  EXPECT_C_OK(thdcp_cp_plan_destroy(plan));
  rank_dsinks = s.dsinks;

  test::c_merge_rows(local, merged, layout, cp, rank);
  if (rank == 0) merged.max_logit = local.max_logit;  // the same on every rank (max-reduced)

  // thdcp_cp_local_rows is the map the C++ split uses.
  std::vector<int32_t> global_rows(static_cast<size_t>(local_rows), -1);
  EXPECT_C_OK(thdcp_cp_local_rows(&layout, cp, rank, global_rows.data(), local_rows));
  EXPECT_EQ(global_rows, rank_row_map(b.layout.view(), cp, rank));
}

using Case = std::tuple<int /*cp*/, Mask, int /*q_heads*/, int /*kv_heads*/, DType, int /*D_v*/, bool /*sinks*/>;

class CApiCpEqualsSingleDevice : public ::testing::TestWithParam<Case> {};

TEST_P(CApiCpEqualsSingleDevice, InProcessGroupOfThreads) {
  const auto& [cp, mask, q_heads, kv_heads, dtype, v_head_dim, with_sinks] = GetParam();
  // An empty document, one of length 1 and lengths that are not multiples of 2*cp.
  const test::Batch b = test::make_batch(make_layout({37, 0, 64, 1, 90, 13}, cp), dtype, q_heads, kv_heads, 16,
                                         100 + cp + q_heads, v_head_dim);
  Sinks reference_sinks = sinks_for(q_heads, with_sinks);
  const Outputs reference = single_device(b, mask, reference_sinks);

  std::vector<thdcp_communicator_t> comms(static_cast<size_t>(cp), nullptr);
  ASSERT_C_OK(thdcp_communicator_create_in_process_group(cp, comms.data()));
  Outputs merged = test::poisoned_outputs(b, b.q.tokens(), b.q.dtype(), b.k.dtype());
  std::vector<std::vector<float>> rank_dsinks(static_cast<size_t>(cp));
  std::vector<std::thread> ranks;
  for (int r = 0; r < cp; ++r) {
    ranks.emplace_back([&, r] {
      run_rank(comms[static_cast<size_t>(r)], b, mask, cp, sinks_for(q_heads, with_sinks), merged,
               rank_dsinks[static_cast<size_t>(r)]);
    });
  }
  for (auto& t : ranks) t.join();
  for (thdcp_communicator_t c : comms) EXPECT_C_OK(thdcp_communicator_destroy(c));

  // Both sides round to storage once after fp32 arithmetic; dK/dV are summed in another
  // order (per rank, then across ranks).
  const Tolerance storage = derive_tolerance(dtype, Accumulate::kFloat32, 2);
  const Tolerance fp32 = derive_tolerance(DType::kFloat32, Accumulate::kFloat32, 2);
  EXPECT_TRUE(test::matches("out", merged.out, reference.out, storage));
  EXPECT_TRUE(test::matches("dq", merged.dq, reference.dq, storage));
  EXPECT_TRUE(test::matches("dk", merged.dk, reference.dk, storage));
  EXPECT_TRUE(test::matches("dv", merged.dv, reference.dv, storage));
  EXPECT_TRUE(test::matches("lse", merged.lse, reference.lse, fp32));
  EXPECT_TRUE(test::matches("max_logit", merged.max_logit, reference.max_logit, fp32));
  if (!with_sinks) return;
  EXPECT_TRUE(test::matches("dsinks", rank_dsinks[0], reference_sinks.dsinks, fp32));
  for (int r = 1; r < cp; ++r) {
    EXPECT_TRUE(test::same_bits(rank_dsinks[static_cast<size_t>(r)], rank_dsinks[0])) << "rank " << r;
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& param_info) {
  const auto& [cp, mask, q_heads, kv_heads, dtype, v_head_dim, with_sinks] = param_info.param;
  return "cp" + std::to_string(cp) + "_" + test::mask_label(mask) + "_h" + std::to_string(q_heads) + "_" +
         std::to_string(kv_heads) + "_" + dtype_name(dtype) + (v_head_dim ? "_dv" + std::to_string(v_head_dim) : "") +
         (with_sinks ? "_sinks" : "");
}

INSTANTIATE_TEST_SUITE_P(Cases, CApiCpEqualsSingleDevice,
                         ::testing::Values(Case{2, Mask::causal(), 4, 2, DType::kBFloat16, 0, false},
                                           Case{2, Mask::full(), 2, 1, DType::kFloat32, 0, false},
                                           Case{2, Mask::window(20, 0), 2, 2, DType::kFloat16, 0, false},
                                           Case{3, Mask::window(12, 6), 4, 1, DType::kBFloat16, 0, false},
                                           Case{2, Mask::causal(), 4, 2, DType::kBFloat16, 0, true},
                                           Case{3, Mask::window(12, 0), 4, 1, DType::kFloat32, 32, true},
                                           Case{2, Mask::full(), 2, 2, DType::kBFloat16, 8, false}),
                         case_name);

}  // namespace
}  // namespace thdcp
