// Single-device attention through the C ABI equals the C++ API (thdcp::cpu) bit for bit, on
// a varlen batch with padding and an empty sequence, for causal, full, a window and GQA, and
// through head-major strided thdcp_tensor_t views;
// and an older, shorter params struct is accepted with the defaults of the fields it lacks.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "support/capi/capi_support.h"
#include "support/outputs.h"
#include "support/random_batch.h"
#include "support/strided_views.h"
#include "thdcp/cpu/attention.h"
#include "thdcp/plan/segment_table.h"
#include "thdcp/thdcp.h"

namespace thdcp {
namespace {

using test::c_layout;
using test::c_tensor;

using test::Outputs;

// The C++ API: one segment per sequence, the CPU reference.
Outputs cpp_result(const test::Batch& b, const Mask& mask, const AttentionOptions& options, DType dq_dtype,
                   DType dkv_dtype) {
  Outputs r = test::poisoned_outputs(b, b.q.tokens(), dq_dtype, dkv_dtype);
  test::cpu_reference(build_segment_table(b.layout.view(), mask), b, options, r);
  return r;
}

// The same through the C ABI, with a plan of `params`.
Outputs c_result(const test::Batch& b, const thdcp_attention_params* params, DType dq_dtype, DType dkv_dtype) {
  Outputs r = test::poisoned_outputs(b, b.q.tokens(), dq_dtype, dkv_dtype);
  size_t workspace_bytes = 1;
  EXPECT_C_OK(thdcp_attention_plan_workspace_size(params, &workspace_bytes));
  EXPECT_EQ(workspace_bytes, 0u) << "the CPU backend needs no workspace";
  test::c_attention_on_host(params, b, r);
  return r;
}

// Lengths with an empty sequence, a length-1 one and lengths that are not multiples of 4,
// padded to multiples of 4 (make_layout at cp = 2), so padding rows lie inside the batch.
test::Batch varlen_batch(DType dtype, int64_t q_heads, int64_t kv_heads, int64_t head_dim, uint64_t seed) {
  return test::make_batch(make_layout({37, 0, 64, 1, 90, 13}, 2), dtype, q_heads, kv_heads, head_dim, seed);
}

thdcp_attention_params params_for(const test::Batch& b, const Mask& mask, int extra_seqs) {
  thdcp_attention_params p;
  thdcp_attention_params_init(&p);
  test::set_shape(p, test::batch_shape(b, mask), Capacity{b.layout.num_seqs() + extra_seqs, b.q.tokens()});
  p.num_threads = 2;
  return p;
}

using Case = std::tuple<std::string, Mask, int /*q_heads*/, int /*kv_heads*/, DType, bool /*fp32 grads*/>;

class CApiEqualsCpp : public ::testing::TestWithParam<Case> {};

TEST_P(CApiEqualsCpp, ForwardAndBackwardBitForBit) {
  const auto& [label, mask, q_heads, kv_heads, dtype, fp32_grads] = GetParam();
  const test::Batch b = varlen_batch(dtype, q_heads, kv_heads, 16, 11 + q_heads * 3 + kv_heads);
  thdcp_attention_params p = params_for(b, mask, /*extra_seqs=*/3);  // num_seqs < max_seqs
  p.softmax_scale = label == "scaled" ? 0.2f : 0.0f;
  const DType grad = fp32_grads ? DType::kFloat32 : dtype;
  if (fp32_grads) p.dq_dtype = p.dkv_dtype = THDCP_DTYPE_FP32;
  AttentionOptions options;
  options.softmax_scale = p.softmax_scale;
  options.num_threads = 2;
  const Outputs cpp = cpp_result(b, mask, options, grad, grad);
  const Outputs c = c_result(b, &p, grad, grad);
  EXPECT_TRUE(test::identical(c, cpp)) << "the C ABI differs from the C++ API";
}

INSTANTIATE_TEST_SUITE_P(
    Masks, CApiEqualsCpp,
    ::testing::Values(Case{"causal", Mask::causal(), 2, 2, DType::kBFloat16, false},
                      Case{"full", Mask::full(), 2, 2, DType::kBFloat16, false},
                      Case{"window", Mask::window(16, 4), 2, 2, DType::kBFloat16, false},
                      Case{"causal_window", Mask::window(8, 0), 2, 2, DType::kFloat16, false},
                      Case{"gqa", Mask::causal(), 4, 2, DType::kBFloat16, false},
                      Case{"mqa", Mask::window(10, 10), 4, 1, DType::kBFloat16, true},
                      Case{"scaled", Mask::full(), 2, 1, DType::kFloat32, false}),
    [](const ::testing::TestParamInfo<Case>& param_info) { return std::get<0>(param_info.param); });

// A thdcp_tensor_t of a view (its strides as the C caller writes them).
thdcp_tensor_t c_view(const ConstThdTensor& t) {
  thdcp_tensor_t c{};
  c.data = const_cast<void*>(t.data);
  c.rows = t.tokens;
  c.heads = t.heads;
  c.head_dim = t.head_dim;
  c.row_stride = t.row_stride;
  c.head_stride = t.head_stride;
  c.dtype = test::c_dtype(t.dtype);
  return c;
}

// Head-major q, k, v and dq, dk, dv ([H, S, D] memory, S a cache's rows above T: row_stride
// = D, head_stride = S * D) through the C ABI equal contiguous tensors bit for bit; an output
// written over an input is refused naming both.
TEST(CApiStrides, HeadMajorViewsEqualContiguousTensors) {
  const test::Batch b = varlen_batch(DType::kBFloat16, 4, 2, 16, 77);
  const thdcp_attention_params p = params_for(b, Mask::causal(), 1);
  const Outputs reference = c_result(b, &p, DType::kBFloat16, DType::kBFloat16);
  const int64_t rows = b.q.tokens(), d = 16;
  const test::GroupLayout in = test::arrange(test::Arrangement::kHeadMajor, rows, {4, 2, 2, 4}, d);
  std::vector<unsigned char> inputs = test::poisoned_image(DType::kBFloat16, in.elements);
  const test::GroupLayout out = test::arrange(test::Arrangement::kHeadMajor, rows, {4, 4, 2, 2}, d);
  std::vector<unsigned char> outputs = test::poisoned_image(DType::kBFloat16, out.elements);
  std::vector<ThdTensor> views;
  for (size_t i = 0; i < 4; ++i) {
    views.push_back(test::placed_view(inputs.data(), DType::kBFloat16, rows, i == 1 || i == 2 ? 2 : 4, d,
                                      in.placements[i]));
  }
  for (size_t i = 0; i < 4; ++i) {
    views.push_back(test::placed_view(outputs.data(), DType::kBFloat16, rows, i < 2 ? 4 : 2, d, out.placements[i]));
  }
  test::scatter_into(b.q, views[0]);
  test::scatter_into(b.k, views[1]);
  test::scatter_into(b.v, views[2]);
  test::scatter_into(b.dout, views[3]);
  std::vector<thdcp_tensor_t> c;
  for (const ThdTensor& v : views) c.push_back(c_view(v));
  Outputs got = test::poisoned_outputs(b, rows, DType::kBFloat16, DType::kBFloat16);
  thdcp_attention_plan_t plan = nullptr;
  ASSERT_C_OK(thdcp_attention_plan_create(&p, nullptr, 0, &plan));
  const thdcp_layout_t layout = c_layout(b.layout);
  EXPECT_C_OK(thdcp_attention_forward(plan, &layout, &c[0], &c[1], &c[2], &c[4], got.lse.data(),
                                      got.max_logit.data(), nullptr));
  EXPECT_C_OK(thdcp_attention_backward(plan, &layout, &c[0], &c[1], &c[2], &c[4], &c[3], got.lse.data(), &c[5],
                                       &c[6], &c[7], nullptr));
  got.out = test::gather_from(views[4]);
  got.dq = test::gather_from(views[5]);
  got.dk = test::gather_from(views[6]);
  got.dv = test::gather_from(views[7]);
  EXPECT_TRUE(test::identical(got, reference));
  EXPECT_TRUE(test::poison_kept_outside(outputs, {views[4], views[5], views[6], views[7]}));
  // dq over q: refused, naming both, nothing written.
  const test::Snapshot before = test::Snapshot().add(inputs.data(), inputs.size()).add(outputs.data(), outputs.size());
  EXPECT_C_STATUS(thdcp_attention_backward(plan, &layout, &c[0], &c[1], &c[2], &c[4], &c[3], got.lse.data(), &c[0],
                                           &c[6], &c[7], nullptr),
                  THDCP_ERROR_INVALID_ARGUMENT, "dq and q share memory");
  EXPECT_TRUE(before.unchanged());
  EXPECT_C_OK(thdcp_attention_plan_destroy(plan));
}

// The first version of thdcp_attention_params: the fields before `deterministic`, as a caller
// compiled against that header would pass it.
struct AttentionParamsV1 {
  size_t struct_size;
  thdcp_backend_t backend;
  thdcp_dtype_t dtype;
  int64_t max_tokens;
  int64_t q_heads;
  int64_t kv_heads;
  int64_t head_dim;
  int32_t max_seqs;
  int32_t window_left;
  int32_t window_right;
  float softmax_scale;
};
static_assert(sizeof(AttentionParamsV1) == THDCP_ATTENTION_PARAMS_MIN_SIZE, "the first version is 64 bytes");
static_assert(sizeof(thdcp_attention_params) % 8 == 0, "versions end on 8-byte boundaries");

TEST(CApiVersioning, OlderShorterParamsTakeTheDefaults) {
  const test::Batch b = varlen_batch(DType::kBFloat16, 4, 2, 16, 5);
  AttentionParamsV1 old{};
  old.struct_size = sizeof(old);
  old.backend = THDCP_BACKEND_CPU;
  old.dtype = THDCP_DTYPE_BF16;
  old.max_tokens = b.q.tokens();
  old.q_heads = 4;
  old.kv_heads = 2;
  old.head_dim = 16;
  old.max_seqs = b.layout.num_seqs();
  old.window_left = -1;
  old.window_right = 0;
  const auto* as_current = reinterpret_cast<const thdcp_attention_params*>(&old);
  // Defaults of the missing fields: gradients in the plan's dtype, every hardware thread.
  const Outputs c = c_result(b, as_current, DType::kBFloat16, DType::kBFloat16);
  const Outputs cpp = cpp_result(b, Mask::causal(), AttentionOptions{}, DType::kBFloat16, DType::kBFloat16);
  EXPECT_TRUE(test::identical(c, cpp)) << "the C ABI differs from the C++ API";

  // The defaulted dq_dtype is the plan's dtype: an fp32 dq is refused, naming it.
  thdcp_attention_plan_t plan = nullptr;
  ASSERT_C_OK(thdcp_attention_plan_create(as_current, nullptr, 0, &plan));
  Outputs r = test::poisoned_outputs(b, b.q.tokens(), DType::kFloat32, DType::kBFloat16);
  const thdcp_layout_t layout = c_layout(b.layout);
  const thdcp_tensor_t q = c_tensor(b.q), k = c_tensor(b.k), v = c_tensor(b.v), dout = c_tensor(b.dout);
  const thdcp_tensor_t out = c_tensor(cpp.out), dq = c_tensor(r.dq), dk = c_tensor(r.dk), dv = c_tensor(r.dv);
  EXPECT_C_STATUS(thdcp_attention_backward(plan, &layout, &q, &k, &v, &out, &dout, cpp.lse.data(), &dq, &dk, &dv,
                                           nullptr),
                  THDCP_ERROR_INVALID_ARGUMENT, "dq has dtype fp32 but must be bf16");
  EXPECT_C_OK(thdcp_attention_plan_destroy(plan));
}

TEST(CApiVersioning, ANewerLongerStructIsAcceptedWhenItsExtraBytesAreZero) {
  struct Newer {
    thdcp_attention_params current;
    int64_t future_field;  // a field this library does not know
  };
  Newer newer{};
  thdcp_attention_params_init(&newer.current);
  newer.current.struct_size = sizeof(Newer);
  newer.current.max_tokens = 64;
  newer.current.max_seqs = 2;
  newer.current.q_heads = newer.current.kv_heads = 1;
  newer.current.head_dim = 8;
  size_t bytes = 1;
  EXPECT_C_OK(thdcp_attention_plan_workspace_size(&newer.current, &bytes));
  newer.future_field = 1;
  EXPECT_C_STATUS(thdcp_attention_plan_workspace_size(&newer.current, &bytes), THDCP_ERROR_INVALID_ARGUMENT,
                  "thdcp_attention_plan_workspace_size: params->struct_size=96",
                  "byte 88 past them is not 0", "link the libthdcp of that thdcp.h");
}

// The largest struct_size is THDCP_MAX_STRUCT_SIZE: a struct of that many bytes, the unknown
// ones 0, is accepted; a nonzero byte in them is named; 8 bytes more, or a garbage value, is
// refused before anything past the field is read (the buffer has only 4096 bytes:
// under ASan a read past them fails the test).
TEST(CApiVersioning, StructSizeIsBoundedByTheDocumentedMaximum) {
  std::vector<unsigned char> buffer(THDCP_MAX_STRUCT_SIZE, 0);
  auto* p = reinterpret_cast<thdcp_attention_params*>(buffer.data());
  thdcp_attention_params_init(p);
  p->max_tokens = 64;
  p->max_seqs = 2;
  p->q_heads = p->kv_heads = 1;
  p->head_dim = 8;
  p->struct_size = THDCP_MAX_STRUCT_SIZE;
  size_t bytes = 1;
  EXPECT_C_OK(thdcp_attention_plan_workspace_size(p, &bytes));
  buffer.back() = 1;
  EXPECT_C_STATUS(thdcp_attention_plan_workspace_size(p, &bytes), THDCP_ERROR_INVALID_ARGUMENT,
                  "params->struct_size=4096", "byte 4095 past them is not 0");
  for (const size_t garbage : {THDCP_MAX_STRUCT_SIZE + 8, size_t{1} << 40, ~size_t{0} - 7}) {
    p->struct_size = garbage;
    bytes = 12345;
    EXPECT_C_STATUS(thdcp_attention_plan_workspace_size(p, &bytes), THDCP_ERROR_INVALID_ARGUMENT,
                    "params->struct_size=" + std::to_string(garbage), "larger than THDCP_MAX_STRUCT_SIZE=4096",
                    "set struct_size = sizeof(thdcp_attention_params)");
    EXPECT_EQ(bytes, 12345u);
  }
  // The output struct of the planner is bounded the same way, and not written.
  thdcp_capacity_plan_params plan = THDCP_CAPACITY_PLAN_PARAMS_INIT;
  plan.tokens = 64;
  const int64_t lengths[] = {5, 9};
  thdcp_capacity_plan_result result{};
  result.struct_size = size_t{1} << 33;
  EXPECT_C_STATUS(thdcp_plan_capacity(lengths, 2, &plan, &result), THDCP_ERROR_INVALID_ARGUMENT,
                  "result->struct_size=8589934592 is larger than THDCP_MAX_STRUCT_SIZE");
  EXPECT_EQ(result.batches, 0);
  plan.struct_size = 4104;
  result.struct_size = sizeof(result);
  EXPECT_C_STATUS(thdcp_plan_capacity(lengths, 2, &plan, &result), THDCP_ERROR_INVALID_ARGUMENT,
                  "params->struct_size=4104 is larger than THDCP_MAX_STRUCT_SIZE");
}

}  // namespace
}  // namespace thdcp
