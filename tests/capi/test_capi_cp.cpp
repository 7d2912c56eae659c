// AllGather CP through the C ABI, CPU backend: an in-process group whose ranks are threads of
// the test, each splitting the global tensors with thdcp_cp_split, running a CP plan, and
// merging its rows back with thdcp_cp_merge; the merged result equals the single-device
// C ABI result within the tolerance of a sum in another order (as tests/cp does).
#include <gtest/gtest.h>

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

Outputs single_device(const test::Batch& b, const Mask& mask) {
  Outputs r = test::poisoned_outputs(b, b.q.tokens(), b.q.dtype(), b.k.dtype());
  thdcp_attention_params p;
  thdcp_attention_params_init(&p);
  test::set_shape(p, test::batch_shape(b, mask), Capacity{b.layout.num_seqs(), b.q.tokens()});
  p.num_threads = 1;
  test::c_attention_on_host(&p, b, r);
  return r;
}

// One rank: split, plan, forward, backward, merge its rows into `merged` (disjoint rows per
// rank, so the ranks write it at the same time without a race).
void run_rank(thdcp_communicator_t comm, const test::Batch& b, const Mask& mask, int cp, Outputs& merged) {
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
  p.num_threads = 1;
  size_t workspace = 1;
  EXPECT_C_OK(thdcp_cp_plan_workspace_size(&p, &workspace));
  EXPECT_EQ(workspace, 0u);
  thdcp_cp_plan_t plan = nullptr;
  ASSERT_C_OK(thdcp_cp_plan_create(comm, &p, nullptr, 0, &plan));
  const thdcp_tensor_t cq = c_tensor(q), ck = c_tensor(k), cv = c_tensor(v), cdout = c_tensor(dout);
  const thdcp_tensor_t out = c_tensor(local.out), dq = c_tensor(local.dq), dk = c_tensor(local.dk),
                       dv = c_tensor(local.dv);
  EXPECT_C_OK(thdcp_cp_forward(plan, &layout, &cq, &ck, &cv, &out, local.lse.data(), local.max_logit.data(), nullptr));
  EXPECT_C_OK(thdcp_cp_backward(plan, &layout, &cq, &ck, &cv, &out, &cdout, local.lse.data(), &dq, &dk, &dv,
                                nullptr));
  EXPECT_C_OK(thdcp_cp_plan_destroy(plan));

  test::c_merge_rows(local, merged, layout, cp, rank);
  if (rank == 0) merged.max_logit = local.max_logit;  // the same on every rank (max-reduced)

  // thdcp_cp_local_rows is the map the C++ split uses.
  std::vector<int32_t> global_rows(static_cast<size_t>(local_rows), -1);
  EXPECT_C_OK(thdcp_cp_local_rows(&layout, cp, rank, global_rows.data(), local_rows));
  EXPECT_EQ(global_rows, rank_row_map(b.layout.view(), cp, rank));
}

using Case = std::tuple<int /*cp*/, Mask, int /*q_heads*/, int /*kv_heads*/, DType>;

class CApiCpEqualsSingleDevice : public ::testing::TestWithParam<Case> {};

TEST_P(CApiCpEqualsSingleDevice, InProcessGroupOfThreads) {
  const auto& [cp, mask, q_heads, kv_heads, dtype] = GetParam();
  // An empty document, one of length 1 and lengths that are not multiples of 2*cp.
  const test::Batch b =
      test::make_batch(make_layout({37, 0, 64, 1, 90, 13}, cp), dtype, q_heads, kv_heads, 16, 100 + cp + q_heads);
  const Outputs reference = single_device(b, mask);

  std::vector<thdcp_communicator_t> comms(static_cast<size_t>(cp), nullptr);
  ASSERT_C_OK(thdcp_communicator_create_in_process_group(cp, comms.data()));
  Outputs merged = test::poisoned_outputs(b, b.q.tokens(), b.q.dtype(), b.k.dtype());
  std::vector<std::thread> ranks;
  for (int r = 0; r < cp; ++r) {
    ranks.emplace_back([&, r] { run_rank(comms[static_cast<size_t>(r)], b, mask, cp, merged); });
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
}

std::string case_name(const ::testing::TestParamInfo<Case>& param_info) {
  const auto& [cp, mask, q_heads, kv_heads, dtype] = param_info.param;
  return "cp" + std::to_string(cp) + "_" + test::mask_label(mask) + "_h" + std::to_string(q_heads) + "_" +
         std::to_string(kv_heads) + "_" + dtype_name(dtype);
}

INSTANTIATE_TEST_SUITE_P(Cases, CApiCpEqualsSingleDevice,
                         ::testing::Values(Case{2, Mask::causal(), 4, 2, DType::kBFloat16},
                                           Case{2, Mask::full(), 2, 1, DType::kFloat32},
                                           Case{2, Mask::window(20, 0), 2, 2, DType::kFloat16},
                                           Case{3, Mask::window(12, 6), 4, 1, DType::kBFloat16}),
                         case_name);

}  // namespace
}  // namespace thdcp
