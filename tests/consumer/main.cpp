// A program outside thdcp that uses the installed package (tests/consumer/run.sh builds it
// against `cmake --install` output): the CPU reference attention on a padded varlen batch
// with a causal mask, checked against a naive attention written here, not in thdcp.
// Prints one line per check and PASS or FAIL; exits 1 on any failure.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <vector>

#include <thdcp/core/error.h>
#include <thdcp/core/tensor.h>
#include <thdcp/cpu/attention.h>
#include <thdcp/plan/layout.h>
#include <thdcp/plan/mask.h>
#include <thdcp/plan/segment_table.h>
#if THDCP_CONSUMER_HAVE_CUDA
#include <thdcp/comm_device/nccl.h>
#include <thdcp/cuda/attention.h>
#endif

namespace {

int g_failures = 0;

void check(bool ok, const char* what) {
  std::printf("  %-62s %s\n", what, ok ? "ok" : "FAILED");
  if (!ok) ++g_failures;
}

// Three documents of 5, 11 and 3 tokens, each padded to a multiple of 4 (cp = 2):
// rows 5..7, 16..19 and 23 are padding.
const std::vector<int32_t> kCuSeqlens = {0, 5, 16, 19};
const std::vector<int32_t> kCuSeqlensPadded = {0, 8, 20, 24};
constexpr int64_t kRows = 24;
constexpr int64_t kQHeads = 4;
constexpr int64_t kKvHeads = 2;  // GQA: two query heads per key/value head
constexpr int64_t kHeadDim = 32;

float pseudo_random(uint32_t& state) {  // uniform in [-1, 1)
  state = state * 1664525u + 1013904223u;
  return static_cast<float>(state >> 8) / 8388608.0f - 1.0f;
}

bool is_padding(int64_t row) {
  for (size_t b = 0; b + 1 < kCuSeqlens.size(); ++b) {
    if (row >= kCuSeqlensPadded[b] + (kCuSeqlens[b + 1] - kCuSeqlens[b]) && row < kCuSeqlensPadded[b + 1]) {
      return true;
    }
  }
  return false;
}

// Valid rows get values in [-1, 1); padding rows get NaN, which no valid output may see.
thdcp::HostTensor make_input(thdcp::DType dtype, int64_t heads, uint32_t seed) {
  thdcp::HostTensor t(dtype, kRows, heads, kHeadDim);
  for (int64_t row = 0; row < kRows; ++row) {
    for (int64_t e = 0; e < heads * kHeadDim; ++e) {
      float value = is_padding(row) ? std::numeric_limits<float>::quiet_NaN() : pseudo_random(seed);
      t.set(row * heads * kHeadDim + e, value);
    }
  }
  return t;
}

// Naive causal attention in double over the values as stored (so bf16 inputs are exact).
void naive_attention(const thdcp::HostTensor& q, const thdcp::HostTensor& k, const thdcp::HostTensor& v,
                     std::vector<double>& out, std::vector<double>& lse) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));
  out.assign(static_cast<size_t>(kRows * kQHeads * kHeadDim), 0.0);
  lse.assign(static_cast<size_t>(kQHeads * kRows), -std::numeric_limits<double>::infinity());
  for (size_t b = 0; b + 1 < kCuSeqlens.size(); ++b) {
    const int64_t start = kCuSeqlensPadded[b];
    const int64_t length = kCuSeqlens[b + 1] - kCuSeqlens[b];
    for (int64_t h = 0; h < kQHeads; ++h) {
      const int64_t kv_head = h / (kQHeads / kKvHeads);
      for (int64_t i = 0; i < length; ++i) {
        std::vector<double> scores;
        double max_score = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= i; ++j) {  // causal: keys at or before the query
          double dot = 0.0;
          for (int64_t d = 0; d < kHeadDim; ++d) {
            dot += static_cast<double>(q.get(((start + i) * kQHeads + h) * kHeadDim + d)) *
                   static_cast<double>(k.get(((start + j) * kKvHeads + kv_head) * kHeadDim + d));
          }
          scores.push_back(dot * scale);
          max_score = std::fmax(max_score, dot * scale);
        }
        double sum = 0.0;
        for (double s : scores) sum += std::exp(s - max_score);
        lse[static_cast<size_t>(h * kRows + start + i)] = max_score + std::log(sum);
        for (int64_t j = 0; j <= i; ++j) {
          const double p = std::exp(scores[static_cast<size_t>(j)] - max_score) / sum;
          for (int64_t d = 0; d < kHeadDim; ++d) {
            out[static_cast<size_t>(((start + i) * kQHeads + h) * kHeadDim + d)] +=
                p * static_cast<double>(v.get(((start + j) * kKvHeads + kv_head) * kHeadDim + d));
          }
        }
      }
    }
  }
}

