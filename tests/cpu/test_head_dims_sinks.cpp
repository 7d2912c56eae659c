// The CPU reference with a value head dim of its own (D_v != D_qk) and with attention sinks,
// against a dense float64 per-document reference written here, and the sink's gradient
// against central finite differences (issue 27).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "support/outputs.h"
#include "support/random_batch.h"
#include "support/strided_views.h"
#include "thdcp/cpu/attention.h"
#include "thdcp/plan/segment_table.h"

namespace thdcp {
namespace {

using test::Arrangement;

struct Dense {
  std::vector<double> out, lse, max_logit, dq, dk, dv, dsinks;
};

// The inputs of the dense reference in fp64, so that finite differences can perturb them.
struct DenseInputs {
  int64_t rows = 0, hq = 0, hkv = 0, dqk = 0, dv = 0;
  std::vector<double> q, k, v, dout, sinks;  // sinks empty: none
};

std::vector<double> to_double(const HostTensor& t) {
  std::vector<double> x(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) x[static_cast<size_t>(i)] = t.get(i);
  return x;
}

DenseInputs dense_inputs(const test::Batch& b, const std::vector<float>* sinks) {
  DenseInputs in{b.q.tokens(), b.q.heads(), b.k.heads(), b.q.head_dim(), b.v.head_dim(),
                 to_double(b.q), to_double(b.k), to_double(b.v), to_double(b.dout), {}};
  if (sinks) in.sinks.assign(sinks->begin(), sinks->end());
  return in;
}

// Dense fp64 attention per document: every score, the softmax over the allowed keys and,
// with sinks, the head's sink logit in the denominator (no value); max_logit over the
// allowed scores only. The backward from the definitions: dP = dO.V, dS = P (dP - dO.O),
// d(sink) = -sum_i P_sink,i (dO_i . O_i). `loss` = sum of dout . out, for finite differences.
Dense dense_reference(const LayoutView& layout, const Mask& mask, const DenseInputs& in, double scale,
                      double* loss = nullptr) {
  const int64_t hq = in.hq, hkv = in.hkv, dqk = in.dqk, dv = in.dv, rows = in.rows;
  const bool has_sinks = !in.sinks.empty();
  const double neg_inf = -std::numeric_limits<double>::infinity();
  Dense r;
  r.out.assign(static_cast<size_t>(rows * hq * dv), 0.0);
  r.dq.assign(static_cast<size_t>(rows * hq * dqk), 0.0);
  r.dk.assign(static_cast<size_t>(rows * hkv * dqk), 0.0);
  r.dv.assign(static_cast<size_t>(rows * hkv * dv), 0.0);
  r.lse.assign(static_cast<size_t>(hq * rows), neg_inf);
  r.max_logit.assign(static_cast<size_t>(hq), neg_inf);
  r.dsinks.assign(static_cast<size_t>(hq), 0.0);
  if (loss) *loss = 0;
  auto at = [](int64_t row, int64_t heads, int64_t h, int64_t dim, int64_t d) {
    return static_cast<size_t>((row * heads + h) * dim + d);
  };
  for (int b = 0; b < layout.num_seqs; ++b) {
    const int64_t start = layout.padded_start(b), len = layout.length(b);
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = h / (hq / hkv);
      for (int64_t i = 0; i < len; ++i) {
        std::vector<double> s(static_cast<size_t>(len), neg_inf), p(static_cast<size_t>(len), 0.0);
        double m = neg_inf;
        for (int64_t j = 0; j < len; ++j) {
          if (!mask.allows(i, j)) continue;
          double dot = 0;
          for (int64_t d = 0; d < dqk; ++d) dot += in.q[at(start + i, hq, h, dqk, d)] * in.k[at(start + j, hkv, g, dqk, d)];
          s[j] = dot * scale;
          m = std::max(m, s[j]);
        }
        r.max_logit[h] = std::max(r.max_logit[h], m);
        const double sink = has_sinks ? in.sinks[h] : neg_inf;
        const double top = std::max(m, sink);
        if (top == neg_inf) continue;
        double sum = has_sinks ? std::exp(sink - top) : 0.0;
        for (int64_t j = 0; j < len; ++j) sum += s[j] == neg_inf ? 0.0 : std::exp(s[j] - top);
        const double lse = top + std::log(sum);
        r.lse[h * rows + start + i] = lse;
        for (int64_t j = 0; j < len; ++j) p[j] = s[j] == neg_inf ? 0.0 : std::exp(s[j] - lse);
        double delta = 0;
        for (int64_t d = 0; d < dv; ++d) {
          double o = 0;
          for (int64_t j = 0; j < len; ++j) o += p[j] * in.v[at(start + j, hkv, g, dv, d)];
          r.out[at(start + i, hq, h, dv, d)] = o;
          delta += o * in.dout[at(start + i, hq, h, dv, d)];
        }
        if (loss) *loss += delta;
        if (has_sinks) r.dsinks[h] -= std::exp(sink - lse) * delta;
        for (int64_t j = 0; j < len; ++j) {
          if (p[j] == 0.0) continue;
          double dp = 0;
          for (int64_t d = 0; d < dv; ++d) dp += in.dout[at(start + i, hq, h, dv, d)] * in.v[at(start + j, hkv, g, dv, d)];
          const double ds = p[j] * (dp - delta);
          for (int64_t d = 0; d < dqk; ++d) {
            r.dq[at(start + i, hq, h, dqk, d)] += scale * ds * in.k[at(start + j, hkv, g, dqk, d)];
            r.dk[at(start + j, hkv, g, dqk, d)] += scale * ds * in.q[at(start + i, hq, h, dqk, d)];
          }
          for (int64_t d = 0; d < dv; ++d) r.dv[at(start + j, hkv, g, dv, d)] += p[j] * in.dout[at(start + i, hq, h, dv, d)];
        }
      }
    }
  }
  return r;
}

// Every element within rtol |ref| + atol max|ref| (infinities equal only to themselves).
template <typename Get>
::testing::AssertionResult close(const char* name, Get actual, const std::vector<double>& ref, double rtol,
                                 double atol) {
  double ref_max = 0;
  for (double x : ref) {
    if (std::isfinite(x)) ref_max = std::max(ref_max, std::fabs(x));
  }
  for (size_t i = 0; i < ref.size(); ++i) {
    const double a = actual(i), x = ref[i];
    const bool ok = std::isnan(a) ? false
                    : (std::isinf(x) || std::isinf(a)) ? a == x
                                                       : std::fabs(a - x) <= rtol * std::fabs(x) + atol * ref_max;
    if (!ok) {
      return ::testing::AssertionFailure() << name << "[" << i << "] = " << a << ", dense fp64 " << x;
    }
  }
  return ::testing::AssertionSuccess();
}

// The CPU reference's outputs of one forward and backward, fp32 storage, fp64 arithmetic.
struct Result {
  HostTensor out, dq, dk, dv;
  std::vector<float> lse, max_logit, dsinks;
};

Result run_cpu(const test::Batch& b, const Mask& mask, const std::vector<float>* sinks) {
  const LayoutView layout = b.layout.view();
  const SegmentTable table = build_segment_table(layout, mask);
  const int64_t rows = b.q.tokens(), hq = b.q.heads();
  Result r;
  r.out = HostTensor(DType::kFloat32, rows, hq, b.v.head_dim());
  r.dq = HostTensor(DType::kFloat32, rows, hq, b.q.head_dim());
  r.dk = HostTensor(DType::kFloat32, rows, b.k.heads(), b.k.head_dim());
  r.dv = HostTensor(DType::kFloat32, rows, b.v.heads(), b.v.head_dim());
  r.lse.assign(static_cast<size_t>(hq * rows), NAN);
  r.max_logit.assign(static_cast<size_t>(hq), NAN);
  r.dsinks.assign(static_cast<size_t>(hq), NAN);
  for (HostTensor* t : {&r.out, &r.dq, &r.dk, &r.dv}) test::poison(*t);
  AttentionOptions options;
  options.accumulate = Accumulate::kFloat64;
  options.num_threads = 2;
  ForwardTensors f{b.q.view(), b.k.view(), b.v.view(), r.out.view(), r.lse.data(), r.max_logit.data()};
  BackwardTensors g{b.q.view(), b.k.view(), b.v.view(), r.out.view(), b.dout.view(), r.lse.data(),
                    r.dq.view(), r.dk.view(), r.dv.view()};
  if (sinks) {
    f.sinks = sinks->data();
    g.sinks = sinks->data();
    g.dsinks = r.dsinks.data();
  }
  cpu::attention_forward(table, f, options);
  cpu::attention_backward(table, g, options);
  return r;
}

::testing::AssertionResult matches_dense(const test::Batch& b, const Mask& mask, const std::vector<float>* sinks) {
  const Result got = run_cpu(b, mask, sinks);
  const Dense want = dense_reference(b.layout.view(), mask, dense_inputs(b, sinks),
                                     1.0 / std::sqrt(static_cast<double>(b.q.head_dim())));
  // fp32 storage of each result (one rounding) over fp64 arithmetic on both sides.
  const double rtol = 1e-5, atol = 1e-6;
  for (auto [name, t, ref] : {std::make_tuple("out", &got.out, &want.out), std::make_tuple("dq", &got.dq, &want.dq),
                              std::make_tuple("dk", &got.dk, &want.dk), std::make_tuple("dv", &got.dv, &want.dv)}) {
    auto r = close(name, [&](size_t i) { return static_cast<double>(t->get(static_cast<int64_t>(i))); }, *ref, rtol,
                   atol);
    if (!r) return r;
  }
  for (auto [name, v, ref] : {std::make_tuple("lse", &got.lse, &want.lse),
                              std::make_tuple("max_logit", &got.max_logit, &want.max_logit)}) {
    auto r = close(name, [&](size_t i) { return static_cast<double>((*v)[i]); }, *ref, rtol, atol);
    if (!r) return r;
  }
  if (sinks) return close("dsinks", [&](size_t i) { return static_cast<double>(got.dsinks[i]); }, want.dsinks, rtol,
                          atol);
  return ::testing::AssertionSuccess();
}

using DimsCase = std::tuple<int64_t /*D_qk*/, int64_t /*D_v*/, Mask>;
class ValueHeadDim : public ::testing::TestWithParam<DimsCase> {};

TEST_P(ValueHeadDim, MatchesDenseFp64) {
  const auto [dqk, dv, mask] = GetParam();
  const test::Batch b = test::make_batch(make_layout({37, 0, 1, 64}, 1), DType::kFloat32, 4, 2, dqk,
                                         static_cast<uint64_t>(dqk * 1000 + dv), dv);
  EXPECT_TRUE(matches_dense(b, mask, nullptr));
}

std::string dims_name(const ::testing::TestParamInfo<DimsCase>& info) {
  const auto& [dqk, dv, mask] = info.param;
  return "qk" + std::to_string(dqk) + "_v" + std::to_string(dv) + "_" + test::mask_label(mask);
}

INSTANTIATE_TEST_SUITE_P(Pairs, ValueHeadDim,
                         ::testing::Combine(::testing::Values(int64_t{192}, int64_t{64}, int64_t{128}, int64_t{8}),
                                            ::testing::Values(int64_t{128}, int64_t{64}, int64_t{256}),
                                            ::testing::Values(Mask::causal(), Mask::window(8, 3))),
                         dims_name);

TEST(ValueHeadDimErrors, RefusesAValueHeadDimNotAMultipleOf8) {
  const test::Batch b = test::make_batch(make_layout({16}, 1), DType::kFloat32, 2, 2, 64, 5, 60);
  const SegmentTable table = build_segment_table(b.layout.view(), Mask::causal());
  HostTensor out(DType::kFloat32, 16, 2, 60);
  std::vector<float> lse(32);
  test::expect_error([&] { cpu::attention_forward(table, b.q.view(), b.k.view(), b.v.view(), out.view(), lse.data(),
                                                  nullptr); },
                     {"v_head_dim=60", "multiple of 8"});
}

TEST(ValueHeadDimErrors, NamesAnOutOfTheWrongValueHeadDim) {
  const test::Batch b = test::make_batch(make_layout({16}, 1), DType::kFloat32, 2, 2, 64, 5, 32);
  const SegmentTable table = build_segment_table(b.layout.view(), Mask::causal());
  HostTensor out(DType::kFloat32, 16, 2, 64);
  std::vector<float> lse(32);
  test::expect_error([&] { cpu::attention_forward(table, b.q.view(), b.k.view(), b.v.view(), out.view(), lse.data(),
                                                  nullptr); },
                     {"out is [16, 2, 64]", "v_head_dim=32"});
}

std::vector<float> random_sinks(int64_t heads, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> sinks(static_cast<size_t>(heads));
  for (float& x : sinks) x = static_cast<float>(2.0 * rng.normal());
  return sinks;
}

using SinkCase = std::tuple<Mask, int /*gqa*/, int64_t /*D_qk*/, int64_t /*D_v*/>;
class Sinks : public ::testing::TestWithParam<SinkCase> {};

TEST_P(Sinks, MatchDenseFp64) {
  const auto [mask, ratio, dqk, dv] = GetParam();
  const int64_t hq = 2 * ratio;
  const test::Batch b = test::make_batch(make_layout({29, 1, 0, 48}, 1), DType::kFloat32, hq, 2, dqk,
                                         static_cast<uint64_t>(ratio * 31 + dqk + mask.window_left), dv);
  std::vector<float> sinks = random_sinks(hq, 17);
  sinks[0] = 6.0f;  // a sink larger than every score: the running max starts at the sink
  if (hq > 2) sinks[1] = -std::numeric_limits<float>::infinity();  // a head without a sink
  EXPECT_TRUE(matches_dense(b, mask, &sinks));
}

std::string sink_case_name(const ::testing::TestParamInfo<SinkCase>& info) {
  const auto& [mask, ratio, dqk, dv] = info.param;
  return test::mask_label(mask) + "_gqa" + std::to_string(ratio) + "_qk" + std::to_string(dqk) + "_v" +
         std::to_string(dv);
}

INSTANTIATE_TEST_SUITE_P(Table, Sinks,
                         ::testing::Combine(::testing::Values(Mask::causal(), Mask::full(), Mask::window(4, 0)),
                                            ::testing::Values(1, 4), ::testing::Values(int64_t{64}),
                                            ::testing::Values(int64_t{64}, int64_t{32})),
                         sink_case_name);

// Without sinks (null) the result is the plain softmax's bit for bit, and sinks of -inf are
// no sinks at all.
TEST(SinkRules, MinusInfinitySinksEqualNoSinks) {
  const test::Batch b = test::make_batch(make_layout({21, 9}, 1), DType::kFloat32, 4, 2, 16, 3);
  const std::vector<float> none(4, -std::numeric_limits<float>::infinity());
  const Result with = run_cpu(b, Mask::causal(), &none), without = run_cpu(b, Mask::causal(), nullptr);
  EXPECT_TRUE(test::same_bits(with.out, without.out));
  EXPECT_TRUE(test::same_bits(with.lse, without.lse));
  EXPECT_TRUE(test::same_bits(with.dq, without.dq));
  EXPECT_TRUE(test::same_bits(with.dk, without.dk));
  EXPECT_TRUE(test::same_bits(with.dv, without.dv));
  for (float d : with.dsinks) EXPECT_EQ(d, 0.0f);
}

// dsinks, dq, dk and dv of the CPU reference against central differences of the dense fp64
// loss sum(dout . out): the gradient formulas themselves, not only agreement of two codes.
TEST(SinkRules, GradientsMatchFiniteDifferences) {
  const test::Batch b = test::make_batch(make_layout({7, 0, 5}, 1), DType::kFloat32, 4, 2, 16, 11, 8);
  const std::vector<float> sinks = random_sinks(4, 23);
  const Mask mask = Mask::window(3, 0);
  const Result got = run_cpu(b, mask, &sinks);
  const DenseInputs base = dense_inputs(b, &sinks);
  const double scale = 0.25, h = 1e-5;
  auto loss_at = [&](DenseInputs in) {
    double loss = 0;
    dense_reference(b.layout.view(), mask, in, scale, &loss);
    return loss;
  };
  auto check = [&](const char* name, std::vector<double> DenseInputs::*field, auto gradient_at) {
    const size_t n = (base.*field).size();
    for (size_t i = 0; i < n; i += std::max<size_t>(1, n / 23)) {
      DenseInputs plus = base, minus = base;
      (plus.*field)[i] += h;
      (minus.*field)[i] -= h;
      const double numeric = (loss_at(plus) - loss_at(minus)) / (2 * h);
      const double analytic = gradient_at(i);
      EXPECT_NEAR(analytic, numeric, 1e-6 + 1e-5 * std::fabs(numeric)) << name << "[" << i << "]";
    }
  };
  check("dsinks", &DenseInputs::sinks, [&](size_t i) { return static_cast<double>(got.dsinks[i]); });
  check("dq", &DenseInputs::q, [&](size_t i) { return static_cast<double>(got.dq.get(static_cast<int64_t>(i))); });
  check("dk", &DenseInputs::k, [&](size_t i) { return static_cast<double>(got.dk.get(static_cast<int64_t>(i))); });
  check("dv", &DenseInputs::v, [&](size_t i) { return static_cast<double>(got.dv.get(static_cast<int64_t>(i))); });
  // Every sink had a gradient to check: none is zero.
  for (float d : got.dsinks) EXPECT_NE(d, 0.0f);
}

// D_v != D_qk with sinks on strided views: q and k head-major in one buffer (a KV cache's
// arrangement), v head-major in its own, out with padded heads, dq and dk packed in one buffer
// and dv padded, give the bits of the contiguous call, dsinks included; nothing is written
// outside the output views.
TEST(SinkRules, StridedViewsWithAValueHeadDimGiveTheContiguousBits) {
  const test::Batch b = test::make_batch(make_layout({19, 0, 33}, 1), DType::kFloat32, 4, 2, 24, 41, 16);
  const std::vector<float> sinks = random_sinks(4, 43);
  for (const Mask& mask : {Mask::causal(), Mask::window(5, 0)}) {
    SCOPED_TRACE(test::mask_label(mask));
    const Result want = run_cpu(b, mask, &sinks);
    const int64_t rows = b.q.tokens(), dqk = 24, dv = 16;
    const test::GroupLayout qk = test::arrange(Arrangement::kHeadMajor, rows, {4, 2}, dqk);
    const test::GroupLayout v = test::arrange(Arrangement::kHeadMajor, rows, {2}, dv);
    const test::GroupLayout o = test::arrange(Arrangement::kPadded, rows, {4}, dv);
    const test::GroupLayout dqdk = test::arrange(Arrangement::kPacked, rows, {4, 2}, dqk);
    const test::GroupLayout dvl = test::arrange(Arrangement::kPadded, rows, {2}, dv);
    std::vector<unsigned char> qk_image = test::poisoned_image(DType::kFloat32, qk.elements),
                               v_image = test::poisoned_image(DType::kFloat32, v.elements),
                               o_image = test::poisoned_image(DType::kFloat32, o.elements),
                               dqdk_image = test::poisoned_image(DType::kFloat32, dqdk.elements),
                               dv_image = test::poisoned_image(DType::kFloat32, dvl.elements);
    auto view = [&](std::vector<unsigned char>& image, int64_t heads, int64_t d, const test::Placement& at) {
      return test::placed_view(image.data(), DType::kFloat32, rows, heads, d, at);
    };
    const ThdTensor q = view(qk_image, 4, dqk, qk.placements[0]), k = view(qk_image, 2, dqk, qk.placements[1]),
                    vv = view(v_image, 2, dv, v.placements[0]), out = view(o_image, 4, dv, o.placements[0]),
                    dq = view(dqdk_image, 4, dqk, dqdk.placements[0]),
                    dk = view(dqdk_image, 2, dqk, dqdk.placements[1]), dvv = view(dv_image, 2, dv, dvl.placements[0]);
    test::scatter_into(b.q, q);
    test::scatter_into(b.k, k);
    test::scatter_into(b.v, vv);
    const SegmentTable table = build_segment_table(b.layout.view(), mask);
    AttentionOptions options;
    options.accumulate = Accumulate::kFloat64;
    options.num_threads = 2;
    std::vector<float> lse(static_cast<size_t>(4 * rows), NAN), max_logit(4, NAN), dsinks(4, NAN);
    ForwardTensors f{q, k, vv, out, lse.data(), max_logit.data(), sinks.data()};
    cpu::attention_forward(table, f, options);
    BackwardTensors g{q, k, vv, out, b.dout.view(), lse.data(), dq, dk, dvv};
    g.sinks = sinks.data();
    g.dsinks = dsinks.data();
    cpu::attention_backward(table, g, options);
    EXPECT_TRUE(test::same_bits(test::gather_from(out), want.out));
    EXPECT_TRUE(test::same_bits(test::gather_from(dq), want.dq));
    EXPECT_TRUE(test::same_bits(test::gather_from(dk), want.dk));
    EXPECT_TRUE(test::same_bits(test::gather_from(dvv), want.dv));
    EXPECT_TRUE(lse == want.lse && max_logit == want.max_logit && dsinks == want.dsinks);
    EXPECT_TRUE(test::poison_kept_outside(o_image, {out})) << "out";
    EXPECT_TRUE(test::poison_kept_outside(dqdk_image, {dq, dk})) << "dq, dk";
    EXPECT_TRUE(test::poison_kept_outside(dv_image, {dvv})) << "dv";
  }
}

TEST(SinkRules, RefusesANaNSinkAndDsinksWithoutSinks) {
  const test::Batch b = test::make_batch(make_layout({16}, 1), DType::kFloat32, 2, 2, 16, 5);
  const SegmentTable table = build_segment_table(b.layout.view(), Mask::causal());
  HostTensor out(DType::kFloat32, 16, 2, 16), dq(DType::kFloat32, 16, 2, 16), dk(DType::kFloat32, 16, 2, 16),
      dv(DType::kFloat32, 16, 2, 16);
  std::vector<float> lse(32), sinks{0.5f, NAN}, dsinks(2);
  ForwardTensors f{b.q.view(), b.k.view(), b.v.view(), out.view(), lse.data(), nullptr, sinks.data()};
  test::expect_error([&] { cpu::attention_forward(table, f); }, {"sinks[1]=nan", "not a logit"});
  BackwardTensors g{b.q.view(), b.k.view(), b.v.view(), out.view(), b.dout.view(), lse.data(),
                    dq.view(),  dk.view(),  dv.view()};
  g.dsinks = dsinks.data();
  test::expect_error([&] { cpu::attention_backward(table, g); }, {"dsinks is set but sinks is null"});
}

}  // namespace
}  // namespace thdcp
