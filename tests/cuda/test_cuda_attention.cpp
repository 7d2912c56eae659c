// The CUDA backend against the CPU reference, over the edge-case table (STYLE.md, Tests):
// out, lse, max_logit, dq, dk, dv with dtype-derived tolerances, outputs poisoned with NaN
// before every launch, device-built tables equal to host-built ones.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "support/cuda/one_shot.h"
#include "support/cuda/cuda_test.h"
#include "thdcp/testing/compare.h"
#include "thdcp/cuda/attention.h"
#include "thdcp/plan/layout.h"
#include "thdcp/plan/segment_table.h"
#include "thdcp/testing/workload.h"

namespace thdcp::test {
namespace {

struct EdgeCase {
  std::string name;
  std::vector<int64_t> lengths;
  Mask mask;
  int q_heads;
  int kv_heads;
  int head_dim;
  DType dtype;
  int cp = 0;  // 0: single-device table; else the AllGather-CP table of `rank`
  int rank = 0;
  bool fp32_grads = false;  // dq/dk/dv in fp32 instead of the storage dtype
  int extra_seqs = 2;       // placeholders past the real sequences (capacity)
  int64_t extra_tokens = 8;  // capacity rows past the last real sequence (times 2*cp)
};

std::ostream& operator<<(std::ostream& os, const EdgeCase& c) { return os << c.name; }

std::vector<EdgeCase> edge_cases() {
  const DType bf16 = DType::kBFloat16;
  const DType fp16 = DType::kFloat16;
  return {
      {"empty_and_len1_causal_bf16_d64", {0, 1, 5, 0, 17, 130, 64}, Mask::causal(), 4, 4, 64, bf16},
      {"empty_and_len1_full_fp16_d128", {0, 1, 5, 0, 17, 130, 64}, Mask::full(), 4, 4, 128, fp16},
      {"window16_0_gqa4_bf16_d128", {1, 33, 200, 7, 513}, Mask::window(16, 0), 8, 2, 128, bf16, 0, 0, true},
      {"window16_16_gqa8_fp16_d64", {3, 250, 64, 129}, Mask::window(16, 16), 8, 1, 64, fp16},
      {"window64_200_bf16_d128", {300, 1, 77, 401}, Mask::window(64, 200), 4, 4, 128, bf16},
      {"window7_3_gqa4_bf16_d64", {9, 100, 2, 255}, Mask::window(7, 3), 4, 1, 64, bf16, 0, 0, true},
      {"window1000_0_bf16_d128", {1500, 300, 3}, Mask::window(1000, 0), 2, 1, 128, bf16},
      {"one_long_causal_fp16_d128", {2000}, Mask::causal(), 2, 2, 128, fp16, 0, 0, false, 1, 0},
      // A left window wide enough for Hopper's one-pass backward at head dim 128 (4096 keys)
      // in documents longer than it: the first key tile adding into a query tile is not the
      // segment's first. As CP rank 0 of 2 (its second chunk is the last), the two passes.
      {"window4096_0_bf16_d128", {4500, 70}, Mask::window(4096, 0), 1, 1, 128, bf16},
      {"cp2_rank0_window4096_0_fp16_d128", {4600}, Mask::window(4096, 0), 2, 1, 128, fp16, 2, 0},
      {"full_gqa8_fp16_d64", {70, 1, 190}, Mask::full(), 8, 1, 64, fp16, 0, 0, true},
      // Padding rows in query tiles that visit several key tiles.
      {"padding_multi_key_tiles_causal_bf16_d64", {131, 257}, Mask::causal(), 2, 1, 64, bf16},
      {"padding_multi_key_tiles_full_fp16_d128", {131, 257}, Mask::full(), 2, 2, 128, fp16},
      // AllGather-CP tables: lengths not multiples of 2*cp, two segments per sequence
      // sharing keys (dK/dV accumulated over both), windows wider than a chunk.
      {"cp2_rank0_causal_bf16_d64", {5, 0, 1, 37, 300}, Mask::causal(), 4, 2, 64, bf16, 2, 0, true},
      {"cp2_rank1_causal_fp16_d128", {5, 0, 1, 37, 300}, Mask::causal(), 4, 1, 128, fp16, 2, 1},
      {"cp4_rank2_window16_0_bf16_d128", {13, 250, 6, 333}, Mask::window(16, 0), 8, 2, 128, bf16, 4, 2, true},
      {"cp4_rank3_window64_200_bf16_d64", {13, 250, 6, 333}, Mask::window(64, 200), 4, 4, 64, bf16, 4, 3},
      {"cp2_rank1_window1000_0_fp16_d64", {1100, 17}, Mask::window(1000, 0), 8, 8, 64, fp16, 2, 1, true},
      {"cp4_rank0_window7_3_fp16_d128", {61, 8, 129}, Mask::window(7, 3), 4, 4, 128, fp16, 4, 0},
      {"cp2_rank0_full_gqa8_bf16_d128", {90, 31}, Mask::full(), 8, 1, 128, bf16, 2, 0, true},
  };
}

// Tolerances against the CPU reference (fp32 arithmetic, one rounding of each result to its
// storage dtype). derive_tolerance(dtype, fp32, 2) covers the two roundings of the results
// and the different summation orders. On top of that the GPU rounds P to the storage dtype
// before P.V (and dS before dS.K, dS^T.Q, P^T.dO), as every tensor-core attention does: each
// such product is a sum of weights times rows, each weight off by at most u relative, so
// the sum is off by at most u * sum|w_j| |x_j|, a few u of the largest value in the worst
// case and far less on average. We allow 4u of max|ref| for out and 8u for the gradients
// (which go through two such roundings, P and dS). lse and max_logit are fp32 results of
// fp32 arithmetic on identical inputs; they differ by summation order of the D-term dot
// products and the ex2/lg2 approximations, far below 2^-16 relative.
Tolerance storage_tolerance(DType dtype, double extra_units) {
  Tolerance t = derive_tolerance(dtype, Accumulate::kFloat32, 2);
  t.atol_scale += extra_units * dtype_unit_roundoff(dtype);
  return t;
}

constexpr Tolerance kFp32ResultTolerance{0x1.0p-16, 0x1.0p-16};

// The first few elements outside the tolerance, for the failure message.
std::string first_mismatches(const void* actual, DType actual_dtype, const void* reference, DType reference_dtype,
                             int64_t n, const Tolerance& tol, double reference_max) {
  std::ostringstream os;
  int shown = 0;
  for (int64_t i = 0; i < n && shown < 6; ++i) {
    const double a = load_as_float(actual, actual_dtype, static_cast<size_t>(i));
    const double r = load_as_float(reference, reference_dtype, static_cast<size_t>(i));
    const bool same_inf = std::isinf(a) && std::isinf(r) && (a > 0) == (r > 0);
    const bool ok = !std::isnan(a) && !std::isnan(r) &&
                    (same_inf || (std::isfinite(a) && std::isfinite(r) &&
                                  std::fabs(a - r) <= tol.rtol * std::fabs(r) + tol.atol_scale * reference_max));
    if (!ok) {
      os << " [" << i << "] gpu=" << a << " ref=" << r << ";";
      ++shown;
    }
  }
  return os.str();
}

void expect_close(const char* what, const HostTensor& actual, const HostTensor& reference, const Tolerance& tol) {
  ASSERT_EQ(actual.numel(), reference.numel()) << what;
  const Comparison c = compare_values(actual.data(), actual.dtype(), reference.data(), reference.dtype(),
                                      actual.numel(), tol);
  EXPECT_TRUE(c.passed()) << what << ": " << c.summary()
                          << first_mismatches(actual.data(), actual.dtype(), reference.data(), reference.dtype(),
                                              actual.numel(), tol, c.reference_max);
  std::cout << "  " << what << ": max_rel_error=" << c.max_rel_error << " (of max|ref| " << c.reference_max << ")\n";
}

void expect_close(const char* what, const std::vector<float>& actual, const std::vector<float>& reference,
                  const Tolerance& tol) {
  ASSERT_EQ(actual.size(), reference.size()) << what;
  const Comparison c = compare_values(actual.data(), DType::kFloat32, reference.data(), DType::kFloat32,
                                      static_cast<int64_t>(actual.size()), tol);
  EXPECT_TRUE(c.passed()) << what << ": " << c.summary()
                          << first_mismatches(actual.data(), DType::kFloat32, reference.data(), DType::kFloat32,
                                              static_cast<int64_t>(actual.size()), tol, c.reference_max);
  std::cout << "  " << what << ": max_rel_error=" << c.max_rel_error << "\n";
}

// Rows of q, k and v that no segment reads as a token (padding, the capacity's rows past the
// batch) become NaN, as in a caller's uninitialised buffer: the kernels' tiles reach into such
// rows, and a kernel that let one into a result (P = 0 times a NaN of V is NaN) would show it.
void poison_unread_rows(const SegmentTable& table, HostTensor& q, HostTensor& k, HostTensor& v) {
  std::vector<bool> q_read(static_cast<size_t>(table.q_rows), false);
  std::vector<bool> k_read(static_cast<size_t>(table.k_rows), false);
  for (const Segment& seg : table.segments) {
    for (int64_t r = 0; r < seg.q_len; ++r) q_read[static_cast<size_t>(seg.q_row + r)] = true;
    for (int64_t r = 0; r < seg.k_len; ++r) k_read[static_cast<size_t>(seg.k_row + r)] = true;
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto poison = [nan](HostTensor& t, const std::vector<bool>& read) {
    const int64_t row_elements = t.heads() * t.head_dim();
    for (int64_t row = 0; row < t.tokens(); ++row) {
      if (read[static_cast<size_t>(row)]) continue;
      for (int64_t i = 0; i < row_elements; ++i) t.set(row * row_elements + i, nan);
    }
  };
  poison(q, q_read);
  poison(k, k_read);
  poison(v, k_read);
}

class CudaAttentionEdge : public CudaTest, public ::testing::WithParamInterface<EdgeCase> {};

TEST_P(CudaAttentionEdge, MatchesCpuReference) {
  const EdgeCase& c = GetParam();
  const int cp = c.cp == 0 ? 1 : c.cp;
  const BatchLayout plain = make_layout(c.lengths, cp);
  const Capacity capacity{static_cast<int>(c.lengths.size()) + c.extra_seqs,
                          plain.total_rows() + c.extra_tokens * 2 * cp};
  const BatchLayout layout = make_layout(c.lengths, cp, capacity);
  const SegmentTable table = c.cp == 0 ? build_segment_table(layout.view(), c.mask)
                                       : build_cp_segment_table(layout.view(), c.cp, c.rank, c.mask);

  // Device table, built on the device from device metadata, equals the host table.
  const int max_seqs = layout.num_seqs();
  DeviceBuffer cu_seqlens(sizeof(int32_t) * (max_seqs + 1));
  DeviceBuffer cu_seqlens_padded(sizeof(int32_t) * (max_seqs + 1));
  cu_seqlens.upload(layout.cu_seqlens.data(), cu_seqlens.bytes());
  cu_seqlens_padded.upload(layout.cu_seqlens_padded.data(), cu_seqlens_padded.bytes());
  const cuda::TableKind kind = c.cp == 0 ? cuda::TableKind::kSingleDevice : cuda::TableKind::kAllGatherCp;
  DeviceBuffer segments(sizeof(Segment) * test::table_entries(kind, max_seqs));
  segments.poison();
  const cuda::DeviceSegmentTable device_table =
      c.cp == 0 ? test::build_segment_table(cu_seqlens.as<int32_t>(), cu_seqlens_padded.as<int32_t>(), max_seqs,
                                            layout.total_rows(), c.mask, segments.as<Segment>(), nullptr)
                : test::build_cp_segment_table(cu_seqlens.as<int32_t>(), cu_seqlens_padded.as<int32_t>(), max_seqs,
                                               layout.total_rows(), c.cp, c.rank, c.mask, segments.as<Segment>(),
                                               nullptr);
  ASSERT_EQ(static_cast<size_t>(device_table.capacity), table.segments.size());
  EXPECT_EQ(device_table.q_rows, table.q_rows);
  EXPECT_EQ(device_table.k_rows, table.k_rows);
  const std::vector<Segment> built = download_vector<Segment>(segments, table.segments.size());
  for (size_t i = 0; i < built.size(); ++i) {
    const Segment& a = built[i];
    const Segment& b = table.segments[i];
    EXPECT_TRUE(a.q_row == b.q_row && a.q_len == b.q_len && a.q_pos == b.q_pos && a.q_span == b.q_span &&
                a.k_row == b.k_row && a.k_len == b.k_len && a.k_pos == b.k_pos && a.reserved == b.reserved)
        << "segment " << i << " differs between the device and the host builder";
  }

  // Inputs.
  const uint64_t seed = std::hash<std::string>{}(c.name);
  HostTensor q(c.dtype, table.q_rows, c.q_heads, c.head_dim);
  HostTensor k(c.dtype, table.k_rows, c.kv_heads, c.head_dim);
  HostTensor v(c.dtype, table.k_rows, c.kv_heads, c.head_dim);
  HostTensor dout(c.dtype, table.q_rows, c.q_heads, c.head_dim);
  fill_normal(q, seed + 1);
  fill_normal(k, seed + 2);
  fill_normal(v, seed + 3);
  fill_normal(dout, seed + 4);
  poison_unread_rows(table, q, k, v);

  // CPU reference.
  const DType grad_dtype = c.fp32_grads ? DType::kFloat32 : c.dtype;
  HostTensor out_ref(c.dtype, table.q_rows, c.q_heads, c.head_dim);
  std::vector<float> lse_ref(static_cast<size_t>(c.q_heads * table.q_rows));
  std::vector<float> max_logit_ref(static_cast<size_t>(c.q_heads));
  cpu::attention_forward(table, q.view(), k.view(), v.view(), out_ref.view(), lse_ref.data(), max_logit_ref.data());
  HostTensor dq_ref(grad_dtype, table.q_rows, c.q_heads, c.head_dim);
  HostTensor dk_ref(grad_dtype, table.k_rows, c.kv_heads, c.head_dim);
  HostTensor dv_ref(grad_dtype, table.k_rows, c.kv_heads, c.head_dim);
  cpu::attention_backward(table, q.view(), k.view(), v.view(), out_ref.view(), dout.view(), lse_ref.data(),
                          dq_ref.view(), dk_ref.view(), dv_ref.view());

  // GPU, every output poisoned first.
  DeviceTensor dq_in(q), dk_in(k), dv_in(v), ddout(dout);
  DeviceTensor dout_gpu(c.dtype, table.q_rows, c.q_heads, c.head_dim);
  DeviceBuffer lse(sizeof(float) * lse_ref.size());
  DeviceBuffer max_logit(sizeof(float) * max_logit_ref.size());
  DeviceTensor dq(grad_dtype, table.q_rows, c.q_heads, c.head_dim);
  DeviceTensor dk(grad_dtype, table.k_rows, c.kv_heads, c.head_dim);
  DeviceTensor dv(grad_dtype, table.k_rows, c.kv_heads, c.head_dim);
  for (DeviceBuffer* b : {&dout_gpu.buffer, &lse, &max_logit, &dq.buffer, &dk.buffer, &dv.buffer}) b->poison();
  DeviceBuffer fwd_ws(test::forward_workspace_size(device_table));
  fwd_ws.poison();
  test::attention_forward(device_table, dq_in.cview(), dk_in.cview(), dv_in.cview(), dout_gpu.view(),
                          lse.as<float>(), max_logit.as<float>(), fwd_ws.data(), fwd_ws.bytes(), nullptr);
  THDCP_CHECK_CUDA(cudaDeviceSynchronize());
  // The forward's results before the backward runs (so a backward that wrote over them
  // would show up as a difference between these and the final ones).
  const HostTensor out_after_forward = dout_gpu.download();
  const std::vector<float> lse_after_forward = download_vector<float>(lse, lse_ref.size());

  std::cout << c.name << ": pairs=" << table_pairs(table) << "\n";
  const Tolerance out_tol = storage_tolerance(c.dtype, 4);
  const Tolerance grad_tol = storage_tolerance(c.dtype, 8);
  expect_close("out", dout_gpu.download(), out_ref, out_tol);
  expect_close("lse", lse_after_forward, lse_ref, kFp32ResultTolerance);
  expect_close("max_logit", download_vector<float>(max_logit, max_logit_ref.size()), max_logit_ref,
               kFp32ResultTolerance);

  // Backward in each mode: deterministic (on Hopper at head dim 128 without a left window,
  // or on a single-device table with one of 4096 keys or more, dQ comes from the dK/dV pass,
  // elsewhere from a pass of its own), not (the portable kernels' fused pass with dQ by
  // atomics; on Hopper the sm90 passes again), and with dQ's pass kept separate on Hopper
  // (Options::separate_dq_pass).
  struct Mode {
    const char* name;
    bool deterministic;
    bool separate_dq_pass;
  };
  for (const Mode& mode : {Mode{"deterministic backward", true, false},
                           Mode{"deterministic = false backward", false, false},
                           Mode{"separate dQ pass", true, true}}) {
    SCOPED_TRACE(mode.name);
    AttentionOptions options;
    options.deterministic = mode.deterministic;
    options.separate_dq_pass = mode.separate_dq_pass;
    for (DeviceBuffer* b : {&dq.buffer, &dk.buffer, &dv.buffer}) b->poison();
    DeviceBuffer bwd_ws(
        test::backward_workspace_size(device_table, c.q_heads, c.kv_heads, c.head_dim, grad_dtype, options));
    bwd_ws.poison();
    test::attention_backward(device_table, dq_in.cview(), dk_in.cview(), dv_in.cview(), dout_gpu.cview(),
                             ddout.cview(), lse.as<float>(), dq.view(), dk.view(), dv.view(), bwd_ws.data(),
                             bwd_ws.bytes(), nullptr, options);
    THDCP_CHECK_CUDA(cudaDeviceSynchronize());
    const HostTensor out_final = dout_gpu.download();
    EXPECT_EQ(0, std::memcmp(out_final.data(), out_after_forward.data(), out_final.row_bytes() * out_final.tokens()))
        << "the backward changed out";
    EXPECT_TRUE(download_vector<float>(lse, lse_ref.size()) == lse_after_forward) << "the backward changed lse";
    expect_close("dq", dq.download(), dq_ref, grad_tol);
    expect_close("dk", dk.download(), dk_ref, grad_tol);
    expect_close("dv", dv.download(), dv_ref, grad_tol);

    // Rows of dK/dV that no query saw are exactly zero (not merely small).
    const HostTensor dk_gpu = dk.download();
    const HostTensor dv_gpu = dv.download();
    for (int64_t i = 0; i < dk_ref.numel(); ++i) {
      if (dk_ref.get(i) == 0.0f && dv_ref.get(i) == 0.0f) {
        ASSERT_TRUE(dk_gpu.get(i) == 0.0f && dv_gpu.get(i) == 0.0f)
            << "dk/dv element " << i << " should be exactly 0";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EdgeCases, CudaAttentionEdge, ::testing::ValuesIn(edge_cases()),
                         [](const ::testing::TestParamInfo<EdgeCase>& param_info) { return param_info.param.name; });

// The suite runs twice under ctest: as is, and with THDCP_PORTABLE_KERNELS=1
// (tests/cuda/CMakeLists.txt). On a Hopper GPU the first run must exercise the sm90
// kernels and the second the portable ones, or one family would go untested there.
class CudaKernelChoice : public CudaTest {};

TEST_F(CudaKernelChoice, FollowsDeviceAndEnvironment) {
  int device = 0;
  int major = 0;
  THDCP_CHECK_CUDA(cudaGetDevice(&device));
  THDCP_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  const char* portable = std::getenv("THDCP_PORTABLE_KERNELS");
  const bool forced_portable = portable != nullptr && std::strcmp(portable, "1") == 0;
  const std::string expected = major == 9 && !forced_portable ? "sm90" : "portable";
  std::cout << "compute capability major " << major << ", THDCP_PORTABLE_KERNELS="
            << (portable ? portable : "(unset)") << ": kernels " << cuda::kernel_family() << "\n";
  EXPECT_EQ(expected, cuda::kernel_family());
}

}  // namespace
}  // namespace thdcp::test