void run_case(thdcp::DType dtype, const char* name, double out_tolerance) {
  std::printf("%s, causal, %zu documents in %lld rows, heads %lld:%lld, head_dim %lld\n", name,
              kCuSeqlens.size() - 1, static_cast<long long>(kRows), static_cast<long long>(kQHeads),
              static_cast<long long>(kKvHeads), static_cast<long long>(kHeadDim));
  thdcp::BatchLayout layout;
  layout.cu_seqlens = kCuSeqlens;
  layout.cu_seqlens_padded = kCuSeqlensPadded;
  thdcp::validate_layout(layout.view(), kRows, 2);
  const thdcp::SegmentTable table = thdcp::build_segment_table(layout.view(), thdcp::Mask::causal());

  const thdcp::HostTensor q = make_input(dtype, kQHeads, 1u);
  const thdcp::HostTensor k = make_input(dtype, kKvHeads, 2u);
  const thdcp::HostTensor v = make_input(dtype, kKvHeads, 3u);
  thdcp::HostTensor out(dtype, kRows, kQHeads, kHeadDim);
  std::vector<float> lse(static_cast<size_t>(kQHeads * kRows), 0.0f);
  thdcp::AttentionOptions options;
  options.num_threads = 2;
  thdcp::cpu::attention_forward(table, q.view(), k.view(), v.view(), out.view(), lse.data(), nullptr, options);

  std::vector<double> ref_out;
  std::vector<double> ref_lse;
  naive_attention(q, k, v, ref_out, ref_lse);

  double max_ref = 0.0;
  double max_err = 0.0;
  double max_lse_err = 0.0;
  bool padding_out_zero = true;
  bool padding_lse_neg_inf = true;
  bool valid_finite = true;
  for (int64_t row = 0; row < kRows; ++row) {
    for (int64_t h = 0; h < kQHeads; ++h) {
      const double got_lse = lse[static_cast<size_t>(h * kRows + row)];
      if (is_padding(row)) {
        padding_lse_neg_inf = padding_lse_neg_inf && std::isinf(got_lse) && got_lse < 0;
      } else {
        valid_finite = valid_finite && std::isfinite(got_lse);
        max_lse_err = std::fmax(max_lse_err, std::fabs(got_lse - ref_lse[static_cast<size_t>(h * kRows + row)]));
      }
      for (int64_t d = 0; d < kHeadDim; ++d) {
        const int64_t i = (row * kQHeads + h) * kHeadDim + d;
        const double got = out.get(i);
        if (is_padding(row)) {
          padding_out_zero = padding_out_zero && got == 0.0;
        } else {
          valid_finite = valid_finite && std::isfinite(got);
          max_ref = std::fmax(max_ref, std::fabs(ref_out[static_cast<size_t>(i)]));
          max_err = std::fmax(max_err, std::fabs(got - ref_out[static_cast<size_t>(i)]));
        }
      }
    }
  }
  const double rel_err = max_ref > 0 ? max_err / max_ref : max_err;
  std::printf("  out: max |error| / max |reference| = %.3g (tolerance %.0e); lse: max |error| = %.3g\n", rel_err,
              out_tolerance, max_lse_err);
  check(max_ref > 0.01, "the reference output is not trivially zero");
  check(valid_finite, "valid rows are finite (the NaN in padding rows stays out)");
  check(rel_err <= out_tolerance, "out matches the naive attention");
  check(max_lse_err <= 1e-3, "lse matches the naive attention (1e-3)");
  check(padding_lse_neg_inf, "lse of every padding row is -inf");
  check(padding_out_zero, "out of every padding row is 0");
}

}  // namespace

int main() {
  try {
    const thdcp::BatchLayout made = thdcp::make_layout({5, 11, 3}, 2);
    check(made.cu_seqlens == kCuSeqlens && made.cu_seqlens_padded == kCuSeqlensPadded,
          "make_layout({5, 11, 3}, cp=2) pads each document to a multiple of 4");
    check(thdcp::cpu_supports_head_dim(kHeadDim) && !thdcp::cpu_supports_head_dim(12),
          "cpu_supports_head_dim(32) and not (12)");
    bool threw = false;
    try {
      thdcp::validate_layout(thdcp::BatchLayout{{0, 5}, {0, 4}}.view(), 4, 0);
    } catch (const thdcp::Error& e) {
      threw = true;
      std::printf("  (expected) %s\n", e.what());
    }
    check(threw, "a layout with L_b > P_b throws thdcp::Error across the library");

    run_case(thdcp::DType::kFloat32, "fp32", 1e-4);
    run_case(thdcp::DType::kBFloat16, "bf16", 1e-2);

#if THDCP_CONSUMER_HAVE_CUDA
    // Host-only calls into the CUDA parts: they link (kernels, cudart, NCCL) and report what
    // thdcpConfig.cmake says was built. Nothing here needs a GPU.
    std::printf("CUDA parts, host-only calls (no GPU needed)\n");
    check(thdcp::cuda::cuda_supports_head_dim(64) && !thdcp::cuda::cuda_supports_head_dim(32),
          "thdcp::cuda::cuda_supports_head_dim(64) and not (32)");
    check(thdcp::cuda::cuda_supports_head_dims(128, 0) && !thdcp::cuda::cuda_supports_head_dims(128, 64) &&
              thdcp::cuda::cuda_head_dims_text()[0] != '\0',
          "thdcp::cuda::cuda_supports_head_dims(128, 0), not (128, 64), and cuda_head_dims_text() says which");
    check(thdcp::nccl::built_with_nccl() == (THDCP_CONSUMER_HAVE_NCCL != 0),
          "thdcp::nccl::built_with_nccl() agrees with thdcp_HAVE_NCCL");
#endif
  } catch (const std::exception& e) {
    std::printf("unexpected exception: %s\n", e.what());
    ++g_failures;
  }
  std::printf("consumer: %s (%d check(s) failed)\n", g_failures == 0 ? "PASS" : "FAIL", g_failures);
  return g_failures == 0 ? 0 : 1;
}
