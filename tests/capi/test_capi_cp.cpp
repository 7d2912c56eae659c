// CP through the C ABI, CPU backend: an in-process group whose ranks are threads of the test,
// each splitting the global tensors with thdcp_cp_split_ex, running a CP plan, and merging its
// rows back with thdcp_cp_merge_ex; the merged result equals the single-device C ABI result
// within the tolerance of a sum in another order (as tests/cp does). With a value head dim of
// its own and attention sinks (thdcp_cp_forward_ex / _backward_ex) too: dsinks, the same bits
// on every rank, within that tolerance of the single device's (issue 27). Every CP layout and
// communication (params->cp_layout, cp_comm) at cp 1 to 4, the rank split of both layouts,
// and the refusals of what a layout or communication cannot run (issue 31).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "c_raw_enums.h"
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

// How a plan splits rows and exchanges them (thdcp_cp_params::cp_layout, cp_comm, kv_gather).
struct Modes {
  thdcp_cp_layout_t layout = THDCP_CP_LAYOUT_DUAL_CHUNK;
  thdcp_cp_comm_t comm = THDCP_CP_COMM_ALL_GATHER;
  thdcp_cp_kv_gather_t kv_gather = THDCP_CP_KV_GATHER_AUTO;
  int a2a_size = 0;  // THDCP_CP_COMM_A2A_AG's all-to-all groups
};

// One rank: split, plan, forward, backward, merge its rows into `merged` (disjoint rows per
// rank, so the ranks write it at the same time without a race).
// `s`: the rank's own sinks and dsinks (every rank passes the same sinks).
void run_rank(thdcp_communicator_t comm, const test::Batch& b, const Mask& mask, int cp, Modes modes, Sinks s,
              Outputs& merged, std::vector<float>& rank_dsinks) {
  int rank = -1;
  EXPECT_C_OK(thdcp_communicator_rank(comm, &rank));
  const thdcp_layout_t layout = c_layout(b.layout);
  const int64_t rows = b.q.tokens(), local_rows = rows / cp;
  const auto split = [&](const HostTensor& global) { return c_local_rows(global, layout, cp, rank, modes.layout); };
  const HostTensor q = split(b.q), k = split(b.k), v = split(b.v), dout = split(b.dout);
  Outputs local = test::poisoned_outputs(b, local_rows, b.q.dtype(), b.k.dtype());

  thdcp_cp_params p;
  thdcp_cp_params_init(&p);
  p.cp_size = cp;
  p.cp_layout = modes.layout;
  p.cp_comm = modes.comm;
  p.kv_gather = modes.kv_gather;
  p.a2a_size = modes.a2a_size;
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

  test::c_merge_rows(local, merged, layout, cp, rank, modes.layout);
  if (rank == 0) merged.max_logit = local.max_logit;  // the same on every rank (max-reduced)

  // thdcp_cp_local_rows_ex is the map the C++ split uses.
  std::vector<int32_t> global_rows(static_cast<size_t>(local_rows), -1);
  EXPECT_C_OK(thdcp_cp_local_rows_ex(&layout, cp, rank, global_rows.data(), local_rows, modes.layout));
  EXPECT_EQ(global_rows, rank_row_map(b.layout.view(), cp, rank, static_cast<CpLayout>(modes.layout)));
}

// The whole batch over `cp` ranks, each a thread of an in-process group (run_rank): the
// merged outputs and each rank's dsinks.
struct CpRun {
  Outputs merged;
  std::vector<std::vector<float>> rank_dsinks;
};

CpRun run_cp(const test::Batch& b, const Mask& mask, int cp, Modes modes, bool with_sinks) {
  CpRun run{test::poisoned_outputs(b, b.q.tokens(), b.q.dtype(), b.k.dtype()),
            std::vector<std::vector<float>>(static_cast<size_t>(cp))};
  std::vector<thdcp_communicator_t> comms(static_cast<size_t>(cp), nullptr);
  EXPECT_C_OK(thdcp_communicator_create_in_process_group(cp, comms.data()));
  std::vector<std::thread> ranks;
  for (int r = 0; r < cp; ++r) {
    ranks.emplace_back([&, r] {
      run_rank(comms[static_cast<size_t>(r)], b, mask, cp, modes, sinks_for(b.q.heads(), with_sinks), run.merged,
               run.rank_dsinks[static_cast<size_t>(r)]);
    });
  }
  for (auto& t : ranks) t.join();
  for (thdcp_communicator_t c : comms) EXPECT_C_OK(thdcp_communicator_destroy(c));
  return run;
}

