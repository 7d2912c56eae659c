// The CPU backend on strided views: inputs (q, k, v, dout) and outputs (out, dq, dk, dv) in
// every arrangement of support/strided_views.h (packed QKV and dQKV, padded rows and heads,
// head-major [H, T, D] as transformers' KV cache holds K/V, rows interleaved with heads) give
// the bits of the same call on contiguous copies, forward and backward, with GQA and fp32
// gradients; nothing is written outside the output views and the inputs keep their values.
// Outputs that overlap themselves or another tensor are refused, naming them.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "support/expect_error.h"
#include "support/outputs.h"
#include "support/random_batch.h"
#include "support/strided_views.h"
#include "thdcp/cpu/attention.h"
#include "thdcp/plan/segment_table.h"

namespace thdcp {
namespace {

using test::Arrangement;

struct StridedCall {
  std::vector<unsigned char> inputs, dout, outputs, grads;  // host images, poisoned first
  ThdTensor q, k, v, dout_view, out, dq, dk, dv;
};

// The views of one call: q, k, v in one buffer and dout in another (arranged as `in`), out in
// one and dq, dk, dv in another (arranged as `out`); inputs hold the batch's values.
StridedCall strided_call(const test::Batch& b, Arrangement in, Arrangement out, DType grad_dtype) {
  const DType dtype = b.q.dtype();
  const int64_t rows = b.q.tokens(), hq = b.q.heads(), hkv = b.k.heads(), d = b.q.head_dim();
  StridedCall c;
  const test::GroupLayout qkv = test::arrange(in, rows, {hq, hkv, hkv}, d);
  const test::GroupLayout dout = test::arrange(in, rows, {hq}, d);
  const test::GroupLayout o = test::arrange(out, rows, {hq}, d);
  const test::GroupLayout grads = test::arrange(out, rows, {hq, hkv, hkv}, d);
  c.inputs = test::poisoned_image(dtype, qkv.elements);
  c.dout = test::poisoned_image(dtype, dout.elements);
  c.outputs = test::poisoned_image(dtype, o.elements);
  c.grads = test::poisoned_image(grad_dtype, grads.elements);
  c.q = test::placed_view(c.inputs.data(), dtype, rows, hq, d, qkv.placements[0]);
  c.k = test::placed_view(c.inputs.data(), dtype, rows, hkv, d, qkv.placements[1]);
  c.v = test::placed_view(c.inputs.data(), dtype, rows, hkv, d, qkv.placements[2]);
  c.dout_view = test::placed_view(c.dout.data(), dtype, rows, hq, d, dout.placements[0]);
  c.out = test::placed_view(c.outputs.data(), dtype, rows, hq, d, o.placements[0]);
  c.dq = test::placed_view(c.grads.data(), grad_dtype, rows, hq, d, grads.placements[0]);
  c.dk = test::placed_view(c.grads.data(), grad_dtype, rows, hkv, d, grads.placements[1]);
  c.dv = test::placed_view(c.grads.data(), grad_dtype, rows, hkv, d, grads.placements[2]);
  test::scatter_into(b.q, c.q);
  test::scatter_into(b.k, c.k);
  test::scatter_into(b.v, c.v);
  test::scatter_into(b.dout, c.dout_view);
  return c;
}

using StrideParam = std::tuple<Arrangement /*inputs*/, Arrangement /*outputs*/>;

class ReferenceStrides : public ::testing::TestWithParam<StrideParam> {};

TEST_P(ReferenceStrides, BitEqualToContiguousCopies) {
  const auto [in, out] = GetParam();
  int runs = 0;
  for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
    for (int ratio : {1, 4}) {
      for (const Mask& mask : {Mask::causal(), Mask::full(), Mask::window(7, 3)}) {
        for (bool fp32_grads : {false, true}) {
          if (fp32_grads && dtype == DType::kFloat32) continue;
          const DType grad_dtype = fp32_grads ? DType::kFloat32 : dtype;
          SCOPED_TRACE(std::string(dtype_name(dtype)) + " gqa " + std::to_string(ratio) + " " +
                       test::mask_label(mask) + (fp32_grads ? " fp32 grads" : ""));
          const BatchLayout layout = make_layout({37, 1, 0, 60, 12}, 3);
          const test::Batch b =
              test::make_batch(layout, dtype, 2 * ratio, 2, 16, static_cast<uint64_t>(1000 + 17 * runs++));
          const SegmentTable table = build_segment_table(layout.view(), mask);
          AttentionOptions options;
          options.num_threads = 2;
          test::Outputs ref = test::poisoned_outputs(b, b.q.tokens(), grad_dtype, grad_dtype);
          test::cpu_reference(table, b, options, ref);

          StridedCall c = strided_call(b, in, out, grad_dtype);
          const std::vector<unsigned char> inputs_before = c.inputs, dout_before = c.dout;
          test::Outputs got = test::poisoned_outputs(b, b.q.tokens(), grad_dtype, grad_dtype);
          cpu::attention_forward(table, c.q, c.k, c.v, c.out, got.lse.data(), got.max_logit.data(), options);
          cpu::attention_backward(table, c.q, c.k, c.v, c.out, c.dout_view, got.lse.data(), c.dq, c.dk, c.dv, options);
          got.out = test::gather_from(c.out);
          got.dq = test::gather_from(c.dq);
          got.dk = test::gather_from(c.dk);
          got.dv = test::gather_from(c.dv);
          EXPECT_TRUE(test::identical(got, ref));
          EXPECT_TRUE(test::poison_kept_outside(c.outputs, {c.out})) << "out";
          EXPECT_TRUE(test::poison_kept_outside(c.grads, {c.dq, c.dk, c.dv})) << "dq, dk, dv";
          EXPECT_TRUE(c.inputs == inputs_before && c.dout == dout_before) << "an input was written";
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Arrangements, ReferenceStrides,
                         ::testing::Combine(::testing::ValuesIn(test::all_arrangements()),
                                            ::testing::ValuesIn(test::all_arrangements())),
                         [](const ::testing::TestParamInfo<StrideParam>& param_info) {
                           return std::string("inputs_") + test::arrangement_name(std::get<0>(param_info.param)) +
                                  "_outputs_" + test::arrangement_name(std::get<1>(param_info.param));
                         });

// Inputs may overlap each other and themselves (read only): q, k and v as one view of the same
// memory, and a k whose rows overlap, give the result of distinct copies of those values.
TEST(ReferenceStrides, OverlappingInputsAreRead) {
  const BatchLayout layout = make_layout({20, 9}, 1);
  const int64_t rows = layout.total_rows(), d = 16;
  const test::Batch b = test::make_batch(layout, DType::kFloat32, 2, 2, d, 5);
  // k: every row is the previous one shifted by 8 elements (rows overlap).
  std::vector<float> shifted(static_cast<size_t>((rows - 1) * 8 + 2 * d));
  for (size_t i = 0; i < shifted.size(); ++i) shifted[i] = static_cast<float>(i % 13) * 0.25f - 1.0f;
  const ConstThdTensor k_overlapping(shifted.data(), DType::kFloat32, rows, 2, d, 8, d);
  const HostTensor k_copy = test::gather_from(k_overlapping);
  const SegmentTable table = build_segment_table(layout.view(), Mask::causal());
  test::Outputs ref = test::poisoned_outputs(b, rows, DType::kFloat32, DType::kFloat32);
  test::Outputs got = test::poisoned_outputs(b, rows, DType::kFloat32, DType::kFloat32);
  cpu::attention_forward(table, b.q.view(), k_copy.view(), b.q.view(), ref.out.view(), ref.lse.data(),
                         ref.max_logit.data());
  cpu::attention_forward(table, b.q.view(), k_overlapping, b.q.view(), got.out.view(), got.lse.data(),
                         got.max_logit.data());
  EXPECT_TRUE(test::same_bits(got.out, ref.out));
  EXPECT_TRUE(test::same_bits(got.lse, ref.lse));
}

// Outputs that overlap themselves, each other or an input are refused before anything is
// written, naming the tensors and the fix.
TEST(ReferenceStrides, OverlappingOutputsAreRefused) {
  const BatchLayout layout = make_layout({20, 12}, 1);
  const int64_t rows = layout.total_rows(), d = 16;
  const test::Batch b = test::make_batch(layout, DType::kBFloat16, 4, 2, d, 9);
  const SegmentTable table = build_segment_table(layout.view(), Mask::causal());
  test::Outputs o = test::poisoned_outputs(b, rows, DType::kBFloat16, DType::kBFloat16);
  HostTensor wide(DType::kBFloat16, rows, 8, d);
  // Head-major out one element short of rows * head_dim per head.
  const ThdTensor short_heads(wide.data(), DType::kBFloat16, rows, 4, d, d, rows * d - 1);
  test::expect_error(
      [&] {
        cpu::attention_forward(table, b.q.view(), b.k.view(), b.v.view(), short_heads, o.lse.data(), nullptr);
      },
      {"out is [32, 4, 16] with row_stride=16 and head_stride=511: its elements", "share an address",
       "head_stride >= (rows - 1) * row_stride + head_dim = 512"});
  // out written over q.
  HostTensor q_copy = b.q;
  test::expect_error(
      [&] {
        cpu::attention_forward(table, q_copy.view(), b.k.view(), b.v.view(), q_copy.view(), o.lse.data(), nullptr);
      },
      {"out and q share memory", "give out memory of its own"});
  // dk and dv as one view.
  test::expect_error(
      [&] {
        cpu::attention_backward(table, b.q.view(), b.k.view(), b.v.view(), o.out.view(), b.dout.view(), o.lse.data(),
                                o.dq.view(), o.dk.view(), o.dk.view());
      },
      {"dk and dv share memory"});
  // Negative strides.
  test::expect_error(
      [&] {
        cpu::attention_forward(table, b.q.view(), ConstThdTensor(b.k.data(), DType::kBFloat16, rows, 2, d, -32, 0),
                               b.v.view(), o.out.view(), o.lse.data(), nullptr);
      },
      {"k has row_stride=-32 and head_stride=0: strides are in elements, >= 0 (0 means contiguous)"});
  test::Outputs poisoned = test::poisoned_outputs(b, rows, DType::kBFloat16, DType::kBFloat16);
  EXPECT_TRUE(test::same_bits(o.out, poisoned.out) && test::same_bits(o.dq, poisoned.dq) &&
              test::same_bits(o.dk, poisoned.dk))
      << "a refused call wrote an output";
}

}  // namespace
}  // namespace thdcp
