// The CPU reference against a naive fp64 implementation, a finite-difference gradient
// check, the no-visible-key and padding rules, determinism, and argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "support/naive_attention.h"
#include "support/outputs.h"
#include "support/random_batch.h"
#include "thdcp/cpu/attention.h"
#include "thdcp/plan/segment_table.h"

namespace thdcp {
namespace {

// |actual - ref| <= rtol |ref| + atol_scale max|ref|, with infinities equal only to
// themselves and NaN never passing.
template <typename Get>
::testing::AssertionResult close_to_naive(const char* name, Get actual, const std::vector<double>& ref,
                                          const Tolerance& tol) {
  double ref_max = 0;
  for (double r : ref) {
    if (std::isfinite(r)) ref_max = std::max(ref_max, std::fabs(r));
  }
  for (size_t i = 0; i < ref.size(); ++i) {
    const double a = actual(i), r = ref[i];
    bool ok;
    if (std::isnan(a)) {
      ok = false;
    } else if (std::isinf(r) || std::isinf(a)) {
      ok = a == r;
    } else {
      ok = std::fabs(a - r) <= tol.rtol * std::fabs(r) + tol.atol_scale * ref_max;
    }
    if (!ok) {
      return ::testing::AssertionFailure() << name << "[" << i << "] = " << a << ", naive fp64 " << r
                                           << " (rtol " << tol.rtol << ", atol " << tol.atol_scale * ref_max << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

using test::Outputs;

Outputs run_reference(const SegmentTable& table, const test::Batch& b, const AttentionOptions& options) {
  Outputs o = test::poisoned_outputs(b, b.q.tokens(), b.q.dtype(), b.k.dtype());
  test::cpu_reference(table, b, options, o);
  return o;
}

using ReferenceCase = std::tuple<DType, Mask, int /*gqa ratio*/, Accumulate>;

class ReferenceVsNaive : public ::testing::TestWithParam<ReferenceCase> {};

TEST_P(ReferenceVsNaive, AllOutputsMatch) {
  const auto [dtype, mask, ratio, accumulate] = GetParam();
  const int64_t kv_heads = 2, q_heads = kv_heads * ratio, dim = 16;
  Rng rng(static_cast<uint64_t>(static_cast<int>(dtype) * 131 + mask.window_left * 7 + mask.window_right + ratio));
  std::vector<int64_t> lengths = test::random_lengths(rng, 4, 90);
  lengths.push_back(1);
  lengths.push_back(0);
  const BatchLayout layout = make_layout(lengths, 3);  // padding rows between sequences
  const test::Batch b = test::make_batch(layout, dtype, q_heads, kv_heads, dim, rng.next());
  AttentionOptions options;
  options.accumulate = accumulate;
  options.num_threads = 2;
  const Outputs o = run_reference(build_segment_table(layout.view(), mask), b, options);

  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  const test::NaiveResult n = test::naive_attention(layout.view(), mask, b.q, b.k, b.v, b.dout, o.out, scale);
  const Tolerance storage = derive_tolerance(dtype, accumulate, 1);
  const Tolerance fp32 = derive_tolerance(DType::kFloat32, accumulate, 1);
  auto tensor = [](const HostTensor& t) { return [&t](size_t i) { return static_cast<double>(t.get(i)); }; };
  auto floats = [](const std::vector<float>& v) { return [&v](size_t i) { return static_cast<double>(v[i]); }; };
  EXPECT_TRUE(close_to_naive("out", tensor(o.out), n.out, storage));
  EXPECT_TRUE(close_to_naive("lse", floats(o.lse), n.lse, fp32));
  EXPECT_TRUE(close_to_naive("max_logit", floats(o.max_logit), n.max_logit, fp32));
  EXPECT_TRUE(close_to_naive("dq", tensor(o.dq), n.dq, storage));
  EXPECT_TRUE(close_to_naive("dk", tensor(o.dk), n.dk, storage));
  EXPECT_TRUE(close_to_naive("dv", tensor(o.dv), n.dv, storage));
}

std::string case_name(const ::testing::TestParamInfo<ReferenceCase>& param_info) {
  const auto& [dtype, mask, ratio, accumulate] = param_info.param;
  return std::string(dtype_name(dtype)) + "_" + test::mask_label(mask) + "_gqa" + std::to_string(ratio) +
         (accumulate == Accumulate::kFloat64 ? "_acc64" : "_acc32");
}

INSTANTIATE_TEST_SUITE_P(Cases, ReferenceVsNaive,
                         ::testing::Combine(::testing::Values(DType::kBFloat16, DType::kFloat16, DType::kFloat32),
                                            ::testing::ValuesIn(test::all_test_masks()), ::testing::Values(1, 4),
                                            ::testing::Values(Accumulate::kFloat32, Accumulate::kFloat64)),
                         case_name);

TEST(ReferenceAttention, FiniteDifferenceGradients) {
  // loss = sum(out * dout); its gradient is what backward returns for upstream dout.
  const BatchLayout layout = make_layout({5, 3}, 1);
  test::Batch b = test::make_batch(layout, DType::kFloat32, 2, 1, 8, 3);
  const SegmentTable table = build_segment_table(layout.view(), Mask::window(3, 1));
  AttentionOptions options;
  options.accumulate = Accumulate::kFloat64;
  const Outputs o = run_reference(table, b, options);
  auto loss = [&]() {
    HostTensor out(DType::kFloat32, b.q.tokens(), b.q.heads(), b.q.head_dim());
    std::vector<float> lse(static_cast<size_t>(b.q.heads() * b.q.tokens()));
    cpu::attention_forward(table, b.q.view(), b.k.view(), b.v.view(), out.view(), lse.data(), nullptr, options);
    double sum = 0;
    for (int64_t i = 0; i < out.numel(); ++i) sum += static_cast<double>(out.get(i)) * b.dout.get(i);
    return sum;
  };
  const double h = 1e-2;
  int checked = 0;
  for (auto [input, grad] : {std::make_pair(&b.q, &o.dq), std::make_pair(&b.k, &o.dk), std::make_pair(&b.v, &o.dv)}) {
    for (int64_t i = 0; i < input->numel(); ++i) {
      const float x = input->get(i);
      input->set(i, x + static_cast<float>(h));
      const double up = loss();
      input->set(i, x - static_cast<float>(h));
      const double down = loss();
      input->set(i, x);
      const double numeric = (up - down) / (2 * h);
      // Central differences err by O(h^2) times the third derivative; fp32 storage of out
      // adds ~1e-7 * |loss| / h.
      EXPECT_NEAR(grad->get(i), numeric, 2e-3 + 2e-3 * std::fabs(numeric)) << "element " << i;
      ++checked;
    }
  }
  EXPECT_EQ(checked, b.q.numel() + b.k.numel() + b.v.numel());  // padding rows too: their gradient is 0
}

TEST(ReferenceAttention, RowsThatSeeNoKeyAndPaddingRows) {
  // A hand-made table: queries at positions 100.. of a sequence whose keys are positions
  // 0..9, window (16, 0): no query sees a key. Rows 12..15 are padding of the segment.
  const BatchLayout layout = make_layout({12}, 2);  // 12 rows, padded to 12 (cp 2: multiple of 4)
  test::Batch b = test::make_batch(make_layout({10, 6}, 1), DType::kBFloat16, 2, 2, 8, 5);
  SegmentTable table;
  table.q_rows = table.k_rows = 16;
  table.mask = Mask::window(16, 0);
  Segment s = single_device_segment(0, 16, 12);
  s.q_pos = 100;
  s.k_len = 10;
  table.segments = {s};
  const Outputs o = run_reference(table, b, AttentionOptions{});
  for (int64_t i = 0; i < o.out.numel(); ++i) ASSERT_EQ(o.out.get(i), 0.0f);
  for (float x : o.lse) ASSERT_EQ(x, -std::numeric_limits<float>::infinity());
  for (float x : o.max_logit) ASSERT_EQ(x, -std::numeric_limits<float>::infinity());
  for (const HostTensor* t : {&o.dq, &o.dk, &o.dv}) {
    for (int64_t i = 0; i < t->numel(); ++i) ASSERT_EQ(t->get(i), 0.0f);
  }
  (void)layout;
}

TEST(ReferenceAttention, PaddingRowsAreExactlyZero) {
  const BatchLayout layout = make_layout({5, 9, 1}, 4);  // padded to 8, 16, 8
  const test::Batch b = test::make_batch(layout, DType::kBFloat16, 4, 2, 16, 9);
  const Outputs o = run_reference(build_segment_table(layout.view(), Mask::causal()), b, AttentionOptions{});
  const LayoutView view = layout.view();
  for (int seq = 0; seq < view.num_seqs; ++seq) {
    for (int64_t row = view.padded_start(seq) + view.length(seq); row < view.padded_start(seq + 1); ++row) {
      for (int64_t e = 0; e < 4 * 16; ++e) {
        ASSERT_EQ(o.out.get(row * 64 + e), 0.0f);
        ASSERT_EQ(o.dq.get(row * 64 + e), 0.0f);
      }
      for (int64_t e = 0; e < 2 * 16; ++e) {
        ASSERT_EQ(o.dk.get(row * 32 + e), 0.0f);
        ASSERT_EQ(o.dv.get(row * 32 + e), 0.0f);
      }
      for (int64_t h = 0; h < 4; ++h) ASSERT_EQ(o.lse[h * layout.total_rows() + row], -INFINITY);
    }
  }
}

TEST(ReferenceAttention, BitwiseDeterministicAcrossThreadCounts) {
  const BatchLayout layout = make_layout({40, 33, 70, 2}, 2);
  const test::Batch b = test::make_batch(layout, DType::kFloat32, 4, 2, 16, 21);
  const SegmentTable table = build_segment_table(layout.view(), Mask::window(20, 5));
  AttentionOptions one, many;
  one.num_threads = 1;
  many.num_threads = 5;
  const Outputs a = run_reference(table, b, one);
  const Outputs c = run_reference(table, b, many);
  for (auto [x, y] : {std::make_pair(&a.out, &c.out), std::make_pair(&a.dq, &c.dq), std::make_pair(&a.dk, &c.dk),
                      std::make_pair(&a.dv, &c.dv)}) {
    EXPECT_EQ(0, std::memcmp(x->data(), y->data(), x->numel() * sizeof(float)));
  }
  EXPECT_EQ(a.lse, c.lse);
}

TEST(ReferenceAttention, BadInputIsRejectedBeforeAnyOutputIsWritten) {
  const BatchLayout layout = make_layout({6, 2}, 1);
  const test::Batch b = test::make_batch(layout, DType::kBFloat16, 4, 2, 16, 1);
  const SegmentTable table = build_segment_table(layout.view(), Mask::causal());
  HostTensor out(DType::kBFloat16, 8, 4, 16);
  std::vector<float> lse(32), max_logit(4);
  test::poison(out);
  test::poison(lse);
  auto forward = [&](ConstThdTensor q, ConstThdTensor k, ConstThdTensor v, ThdTensor o, float* l) {
    cpu::attention_forward(table, q, k, v, o, l, max_logit.data(), AttentionOptions{});
  };
  const HostTensor q3(DType::kBFloat16, 8, 3, 16);
  EXPECT_THDCP_ERROR(forward(q3.view(), b.k.view(), b.v.view(), out.view(), lse.data()),
                     "q_heads=3, kv_heads=2: need kv_heads >= 1 and q_heads a multiple of kv_heads");
  const HostTensor q12(DType::kBFloat16, 8, 4, 12);
  EXPECT_THDCP_ERROR(forward(q12.view(), b.k.view(), b.v.view(), out.view(), lse.data()), "head_dim=12 is not supported");
  const HostTensor k_short(DType::kBFloat16, 6, 2, 16);
  EXPECT_THDCP_ERROR(forward(b.q.view(), k_short.view(), b.v.view(), out.view(), lse.data()),
                     "k is [6, 2, 16] but must be [k_rows=8, kv_heads=2, head_dim=16]");
  const HostTensor v_fp16(DType::kFloat16, 8, 2, 16);
  EXPECT_THDCP_ERROR(forward(b.q.view(), b.k.view(), v_fp16.view(), out.view(), lse.data()), "v has dtype fp16 but must be bf16");
  EXPECT_THDCP_ERROR(forward(b.q.view(), b.k.view(), b.v.view(), out.view(), nullptr), "lse must point to");
  HostTensor out_fp32(DType::kFloat32, 8, 4, 16);
  EXPECT_THDCP_ERROR(forward(b.q.view(), b.k.view(), b.v.view(), out_fp32.view(), lse.data()),
                     "out has dtype fp32 but must be bf16");
  AttentionOptions bad_scale;
  bad_scale.softmax_scale = -1.0f;
  EXPECT_THDCP_ERROR(cpu::attention_forward(table, b.q.view(), b.k.view(), b.v.view(), out.view(), lse.data(),
                                            nullptr, bad_scale),
                     "softmax_scale=-1");
  HostTensor dq_fp16(DType::kFloat16, 8, 4, 16), dk(DType::kBFloat16, 8, 2, 16), dv(DType::kBFloat16, 8, 2, 16);
  EXPECT_THDCP_ERROR(cpu::attention_backward(table, b.q.view(), b.k.view(), b.v.view(), out.view(), b.dout.view(),
                                             lse.data(), dq_fp16.view(), dk.view(), dv.view()),
                     "dq has dtype fp16 but must be bf16 or fp32");
  // Nothing was written by any failed call.
  for (int64_t i = 0; i < out.numel(); ++i) ASSERT_TRUE(std::isnan(out.get(i)));
  for (float x : lse) ASSERT_TRUE(std::isnan(x));
}

}  // namespace
}  // namespace thdcp