// run_cp against the single-device result: out, lse, max_logit, dq, dk, dv and (with sinks)
// dsinks, the same bits on every rank.
void expect_cp_equals_single_device(const test::Batch& b, const Mask& mask, int cp, Modes modes, bool with_sinks) {
  const int64_t q_heads = b.q.heads();
  Sinks reference_sinks = sinks_for(q_heads, with_sinks);
  const Outputs reference = single_device(b, mask, reference_sinks);
  const CpRun run = run_cp(b, mask, cp, modes, with_sinks);
  const Outputs& merged = run.merged;
  const std::vector<std::vector<float>>& rank_dsinks = run.rank_dsinks;

  // Both sides round to storage once after fp32 arithmetic; dK/dV are summed in another
  // order (per rank, then across ranks).
  const Tolerance storage = derive_tolerance(b.q.dtype(), Accumulate::kFloat32, 2);
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

using Case = std::tuple<int /*cp*/, Mask, int /*q_heads*/, int /*kv_heads*/, DType, int /*D_v*/, bool /*sinks*/>;

class CApiCpEqualsSingleDevice : public ::testing::TestWithParam<Case> {};

TEST_P(CApiCpEqualsSingleDevice, InProcessGroupOfThreads) {
  const auto& [cp, mask, q_heads, kv_heads, dtype, v_head_dim, with_sinks] = GetParam();
  // An empty document, one of length 1 and lengths that are not multiples of 2*cp.
  const test::Batch b = test::make_batch(make_layout({37, 0, 64, 1, 90, 13}, cp), dtype, q_heads, kv_heads, 16,
                                         100 + cp + q_heads, v_head_dim);
  expect_cp_equals_single_device(b, mask, cp, Modes{}, with_sinks);
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

// ---- CP layouts and communications (issue 31) -----------------------------------------

const std::vector<int64_t> kModeLengths = {37, 0, 64, 1, 90, 13};

// The batch of a mode case: an empty document, one of length 1; under the contiguous layout
// the documents are packed with no padding but the last's, so documents span ranks.
BatchLayout mode_layout(thdcp_cp_layout_t cp_layout, int cp) {
  return cp_layout == THDCP_CP_LAYOUT_CONTIGUOUS ? make_contiguous_layout(kModeLengths, cp)
                                                 : make_layout(kModeLengths, cp);
}

const char* layout_label(thdcp_cp_layout_t cp_layout) {
  return cp_layout == THDCP_CP_LAYOUT_CONTIGUOUS ? "contiguous" : "dual_chunk";
}

using ModeCase = std::tuple<thdcp_cp_layout_t, thdcp_cp_comm_t, int /*cp*/, Mask>;

class CApiCpModesEqualSingleDevice : public ::testing::TestWithParam<ModeCase> {};

TEST_P(CApiCpModesEqualSingleDevice, InProcessGroupOfThreads) {
  const auto& [cp_layout, cp_comm, cp, mask] = GetParam();
  // GQA 2:1 with heads that all_to_all deals out whole (q_heads 2*cp, kv_heads cp); sinks at cp 3.
  const test::Batch b = test::make_batch(mode_layout(cp_layout, cp), DType::kBFloat16, 2 * cp, cp, 16,
                                         300 + 10 * cp + 2 * cp_layout + cp_comm);
  expect_cp_equals_single_device(b, mask, cp, Modes{cp_layout, cp_comm}, /*with_sinks=*/cp == 3);
}

std::string mode_case_name(const ::testing::TestParamInfo<ModeCase>& param_info) {
  const auto& [cp_layout, cp_comm, cp, mask] = param_info.param;
  return std::string(layout_label(cp_layout)) + (cp_comm == THDCP_CP_COMM_ALL_TO_ALL ? "_all_to_all" : "_all_gather") +
         "_cp" + std::to_string(cp) + "_" + test::mask_label(mask);
}

INSTANTIATE_TEST_SUITE_P(Modes, CApiCpModesEqualSingleDevice,
                         ::testing::Combine(::testing::Values(THDCP_CP_LAYOUT_DUAL_CHUNK, THDCP_CP_LAYOUT_CONTIGUOUS),
                                            ::testing::Values(THDCP_CP_COMM_ALL_GATHER, THDCP_CP_COMM_ALL_TO_ALL),
                                            ::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(Mask::causal(), Mask::window(12, 6))),
                         mode_case_name);

// ---- a2a+ag (params->cp_comm = THDCP_CP_COMM_A2A_AG, a2a_size; issue 31) -----------------

using A2aAgCase = std::tuple<thdcp_cp_layout_t, int /*cp*/, int /*a2a_size*/>;

class CApiCpA2aAg : public ::testing::TestWithParam<A2aAgCase> {};

// Against the single device; with halo gathers across the groups, the bits of the whole gather.
TEST_P(CApiCpA2aAg, EqualsSingleDevice) {
  const auto& [cp_layout, cp, a2a_size] = GetParam();
  const Mask mask = Mask::window(12, 6);
  const test::Batch b = test::make_batch(mode_layout(cp_layout, cp), DType::kBFloat16, 2 * cp, cp, 16, 700 + cp);
  const Modes whole{cp_layout, THDCP_CP_COMM_A2A_AG, THDCP_CP_KV_GATHER_WHOLE, a2a_size};
  expect_cp_equals_single_device(b, mask, cp, whole, /*with_sinks=*/true);
  Modes halo = whole;
  halo.kv_gather = THDCP_CP_KV_GATHER_HALO;
  const CpRun a = run_cp(b, mask, cp, whole, true), h = run_cp(b, mask, cp, halo, true);
  EXPECT_TRUE(test::same_bits(h.merged.out, a.merged.out));
  EXPECT_TRUE(test::same_bits(h.merged.dq, a.merged.dq));
  EXPECT_TRUE(test::same_bits(h.merged.dk, a.merged.dk));
  EXPECT_TRUE(test::same_bits(h.merged.dv, a.merged.dv));
}

// a2a_size 1 is all-gather and a2a_size cp all-to-all, bit for bit.
TEST(CApiCpA2aAgDegenerate, EqualsAllGatherAndAllToAllBitForBit) {
  constexpr int kCp = 4;
  const Mask mask = Mask::causal();
  const test::Batch b = test::make_batch(mode_layout(THDCP_CP_LAYOUT_DUAL_CHUNK, kCp), DType::kBFloat16, 8, 4, 16, 777);
  for (const auto& [a2a_size, comm] : {std::make_pair(1, THDCP_CP_COMM_ALL_GATHER), std::make_pair(kCp, THDCP_CP_COMM_ALL_TO_ALL)}) {
    SCOPED_TRACE("a2a_size " + std::to_string(a2a_size));
    const CpRun hybrid = run_cp(b, mask, kCp, Modes{THDCP_CP_LAYOUT_DUAL_CHUNK, THDCP_CP_COMM_A2A_AG,
                                                    THDCP_CP_KV_GATHER_WHOLE, a2a_size}, false);
    const CpRun plain = run_cp(b, mask, kCp, Modes{THDCP_CP_LAYOUT_DUAL_CHUNK, comm, THDCP_CP_KV_GATHER_WHOLE, 0}, false);
    EXPECT_TRUE(test::same_bits(hybrid.merged.out, plain.merged.out));
    EXPECT_TRUE(test::same_bits(hybrid.merged.lse, plain.merged.lse));
    EXPECT_TRUE(test::same_bits(hybrid.merged.dq, plain.merged.dq));
    EXPECT_TRUE(test::same_bits(hybrid.merged.dk, plain.merged.dk));
    EXPECT_TRUE(test::same_bits(hybrid.merged.dv, plain.merged.dv));
  }
}

std::string a2a_ag_case_name(const ::testing::TestParamInfo<A2aAgCase>& param_info) {
  const auto& [cp_layout, cp, a2a_size] = param_info.param;
  return std::string(layout_label(cp_layout)) + "_cp" + std::to_string(cp) + "_a2a" + std::to_string(a2a_size);
}

INSTANTIATE_TEST_SUITE_P(Groups, CApiCpA2aAg,
                         ::testing::Values(A2aAgCase{THDCP_CP_LAYOUT_DUAL_CHUNK, 4, 2},
                                           A2aAgCase{THDCP_CP_LAYOUT_CONTIGUOUS, 4, 2},
                                           A2aAgCase{THDCP_CP_LAYOUT_DUAL_CHUNK, 6, 3},
                                           A2aAgCase{THDCP_CP_LAYOUT_CONTIGUOUS, 6, 2}),
                         a2a_ag_case_name);

// ---- Halo gathers (params->kv_gather, issue 31) ------------------------------------------

// A halo gather gives the whole gather's bits: out, lse, max_logit, dq, dk, dv and dsinks.
class CApiCpHaloGather : public ::testing::TestWithParam<std::tuple<thdcp_cp_layout_t, int /*cp*/>> {};

TEST_P(CApiCpHaloGather, EqualsTheWholeGatherBitForBit) {
  const auto& [cp_layout, cp] = GetParam();
  const Mask mask = Mask::window(12, 0);
  const test::Batch b = test::make_batch(mode_layout(cp_layout, cp), DType::kBFloat16, 4, 2, 16, 500 + cp);
  const CpRun whole = run_cp(b, mask, cp, Modes{cp_layout, THDCP_CP_COMM_ALL_GATHER, THDCP_CP_KV_GATHER_WHOLE}, true);
  const CpRun halo = run_cp(b, mask, cp, Modes{cp_layout, THDCP_CP_COMM_ALL_GATHER, THDCP_CP_KV_GATHER_HALO}, true);
  EXPECT_TRUE(test::same_bits(halo.merged.out, whole.merged.out));
  EXPECT_TRUE(test::same_bits(halo.merged.lse, whole.merged.lse));
  EXPECT_TRUE(test::same_bits(halo.merged.max_logit, whole.merged.max_logit));
  EXPECT_TRUE(test::same_bits(halo.merged.dq, whole.merged.dq));
  EXPECT_TRUE(test::same_bits(halo.merged.dk, whole.merged.dk));
  EXPECT_TRUE(test::same_bits(halo.merged.dv, whole.merged.dv));
  EXPECT_TRUE(test::same_bits(halo.rank_dsinks[0], whole.rank_dsinks[0]));
}

std::string halo_case_name(const ::testing::TestParamInfo<std::tuple<thdcp_cp_layout_t, int>>& param_info) {
  return std::string(layout_label(std::get<0>(param_info.param))) + "_cp" + std::to_string(std::get<1>(param_info.param));
}

INSTANTIATE_TEST_SUITE_P(Layouts, CApiCpHaloGather,
                         ::testing::Combine(::testing::Values(THDCP_CP_LAYOUT_DUAL_CHUNK, THDCP_CP_LAYOUT_CONTIGUOUS),
                                            ::testing::Values(2, 3, 4)),
                         halo_case_name);

// thdcp_cp_plan_kv_traffic: the whole gather's bytes are (cp - 1) ranks' rows of K and V (and
// in the backward as many fp32 dK/dV rows); a narrow window's halo is fewer, and auto takes
// it; a full mask over one document needs every other rank's rows, and auto keeps the whole
// gather.
TEST(CApiCpKvTraffic, WholeHaloAndAuto) {
  constexpr int kCp = 2;
  const BatchLayout made = make_contiguous_layout({512}, kCp);  // one document over both ranks
  const thdcp_layout_t layout = c_layout(made);
  std::vector<thdcp_communicator_t> comms(kCp, nullptr);
  ASSERT_C_OK(thdcp_communicator_create_in_process_group(kCp, comms.data()));
  const auto traffic = [&](thdcp_cp_kv_gather_t kv_gather, int32_t window_left, thdcp_cp_kv_gather_t& gather,
                           std::vector<int64_t>& forward, std::vector<int64_t>& backward) {
    thdcp_cp_params p;
    thdcp_cp_params_init(&p);
    p.cp_size = kCp;
    p.cp_layout = THDCP_CP_LAYOUT_CONTIGUOUS;
    p.kv_gather = kv_gather;
    p.max_tokens = made.total_rows();
    p.max_seqs = 1;
    p.q_heads = 4;
    p.kv_heads = 2;
    p.head_dim = 16;
    p.window_left = window_left;
    p.window_right = window_left < 0 ? -1 : 0;
    std::vector<thdcp_cp_plan_t> plans(kCp, nullptr);
    std::vector<std::thread> ranks;
    for (int r = 0; r < kCp; ++r) {
      ranks.emplace_back([&, r] { EXPECT_C_OK(thdcp_cp_plan_create(comms[r], &p, nullptr, 0, &plans[r])); });
    }
    for (auto& t : ranks) t.join();
    forward.assign(kCp, -1);
    backward.assign(kCp, -1);
    EXPECT_C_OK(thdcp_cp_plan_kv_traffic(plans[1], &layout, &gather, forward.data(), backward.data()));
    for (thdcp_cp_plan_t plan : plans) EXPECT_C_OK(thdcp_cp_plan_destroy(plan));
  };
  const int64_t kv_row = 2 * (16 + 16) * 2, grad_row = 2 * (16 + 16) * 4;  // bf16 K+V, fp32 dK+dV of a row
  const int64_t other_rows = 256;                                         // (cp - 1) * T / cp
  thdcp_cp_kv_gather_t gather = THDCP_CP_KV_GATHER_AUTO;
  std::vector<int64_t> forward, backward;
  traffic(THDCP_CP_KV_GATHER_WHOLE, 8, gather, forward, backward);
  EXPECT_EQ(gather, THDCP_CP_KV_GATHER_WHOLE);
  EXPECT_EQ(forward, std::vector<int64_t>(kCp, other_rows * kv_row));
  EXPECT_EQ(backward, std::vector<int64_t>(kCp, other_rows * (kv_row + grad_row)));
  // Window 8 (causal): rank 1's first rows (256..263) reach the 8 rows before them, rank 0 nothing.
  traffic(THDCP_CP_KV_GATHER_AUTO, 8, gather, forward, backward);
  EXPECT_EQ(gather, THDCP_CP_KV_GATHER_HALO);
  EXPECT_EQ(forward, (std::vector<int64_t>{0, 8 * kv_row}));
  EXPECT_EQ(backward, (std::vector<int64_t>{8 * grad_row, 8 * kv_row}));
  traffic(THDCP_CP_KV_GATHER_AUTO, -1, gather, forward, backward);  // full mask: every row of the other rank
  EXPECT_EQ(gather, THDCP_CP_KV_GATHER_WHOLE);
  for (thdcp_communicator_t c : comms) EXPECT_C_OK(thdcp_communicator_destroy(c));
}

// Every rank's rows out of a global tensor and back, for both layouts: each local row is the
// global row the map names (contiguous: rank * T/cp + i, written out here), the ranks' rows
// merged back give the global tensor byte for byte, and the plain helpers are the _ex ones
// with the dual-chunk layout.
TEST(CApiCpSplit, RoundTripsBothLayouts) {
  constexpr size_t kRowBytes = 8;
  for (thdcp_cp_layout_t cp_layout : {THDCP_CP_LAYOUT_DUAL_CHUNK, THDCP_CP_LAYOUT_CONTIGUOUS}) {
    for (int cp = 1; cp <= 4; ++cp) {
      SCOPED_TRACE(std::string(layout_label(cp_layout)) + " cp=" + std::to_string(cp));
      const BatchLayout made = mode_layout(cp_layout, cp);
      const thdcp_layout_t layout = c_layout(made);
      const int64_t rows = made.total_rows(), local_rows = rows / cp;
      std::vector<unsigned char> global(static_cast<size_t>(rows) * kRowBytes);
      for (size_t i = 0; i < global.size(); ++i) global[i] = static_cast<unsigned char>(i * 37 + i / kRowBytes);
      std::vector<unsigned char> merged(global.size(), 0xAB);
      for (int rank = 0; rank < cp; ++rank) {
        std::vector<unsigned char> local(static_cast<size_t>(local_rows) * kRowBytes, 0xCD);
        ASSERT_C_OK(thdcp_cp_split_ex(global.data(), local.data(), kRowBytes, &layout, cp, rank, cp_layout));
        std::vector<int32_t> map(static_cast<size_t>(local_rows), -1);
        ASSERT_C_OK(thdcp_cp_local_rows_ex(&layout, cp, rank, map.data(), local_rows, cp_layout));
        for (int64_t i = 0; i < local_rows; ++i) {
          const auto row = static_cast<size_t>(i);
          if (cp_layout == THDCP_CP_LAYOUT_CONTIGUOUS) {
            ASSERT_EQ(map[row], rank * local_rows + i);
          }
          ASSERT_EQ(std::memcmp(&local[row * kRowBytes], &global[static_cast<size_t>(map[row]) * kRowBytes], kRowBytes),
                    0)
              << "rank " << rank << " local row " << i;
        }
        ASSERT_C_OK(thdcp_cp_merge_ex(local.data(), merged.data(), kRowBytes, &layout, cp, rank, cp_layout));
        if (cp_layout != THDCP_CP_LAYOUT_DUAL_CHUNK) continue;
        std::vector<unsigned char> plain(local.size(), 0xEF), plain_merged = merged;
        std::vector<int32_t> plain_map(map.size(), -1);
        EXPECT_C_OK(thdcp_cp_split(global.data(), plain.data(), kRowBytes, &layout, cp, rank));
        EXPECT_C_OK(thdcp_cp_local_rows(&layout, cp, rank, plain_map.data(), local_rows));
        EXPECT_C_OK(thdcp_cp_merge(local.data(), plain_merged.data(), kRowBytes, &layout, cp, rank));
        EXPECT_EQ(plain, local);
        EXPECT_EQ(plain_map, map);
        EXPECT_EQ(plain_merged, merged);
      }
      EXPECT_EQ(merged, global);
    }
  }
}

// A layout the split's CP layout cannot cut, or a value that is no thdcp_cp_layout_t:
// refused naming it, nothing written.
TEST(CApiCpSplit, RefusesWhatTheLayoutCannotCut) {
  const BatchLayout contiguous = make_contiguous_layout(kModeLengths, 3);  // 207 rows
  const thdcp_layout_t layout = c_layout(contiguous);
  std::vector<unsigned char> global(207, 1), local(207, 0x5A);
  std::vector<int32_t> map(69, -7);
  const test::Snapshot untouched = test::Snapshot().add(local.data(), local.size()).add(map.data(), map.size() * 4);
  // 207 rows do not cut into 2 pieces; the documents' lengths are no multiples of 2*cp.
  EXPECT_C_STATUS(thdcp_cp_split_ex(global.data(), local.data(), 1, &layout, 2, 0, THDCP_CP_LAYOUT_CONTIGUOUS),
                  THDCP_ERROR_INVALID_ARGUMENT, "thdcp_cp_split_ex:", "207 rows, not a multiple of cp=2");
  EXPECT_C_STATUS(thdcp_cp_local_rows_ex(&layout, 3, 0, map.data(), 69, THDCP_CP_LAYOUT_DUAL_CHUNK),
                  THDCP_ERROR_INVALID_ARGUMENT, "thdcp_cp_local_rows_ex:", "=37 is not a multiple of 2*cp=6");
  EXPECT_C_STATUS(thdcp_cp_merge(global.data(), local.data(), 1, &layout, 3, 0), THDCP_ERROR_INVALID_ARGUMENT,
                  "thdcp_cp_merge:", "is not a multiple of 2*cp=6");
  // A layout value that is none, passed from C (c_raw_enums.h).
  const int bad = 5;
  const char* named = "cp_layout=5 is not a thdcp_cp_layout_t: use THDCP_CP_LAYOUT_DUAL_CHUNK (0) or "
                      "THDCP_CP_LAYOUT_CONTIGUOUS (1)";
  EXPECT_C_STATUS(raw_cp_split_ex(global.data(), local.data(), 1, &layout, 3, 0, bad), THDCP_ERROR_INVALID_ARGUMENT,
                  named);
  EXPECT_C_STATUS(raw_cp_merge_ex(local.data(), global.data(), 1, &layout, 3, 0, bad), THDCP_ERROR_INVALID_ARGUMENT,
                  named);
  EXPECT_C_STATUS(raw_cp_local_rows_ex(&layout, 3, 0, map.data(), 69, bad), THDCP_ERROR_INVALID_ARGUMENT, named);
  EXPECT_TRUE(untouched.unchanged());
  EXPECT_TRUE(std::all_of(global.begin(), global.end(), [](unsigned char x) { return x == 1; }));
  // The same layout cut by the contiguous layout at cp 3 is accepted.
  EXPECT_C_OK(thdcp_cp_local_rows_ex(&layout, 3, 2, map.data(), 69, THDCP_CP_LAYOUT_CONTIGUOUS));
  EXPECT_EQ(map.front(), 138);
  EXPECT_EQ(map.back(), 206);
}

// thdcp_make_contiguous_layout: no padding but the last document's; refusals write nothing.
TEST(CApiCpSplit, MakeContiguousLayout) {
  std::vector<int32_t> cu(7, -1), padded(7, -1);
  ASSERT_C_OK(thdcp_make_contiguous_layout(kModeLengths.data(), 6, 4, cu.data(), padded.data()));
  EXPECT_EQ(cu, (std::vector<int32_t>{0, 37, 37, 101, 102, 192, 205}));
  EXPECT_EQ(padded, (std::vector<int32_t>{0, 37, 37, 101, 102, 192, 208}));  // 205 up to a multiple of 4
  ASSERT_C_OK(thdcp_make_contiguous_layout(kModeLengths.data(), 6, 1, cu.data(), padded.data()));
  EXPECT_EQ(padded, cu);
  std::vector<int32_t> untouched_cu(7, -1), untouched_padded(7, -1);
  const test::Snapshot untouched =
      test::Snapshot().add(untouched_cu.data(), 28).add(untouched_padded.data(), 28);
  EXPECT_C_STATUS(thdcp_make_contiguous_layout(kModeLengths.data(), 0, 2, untouched_cu.data(),
                                               untouched_padded.data()),
                  THDCP_ERROR_INVALID_ARGUMENT, "thdcp_make_contiguous_layout: num_documents=0");
  EXPECT_C_STATUS(thdcp_make_contiguous_layout(kModeLengths.data(), 6, 0, untouched_cu.data(),
                                               untouched_padded.data()),
                  THDCP_ERROR_INVALID_ARGUMENT, "cp=0 must be >= 1");
  const int64_t negative[2] = {4, -3};
  EXPECT_C_STATUS(thdcp_make_contiguous_layout(negative, 2, 2, untouched_cu.data(), untouched_padded.data()),
                  THDCP_ERROR_INVALID_ARGUMENT, "lengths[1]=-3 is negative");
  EXPECT_C_STATUS(thdcp_make_contiguous_layout(kModeLengths.data(), 6, 2, nullptr, untouched_padded.data()),
                  THDCP_ERROR_INVALID_ARGUMENT, "cu_seqlens is NULL");
  EXPECT_TRUE(untouched.unchanged());
}

// Params of a mode case: bf16, heads 4:2, head_dim 16, causal; capacity 4 sequences, 48 rows.
thdcp_cp_params mode_params(int cp, thdcp_cp_layout_t cp_layout, thdcp_cp_comm_t cp_comm) {
  thdcp_cp_params p;
  thdcp_cp_params_init(&p);
  p.cp_size = cp;
  test::set_shape(p, test::Shape{DType::kBFloat16, 4, 2, 16, Mask::causal()}, Capacity{4, 48});
  p.cp_layout = cp_layout;
  p.cp_comm = cp_comm;
  return p;
}

struct ModeParams {
  const char* what;
  thdcp_cp_params params;
  std::vector<std::string> message;  // empty: accepted
};

// What a layout or communication cannot run is refused when the workspace is sized and when
// the plan is made, with the field, its value and what to change; the pairs just inside each
// rule are accepted. Nothing is written on a refusal.
TEST(CApiCpModes, RefusedNamingTheValue) {
  const auto with = [](thdcp_cp_params p, void (*change)(thdcp_cp_params&)) {
    change(p);
    return p;
  };
  const thdcp_cp_params ag = mode_params(3, THDCP_CP_LAYOUT_DUAL_CHUNK, THDCP_CP_COMM_ALL_GATHER);
  const thdcp_cp_params a2a = mode_params(3, THDCP_CP_LAYOUT_DUAL_CHUNK, THDCP_CP_COMM_ALL_TO_ALL);
  const thdcp_cp_params contiguous = mode_params(5, THDCP_CP_LAYOUT_CONTIGUOUS, THDCP_CP_COMM_ALL_GATHER);
  const ModeParams cases[] = {
      {"cp_layout 2", with(ag, [](thdcp_cp_params& p) { p.cp_layout = 2; }),
       {"params->cp_layout=2 is not a thdcp_cp_layout_t: use THDCP_CP_LAYOUT_DUAL_CHUNK (0) or "
        "THDCP_CP_LAYOUT_CONTIGUOUS (1)"}},
      {"cp_comm -1", with(ag, [](thdcp_cp_params& p) { p.cp_comm = -1; }),
       {"params->cp_comm=-1 is not a thdcp_cp_comm_t: use THDCP_CP_COMM_ALL_GATHER (0), "
        "THDCP_CP_COMM_ALL_TO_ALL (1) or THDCP_CP_COMM_A2A_AG (2)"}},
      {"a2a+ag, a2a_size 2 at cp 3",
       with(ag, [](thdcp_cp_params& p) { p.cp_comm = THDCP_CP_COMM_A2A_AG, p.a2a_size = 2; }),
       {"params->a2a_size=2 does not divide cp_size=3", "use a divisor of cp_size"}},
      {"a2a+ag, a2a_size 0", with(ag, [](thdcp_cp_params& p) { p.cp_comm = THDCP_CP_COMM_A2A_AG; }),
       {"params->a2a_size=0 does not divide cp_size=3"}},
      {"a2a+ag, kv_heads 2 at a2a_size 3",
       with(ag, [](thdcp_cp_params& p) { p.cp_comm = THDCP_CP_COMM_A2A_AG, p.a2a_size = 3, p.q_heads = 6; }),
       {"params->kv_heads=2 is not a multiple of a2a_size=3", "THDCP_CP_COMM_A2A_AG"}},
      {"a2a_size with all_gather", with(ag, [](thdcp_cp_params& p) { p.a2a_size = 3; }),
       {"params->a2a_size=3 is set but params->cp_comm=THDCP_CP_COMM_ALL_GATHER has no all-to-all groups"}},
      {"a2a+ag 3 at cp 3, heads 6:3",
       with(ag, [](thdcp_cp_params& p) { p.cp_comm = THDCP_CP_COMM_A2A_AG, p.a2a_size = 3, p.q_heads = 6, p.kv_heads = 3; }),
       {}},
      {"all_to_all, q_heads 4 at cp 3", a2a,
       {"params->q_heads=4 is not a multiple of cp_size=3, which params->cp_comm=THDCP_CP_COMM_ALL_TO_ALL needs",
        "use THDCP_CP_COMM_ALL_GATHER, or a cp_size that divides q_heads and kv_heads"}},
      {"all_to_all, kv_heads 2 at cp 3", with(a2a, [](thdcp_cp_params& p) { p.q_heads = 6; }),
       {"params->kv_heads=2 is not a multiple of cp_size=3", "THDCP_CP_COMM_ALL_GATHER"}},
      {"all_to_all, heads 6:3 at cp 3", with(a2a, [](thdcp_cp_params& p) { p.q_heads = 6, p.kv_heads = 3; }), {}},
      {"all_gather, heads 4:2 at cp 3", ag, {}},
      {"contiguous, max_tokens 48 at cp 5", contiguous,
       {"params->max_tokens=48 must be a multiple of cp_size=5",
        "params->cp_layout=THDCP_CP_LAYOUT_CONTIGUOUS cuts into cp_size equal pieces"}},
      {"contiguous, max_tokens 55 at cp 5", with(contiguous, [](thdcp_cp_params& p) { p.max_tokens = 55; }), {}},
      {"dual_chunk, max_tokens 55 at cp 5",
       with(contiguous, [](thdcp_cp_params& p) { p.max_tokens = 55, p.cp_layout = THDCP_CP_LAYOUT_DUAL_CHUNK; }),
       {"params->max_tokens=55 must be a multiple of 2*cp_size=10",
        "params->cp_layout=THDCP_CP_LAYOUT_DUAL_CHUNK cuts into 2*cp_size chunks per sequence",
        "or use THDCP_CP_LAYOUT_CONTIGUOUS, which needs a multiple of cp_size"}},
      {"kv_gather 3", with(ag, [](thdcp_cp_params& p) { p.kv_gather = 3; }),
       {"params->kv_gather=3 is not a thdcp_cp_kv_gather_t: use THDCP_CP_KV_GATHER_AUTO (0), "
        "THDCP_CP_KV_GATHER_WHOLE (1) or THDCP_CP_KV_GATHER_HALO (2)"}},
      {"halo with all_to_all",
       with(a2a, [](thdcp_cp_params& p) { p.q_heads = 6, p.kv_heads = 3, p.kv_gather = THDCP_CP_KV_GATHER_HALO; }),
       {"params->kv_gather=THDCP_CP_KV_GATHER_HALO with params->cp_comm=THDCP_CP_COMM_ALL_TO_ALL",
        "use THDCP_CP_KV_GATHER_AUTO, or THDCP_CP_COMM_ALL_GATHER or _A2A_AG"}},
      {"CUDA, halo",
       with(ag, [](thdcp_cp_params& p) { p.backend = THDCP_BACKEND_CUDA, p.kv_gather = THDCP_CP_KV_GATHER_HALO; }),
       {"params->kv_gather=THDCP_CP_KV_GATHER_HALO is not supported by the CUDA backend with "
        "THDCP_CP_LAYOUT_DUAL_CHUNK: it gathers a halo under THDCP_CP_LAYOUT_CONTIGUOUS only",
        "THDCP_CP_KV_GATHER_AUTO or _WHOLE, or THDCP_BACKEND_CPU"}},
      {"halo, all_gather", with(ag, [](thdcp_cp_params& p) { p.kv_gather = THDCP_CP_KV_GATHER_HALO; }), {}},
      {"whole, all_to_all",
       with(a2a, [](thdcp_cp_params& p) { p.q_heads = 6, p.kv_heads = 3, p.kv_gather = THDCP_CP_KV_GATHER_WHOLE; }),
       {}},
  };
  thdcp_communicator_t comm = nullptr;
  ASSERT_C_OK(thdcp_communicator_create_in_process_group(1, &comm));
  for (const ModeParams& c : cases) {
    SCOPED_TRACE(c.what);
    size_t bytes = 77;
    if (c.message.empty()) {
      EXPECT_C_OK(thdcp_cp_plan_workspace_size(&c.params, &bytes));
      EXPECT_EQ(bytes, 0u);
      continue;
    }
    EXPECT_TRUE(test::status_is(thdcp_cp_plan_workspace_size(&c.params, &bytes), THDCP_ERROR_INVALID_ARGUMENT,
                                c.message));
    EXPECT_EQ(bytes, 77u);
    // Checked before the communicator's size (1 here): the same refusal, no handle written.
    thdcp_cp_plan_t plan = reinterpret_cast<thdcp_cp_plan_t>(0x1);
    EXPECT_TRUE(test::status_is(thdcp_cp_plan_create(comm, &c.params, nullptr, 0, &plan),
                                THDCP_ERROR_INVALID_ARGUMENT, c.message));
    EXPECT_EQ(plan, reinterpret_cast<thdcp_cp_plan_t>(0x1));
  }
  EXPECT_C_OK(thdcp_communicator_destroy(comm));
}

// A caller built against the 96-byte struct (before cp_layout and cp_comm) gets dual chunk
// and all-gather, whatever lies past its struct_size: max_tokens 66 at cp 2 is refused as a
// dual-chunk capacity, and kv_heads 1 at cp 2 is accepted as all-gather; the whole struct
// with the same bytes is read as contiguous and all-to-all.
TEST(CApiCpModes, OlderStructGetsTheDefaults) {
  thdcp_cp_params p = mode_params(2, THDCP_CP_LAYOUT_CONTIGUOUS, THDCP_CP_COMM_ALL_TO_ALL);
  p.max_tokens = 66;
  p.struct_size = 96;
  size_t bytes = 0;
  EXPECT_C_STATUS(thdcp_cp_plan_workspace_size(&p, &bytes), THDCP_ERROR_INVALID_ARGUMENT,
                  "params->max_tokens=66 must be a multiple of 2*cp_size=4",
                  "params->cp_layout=THDCP_CP_LAYOUT_DUAL_CHUNK");
  p.struct_size = sizeof(thdcp_cp_params);
  p.kv_heads = 1;
  EXPECT_C_STATUS(thdcp_cp_plan_workspace_size(&p, &bytes), THDCP_ERROR_INVALID_ARGUMENT,
                  "params->kv_heads=1 is not a multiple of cp_size=2");
  p.struct_size = 96;
  p.max_tokens = 64;
  EXPECT_C_OK(thdcp_cp_plan_workspace_size(&p, &bytes));
  const thdcp_cp_params defaults = THDCP_CP_PARAMS_INIT;
  EXPECT_EQ(sizeof(thdcp_cp_params), 120u);
  EXPECT_EQ(defaults.reduce_dtype, THDCP_DTYPE_DEFAULT);
  EXPECT_EQ(defaults.cp_layout, THDCP_CP_LAYOUT_DUAL_CHUNK);
  EXPECT_EQ(defaults.cp_comm, THDCP_CP_COMM_ALL_GATHER);
  EXPECT_EQ(defaults.kv_gather, THDCP_CP_KV_GATHER_AUTO);
}

// params->reduce_dtype (the 120-byte struct): fp32 (0 or THDCP_DTYPE_FP32) or the problem's
// dtype are accepted; another dtype is refused naming both; a 112-byte struct gets fp32
// whatever lies past its end.
TEST(CApiCpReduceDtype, Fp32OrTheProblemsDtype) {
  thdcp_cp_params p = mode_params(2, THDCP_CP_LAYOUT_DUAL_CHUNK, THDCP_CP_COMM_ALL_GATHER);
  size_t bytes = 0;
  for (const int accepted : {THDCP_DTYPE_DEFAULT, THDCP_DTYPE_FP32, THDCP_DTYPE_BF16}) {
    p.reduce_dtype = accepted;
    EXPECT_C_OK(thdcp_cp_plan_workspace_size(&p, &bytes)) << accepted;
  }
  p.reduce_dtype = THDCP_DTYPE_FP16;
  EXPECT_C_STATUS(thdcp_cp_plan_workspace_size(&p, &bytes), THDCP_ERROR_INVALID_ARGUMENT,
                  "params->reduce_dtype=THDCP_DTYPE_FP16 with params->dtype=THDCP_DTYPE_BF16: dK/dV partial sums "
                  "cross ranks in fp32 or in the problem's dtype; use THDCP_DTYPE_DEFAULT (fp32) or THDCP_DTYPE_BF16");
  p.reduce_dtype = 7;
  EXPECT_C_STATUS(thdcp_cp_plan_workspace_size(&p, &bytes), THDCP_ERROR_INVALID_ARGUMENT,
                  "params->reduce_dtype=7");
  p.struct_size = 112;
  EXPECT_C_OK(thdcp_cp_plan_workspace_size(&p, &bytes));
}

// params->head_slices (the 120-byte struct's last field, reserved2 before): 0 and 1 take every
// head at once in every mode; more under all_to_all dividing the heads per rank, and under
// all_gather dividing the heads, with the whole gather (refused naming the values that would
// do); a2a+ag and a negative value are refused.
TEST(CApiCpHeadSlices, AllToAllAndAllGatherOnlyAndADivisorOfTheirHeads) {
  thdcp_cp_params p = mode_params(2, THDCP_CP_LAYOUT_DUAL_CHUNK, THDCP_CP_COMM_ALL_TO_ALL);
  p.q_heads = 8;
  p.kv_heads = 4;
  size_t bytes = 0;
  for (const int accepted : {0, 1, 2}) {
    p.head_slices = accepted;
    EXPECT_C_OK(thdcp_cp_plan_workspace_size(&p, &bytes)) << accepted;
  }
  p.head_slices = 4;
  EXPECT_C_STATUS(thdcp_cp_plan_workspace_size(&p, &bytes), THDCP_ERROR_INVALID_ARGUMENT,
                  "params->head_slices=4 with q_heads/cp_size=4 and kv_heads/cp_size=2 heads per rank: each slice "
                  "takes as many of both; use a divisor of both");
  p.head_slices = -1;
  EXPECT_C_STATUS(thdcp_cp_plan_workspace_size(&p, &bytes), THDCP_ERROR_INVALID_ARGUMENT,
                  "params->head_slices=-1 must be >= 0");
  p = mode_params(2, THDCP_CP_LAYOUT_DUAL_CHUNK, THDCP_CP_COMM_ALL_GATHER);
  p.q_heads = 8;
  p.kv_heads = 4;
  for (const int accepted : {2, 4}) {
    p.head_slices = accepted;
    EXPECT_C_OK(thdcp_cp_plan_workspace_size(&p, &bytes)) << accepted;
  }
  p.head_slices = 8;
  EXPECT_C_STATUS(thdcp_cp_plan_workspace_size(&p, &bytes), THDCP_ERROR_INVALID_ARGUMENT,
                  "params->head_slices=8 with q_heads=8 and kv_heads=4: each slice takes as many of both");
  p.head_slices = 2;
  p.kv_gather = THDCP_CP_KV_GATHER_HALO;
  EXPECT_C_STATUS(thdcp_cp_plan_workspace_size(&p, &bytes), THDCP_ERROR_INVALID_ARGUMENT,
                  "params->head_slices=2 with params->kv_gather THDCP_CP_KV_GATHER_HALO");
  p = mode_params(2, THDCP_CP_LAYOUT_DUAL_CHUNK, THDCP_CP_COMM_A2A_AG);
  p.a2a_size = 2;
  p.head_slices = 2;
  EXPECT_C_STATUS(thdcp_cp_plan_workspace_size(&p, &bytes), THDCP_ERROR_INVALID_ARGUMENT,
                  "params->head_slices=2 with params->cp_comm THDCP_CP_COMM_A2A_AG");
}

// A caller built against the 104-byte struct (before kv_gather and a2a_size) gets auto and no
// groups, whatever lies past its struct_size: halo with all-to-all is refused only when the
// struct holds kv_gather.
TEST(CApiCpModes, StructBeforeKvGatherGetsAuto) {
  thdcp_cp_params p = mode_params(2, THDCP_CP_LAYOUT_DUAL_CHUNK, THDCP_CP_COMM_ALL_TO_ALL);
  p.max_tokens = 64;
  p.q_heads = 4;
  p.kv_heads = 2;
  p.kv_gather = THDCP_CP_KV_GATHER_HALO;
  p.a2a_size = 9;
  p.struct_size = 104;
  size_t bytes = 1;
  EXPECT_C_OK(thdcp_cp_plan_workspace_size(&p, &bytes));
  p.struct_size = sizeof(thdcp_cp_params);
  EXPECT_C_STATUS(thdcp_cp_plan_workspace_size(&p, &bytes), THDCP_ERROR_INVALID_ARGUMENT,
                  "params->kv_gather=THDCP_CP_KV_GATHER_HALO with params->cp_comm=THDCP_CP_COMM_ALL_TO_ALL");
}

// thdcp_cp_plan_kv_traffic refuses what it cannot report, naming the argument.
TEST(CApiCpKvTraffic, RefusedNamingTheArgument) {
  thdcp_communicator_t comm = nullptr;
  ASSERT_C_OK(thdcp_communicator_create_in_process_group(1, &comm));
  thdcp_cp_params p = mode_params(1, THDCP_CP_LAYOUT_DUAL_CHUNK, THDCP_CP_COMM_ALL_TO_ALL);
  p.max_tokens = 64;
  thdcp_cp_plan_t plan = nullptr;
  ASSERT_C_OK(thdcp_cp_plan_create(comm, &p, nullptr, 0, &plan));
  const BatchLayout made = make_layout({64}, 1);
  const thdcp_layout_t layout = c_layout(made);
  thdcp_cp_kv_gather_t gather = THDCP_CP_KV_GATHER_AUTO;
  int64_t forward = -1, backward = -1;
  EXPECT_C_STATUS(thdcp_cp_plan_kv_traffic(plan, &layout, &gather, &forward, &backward), THDCP_ERROR_INVALID_ARGUMENT,
                  "plan is a THDCP_CP_COMM_ALL_TO_ALL plan");
  EXPECT_C_OK(thdcp_cp_plan_destroy(plan));
  p.cp_comm = THDCP_CP_COMM_ALL_GATHER;
  ASSERT_C_OK(thdcp_cp_plan_create(comm, &p, nullptr, 0, &plan));
  EXPECT_C_STATUS(thdcp_cp_plan_kv_traffic(plan, &layout, nullptr, &forward, &backward), THDCP_ERROR_INVALID_ARGUMENT,
                  "gather is NULL");
  EXPECT_C_STATUS(thdcp_cp_plan_kv_traffic(plan, &layout, &gather, &forward, nullptr), THDCP_ERROR_INVALID_ARGUMENT,
                  "backward_bytes is NULL");
  EXPECT_C_STATUS(thdcp_cp_plan_kv_traffic(nullptr, &layout, &gather, &forward, &backward),
                  THDCP_ERROR_INVALID_ARGUMENT, "plan is NULL");
  EXPECT_EQ(forward, -1);
  EXPECT_C_OK(thdcp_cp_plan_kv_traffic(plan, &layout, &gather, &forward, &backward));
  EXPECT_EQ(gather, THDCP_CP_KV_GATHER_WHOLE);  // one rank: nothing to gather either way
  EXPECT_EQ(forward, 0);
  EXPECT_C_OK(thdcp_cp_plan_destroy(plan));
  EXPECT_C_OK(thdcp_communicator_destroy(comm));
}

}  // namespace
}  // namespace thdcp
