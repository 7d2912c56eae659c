// The C ABI's value head dim (thdcp_attention_params::v_head_dim) and attention sinks
// (thdcp_attention_extras through thdcp_attention_forward_ex / _backward_ex) equal the C++ API
// (thdcp::cpu, ForwardTensors::sinks, BackwardTensors::dsinks) bit for bit, on the CPU backend;
// bad values are refused naming the argument, the value and the fix, with nothing written; a
// params struct from before v_head_dim takes v_head_dim = head_dim (issue 27).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "support/capi/capi_support.h"
#include "support/outputs.h"
#include "support/random_batch.h"
#include "thdcp/cpu/attention.h"
#include "thdcp/plan/segment_table.h"
#include "thdcp/thdcp.h"

namespace thdcp {
namespace {

using test::c_layout;
using test::c_tensor;
using test::Outputs;

struct Result {
  Outputs outputs;
  std::vector<float> dsinks;
};

test::Batch batch_for(DType dtype, int64_t q_heads, int64_t kv_heads, int64_t head_dim, int64_t v_head_dim,
                      uint64_t seed) {
  return test::make_batch(make_layout({37, 0, 24, 1, 13}, 2), dtype, q_heads, kv_heads, head_dim, seed, v_head_dim);
}

std::vector<float> random_sinks(int64_t q_heads, uint64_t seed) {
  std::vector<float> sinks;
  for (int64_t h = 0; h < q_heads; ++h) sinks.push_back(std::sin(static_cast<float>(seed + 3 * h)) * 2.5f);
  return sinks;
}

Result poisoned(const test::Batch& b, int64_t q_heads) {
  Result r{test::poisoned_outputs(b, b.q.tokens(), b.q.dtype(), b.q.dtype()), {}};
  r.dsinks.assign(static_cast<size_t>(q_heads), std::numeric_limits<float>::quiet_NaN());
  return r;
}

// The C++ API: the CPU reference with the tensors' sinks (null: none).
Result cpp_result(const test::Batch& b, const Mask& mask, const std::vector<float>* sinks) {
  Result r = poisoned(b, b.q.heads());
  const SegmentTable table = build_segment_table(b.layout.view(), mask);
  AttentionOptions options;
  options.num_threads = 2;
  Outputs& o = r.outputs;
  const float* s = sinks ? sinks->data() : nullptr;
  cpu::attention_forward(table, ForwardTensors{b.q.view(), b.k.view(), b.v.view(), o.out.view(), o.lse.data(),
                                               o.max_logit.data(), s},
                         options);
  BackwardTensors t;
  t.q = b.q.view();
  t.k = b.k.view();
  t.v = b.v.view();
  t.out = ConstThdTensor(o.out.view());
  t.dout = b.dout.view();
  t.lse = o.lse.data();
  t.dq = o.dq.view();
  t.dk = o.dk.view();
  t.dv = o.dv.view();
  t.sinks = s;
  t.dsinks = sinks ? r.dsinks.data() : nullptr;
  cpu::attention_backward(table, t, options);
  return r;
}

thdcp_attention_params params_for(const test::Batch& b, const Mask& mask) {
  thdcp_attention_params p;
  thdcp_attention_params_init(&p);
  test::set_shape(p, test::batch_shape(b, mask), Capacity{b.layout.num_seqs() + 1, b.q.tokens()});
  p.v_head_dim = b.v.head_dim();
  p.num_threads = 2;
  return p;
}

// The same through the C ABI: a plan of `params`, thdcp_attention_forward_ex and _backward_ex.
Result c_result(const test::Batch& b, const thdcp_attention_params& params, const std::vector<float>* sinks) {
  Result r = poisoned(b, b.q.heads());
  Outputs& o = r.outputs;
  thdcp_attention_plan_t plan = nullptr;
  EXPECT_C_OK(thdcp_attention_plan_create(&params, nullptr, 0, &plan));
  const thdcp_layout_t layout = c_layout(b.layout);
  const thdcp_tensor_t q = c_tensor(b.q), k = c_tensor(b.k), v = c_tensor(b.v), dout = c_tensor(b.dout);
  const thdcp_tensor_t out = c_tensor(o.out), dq = c_tensor(o.dq), dk = c_tensor(o.dk), dv = c_tensor(o.dv);
  thdcp_attention_extras extras = THDCP_ATTENTION_EXTRAS_INIT;
  extras.sinks = sinks ? sinks->data() : nullptr;
  EXPECT_C_OK(thdcp_attention_forward_ex(plan, &layout, &q, &k, &v, &out, o.lse.data(), o.max_logit.data(), &extras,
                                         nullptr));
  extras.dsinks = sinks ? r.dsinks.data() : nullptr;
  EXPECT_C_OK(thdcp_attention_backward_ex(plan, &layout, &q, &k, &v, &out, &dout, o.lse.data(), &dq, &dk, &dv,
                                          &extras, nullptr));
  EXPECT_C_OK(thdcp_attention_plan_destroy(plan));
  return r;
}

using Case = std::tuple<std::string, Mask, int /*q_heads*/, int /*kv_heads*/, int /*D_qk*/, int /*D_v*/, bool /*sinks*/>;

class CApiHeadDimsSinks : public ::testing::TestWithParam<Case> {};

TEST_P(CApiHeadDimsSinks, ForwardAndBackwardEqualTheCppApiBitForBit) {
  const auto& [label, mask, q_heads, kv_heads, head_dim, v_head_dim, with_sinks] = GetParam();
  const test::Batch b = batch_for(DType::kBFloat16, q_heads, kv_heads, head_dim, v_head_dim, 5 + head_dim + v_head_dim);
  const std::vector<float> sinks = random_sinks(q_heads, static_cast<uint64_t>(head_dim));
  const std::vector<float>* s = with_sinks ? &sinks : nullptr;
  const Result cpp = cpp_result(b, mask, s);
  const Result c = c_result(b, params_for(b, mask), s);
  EXPECT_TRUE(test::all_written(c.outputs));
  EXPECT_TRUE(test::identical(c.outputs, cpp.outputs)) << "the C ABI differs from the C++ API";
  if (!with_sinks) return;
  EXPECT_TRUE(test::same_bits(c.dsinks, cpp.dsinks)) << "dsinks differ from the C++ API";
  for (float x : c.dsinks) EXPECT_TRUE(std::isfinite(x)) << "every dsinks entry is written";
  // The sinks reach the computation: without them the outputs differ.
  const Result plain = cpp_result(b, mask, nullptr);
  EXPECT_FALSE(test::same_bits(c.outputs.out, plain.outputs.out)) << "the sinks were not used";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CApiHeadDimsSinks,
    ::testing::Values(Case{"causal_sinks", Mask::causal(), 2, 2, 16, 16, true},
                      Case{"gqa_window_sinks", Mask::window(8, 0), 4, 2, 32, 32, true},
                      Case{"full_sinks_dv_smaller", Mask::full(), 4, 1, 32, 16, true},
                      Case{"causal_dv_larger", Mask::causal(), 2, 1, 16, 48, false},
                      Case{"mla_192_128_sinks", Mask::causal(), 2, 1, 192, 128, true},
                      Case{"window_dv_no_sinks", Mask::window(5, 3), 4, 4, 64, 32, false}),
    [](const ::testing::TestParamInfo<Case>& param_info) { return std::get<0>(param_info.param); });

// A params struct compiled before v_head_dim (80 bytes) takes v_head_dim = head_dim.
TEST(CApiHeadDimsSinks, AParamsStructFromBeforeVHeadDimTakesHeadDim) {
  const test::Batch b = batch_for(DType::kBFloat16, 2, 1, 16, 0, 21);
  thdcp_attention_params p = params_for(b, Mask::causal());
  p.v_head_dim = 77;  // past struct_size: never read
  p.struct_size = 80;
  const Result c = c_result(b, p, nullptr);
  const Result cpp = cpp_result(b, Mask::causal(), nullptr);
  EXPECT_TRUE(test::identical(c.outputs, cpp.outputs));
}

// Bad head dims are refused when the plan is made; bad tensors and extras at the run, naming
// the argument, its value and the fix, with every output untouched.
TEST(CApiHeadDimsSinks, BadValuesAreRefusedNamingThemWithNothingWritten) {
  const test::Batch b = batch_for(DType::kBFloat16, 4, 2, 32, 16, 31);
  thdcp_attention_params p = params_for(b, Mask::causal());
  thdcp_attention_plan_t plan = nullptr;
  p.v_head_dim = -8;
  EXPECT_C_STATUS(thdcp_attention_plan_create(&p, nullptr, 0, &plan), THDCP_ERROR_INVALID_ARGUMENT,
                  "params->v_head_dim=-8 must be >= 1, or 0 for v_head_dim = head_dim");
  p.v_head_dim = 12;
  EXPECT_C_STATUS(thdcp_attention_plan_create(&p, nullptr, 0, &plan), THDCP_ERROR_INVALID_ARGUMENT,
                  "params->v_head_dim=12 is not supported by the CPU backend",
                  "use 0 (v_head_dim = head_dim) or a multiple of 8 in [8, 256]");
  p.v_head_dim = 264;
  EXPECT_C_STATUS(thdcp_attention_plan_workspace_size(&p, nullptr), THDCP_ERROR_INVALID_ARGUMENT,
                  "params->v_head_dim=264");
  p.v_head_dim = 16;
  p.max_tokens = int64_t{1} << 30;
  p.q_heads = p.kv_heads = int64_t{1} << 16;  // q: 2^49 elements; out: 2^54
  p.head_dim = 8;
  p.v_head_dim = 256;
  EXPECT_C_STATUS(thdcp_attention_plan_create(&p, nullptr, 0, &plan), THDCP_ERROR_INVALID_ARGUMENT,
                  "* v_head_dim=256 elements of a tensor are 2^53 or more");
  EXPECT_EQ(plan, nullptr);

  p = params_for(b, Mask::causal());
  ASSERT_C_OK(thdcp_attention_plan_create(&p, nullptr, 0, &plan));
  Result r = poisoned(b, 4);
  Outputs& o = r.outputs;
  const std::vector<float> sinks = random_sinks(4, 3);
  const thdcp_layout_t layout = c_layout(b.layout);
  const thdcp_tensor_t q = c_tensor(b.q), k = c_tensor(b.k), v = c_tensor(b.v), dout = c_tensor(b.dout);
  const thdcp_tensor_t out = c_tensor(o.out), dq = c_tensor(o.dq), dk = c_tensor(o.dk), dv = c_tensor(o.dv);
  const test::Snapshot before =
      test::Snapshot().add(o.out).add(o.dq).add(o.dk).add(o.dv).add(o.lse).add(o.max_logit).add(r.dsinks);
  // v with D_qk where the plan has D_v = 16.
  thdcp_tensor_t v_wide = c_tensor(b.q);
  v_wide.heads = 2;
  EXPECT_C_STATUS(thdcp_attention_forward(plan, &layout, &q, &k, &v_wide, &out, o.lse.data(), nullptr, nullptr),
                  THDCP_ERROR_INVALID_ARGUMENT, "v is [", "but must be [max_tokens=", "kv_heads=2, v_head_dim=16]");
  thdcp_tensor_t out_wide = c_tensor(o.dq);
  EXPECT_C_STATUS(thdcp_attention_forward(plan, &layout, &q, &k, &v, &out_wide, o.lse.data(), nullptr, nullptr),
                  THDCP_ERROR_INVALID_ARGUMENT, "out is [", "q_heads=4, v_head_dim=16]");
  thdcp_attention_extras extras = THDCP_ATTENTION_EXTRAS_INIT;
  extras.sinks = sinks.data();
  extras.dsinks = r.dsinks.data();
  EXPECT_C_STATUS(thdcp_attention_forward_ex(plan, &layout, &q, &k, &v, &out, o.lse.data(), nullptr, &extras,
                                             nullptr),
                  THDCP_ERROR_INVALID_ARGUMENT, "thdcp_attention_forward_ex: extras->dsinks=",
                  "is set in a forward", "pass NULL here and dsinks to the backward");
  extras.sinks = nullptr;
  EXPECT_C_STATUS(thdcp_attention_backward_ex(plan, &layout, &q, &k, &v, &out, &dout, o.lse.data(), &dq, &dk, &dv,
                                              &extras, nullptr),
                  THDCP_ERROR_INVALID_ARGUMENT, "thdcp_attention_backward_ex: extras->dsinks=",
                  "is set but extras->sinks is NULL: pass the forward's sinks");
  extras.sinks = r.dsinks.data() + 2;  // the last two of dsinks' four floats
  EXPECT_C_STATUS(thdcp_attention_backward_ex(plan, &layout, &q, &k, &v, &out, &dout, o.lse.data(), &dq, &dk, &dv,
                                              &extras, nullptr),
                  THDCP_ERROR_INVALID_ARGUMENT, "overlaps extras->sinks=", "q_heads=4 floats each");
  extras.sinks = sinks.data();
  for (const size_t size : {size_t{16}, size_t{28}, THDCP_MAX_STRUCT_SIZE + 8}) {
    extras.struct_size = size;
    EXPECT_C_STATUS(thdcp_attention_backward_ex(plan, &layout, &q, &k, &v, &out, &dout, o.lse.data(), &dq, &dk,
                                                &dv, &extras, nullptr),
                    THDCP_ERROR_INVALID_ARGUMENT, "extras->struct_size=" + std::to_string(size),
                    "THDCP_ATTENTION_EXTRAS_INIT");
  }
  EXPECT_TRUE(before.unchanged()) << "a refused call wrote an output";
  EXPECT_C_OK(thdcp_attention_plan_destroy(plan));
}

// extras NULL, or with neither pointer, is the call without sinks.
TEST(CApiHeadDimsSinks, NoExtrasIsTheCallWithoutSinks) {
  const test::Batch b = batch_for(DType::kFloat32, 2, 2, 16, 24, 41);
  const thdcp_attention_params p = params_for(b, Mask::window(6, 0));
  const Result c = c_result(b, p, nullptr);
  Result plain = poisoned(b, 2);
  test::c_attention_on_host(&p, b, plain.outputs);
  EXPECT_TRUE(test::identical(c.outputs, plain.outputs));
  EXPECT_TRUE(test::identical(c.outputs, cpp_result(b, Mask::window(6, 0), nullptr).outputs));
}

}  // namespace
}  // namespace thdcp
