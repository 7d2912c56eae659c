// The CUDA backend's view checks (src/cuda/attention_checks.h), on the host: no GPU needed
// (label cpu). Every view the kernels can address passes (head-major, padded, interleaved,
// one-row and one-head views with unused strides); a stride or pointer off 16 bytes, a row's
// heads beyond 32-bit offsets and a negative stride are refused naming the tensor, the value
// and the rule. The views' use by the kernels is covered by the GPU tests.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/attention_checks.h"
#include "support/expect_error.h"

namespace thdcp::test {
namespace {

using cuda::detail::check_view;
using cuda::detail::dense;
using cuda::detail::strides_of;

alignas(16) unsigned char g_memory[64];

ConstThdTensor view(DType dtype, int64_t rows, int64_t heads, int64_t head_dim, int64_t row_stride,
                    int64_t head_stride, int64_t byte_offset = 0) {
  return ConstThdTensor(g_memory + byte_offset, dtype, rows, heads, head_dim, row_stride, head_stride);
}

ThdShape shape_of(const ConstThdTensor& t) { return ThdShape{t.tokens, "rows", t.heads, "heads", t.head_dim}; }

void check(const char* name, const ConstThdTensor& t) { check_view(name, t, shape_of(t), t.dtype, true); }

TEST(CudaViewChecks, ViewsTheKernelsCanAddressPass) {
  const DType bf16 = DType::kBFloat16;
  EXPECT_NO_THROW(check("q", view(bf16, 1000, 8, 128, 0, 0)));                 // contiguous
  EXPECT_NO_THROW(check("k", view(bf16, 1000, 8, 128, 0, 4096 * 128)));        // head-major cache slice
  EXPECT_NO_THROW(check("k", view(bf16, 1000, 8, 128, 8 * 136 + 16, 136)));    // padded rows and heads
  EXPECT_NO_THROW(check("k", view(bf16, 1000, 2, 64, 128, 192)));              // interleaved
  EXPECT_NO_THROW(check("k", view(bf16, 1000, 8, 128, 128, 128)));             // overlapping input: not checked here
  EXPECT_NO_THROW(check("q", view(bf16, 1, 8, 128, 3, 0)));                    // one row: its stride unused
  EXPECT_NO_THROW(check("v", view(bf16, 1000, 1, 128, 128, 5)));               // one head: its stride unused
  EXPECT_NO_THROW(check("dq", view(DType::kFloat32, 1000, 8, 128, 8 * 132, 132)));  // fp32: 4-element multiples
}

TEST(CudaViewChecks, RefusalsNameTheTensorTheValueAndTheRule) {
  const DType bf16 = DType::kBFloat16;
  EXPECT_THDCP_ERROR(check("k", view(bf16, 100, 2, 64, 204, 0)),
                     "k.row_stride=204 is not a multiple of 8 elements (16 bytes of bf16): the CUDA kernels move "
                     "rows in 16-byte pieces (cp.async, TMA); pad the rows to a multiple of 8 elements");
  EXPECT_THDCP_ERROR(check("v", view(bf16, 100, 2, 64, 0, 100 * 64 + 4)),
                     "v.head_stride=6404 is not a multiple of 8 elements");
  EXPECT_THDCP_ERROR(check("dq", view(DType::kFloat32, 100, 2, 64, 130, 64)),
                     "dq.row_stride=130 is not a multiple of 4 elements (16 bytes of fp32)");
  EXPECT_THDCP_ERROR(check("q", view(bf16, 100, 2, 64, 0, 0, 8)), "is not 16-byte aligned");
  EXPECT_THDCP_ERROR(check("k", view(bf16, 100, 3, 64, 64, int64_t{1} << 30)),
                     "k has 3 heads 1073741824 elements apart: (heads - 1) * head_stride + head_dim = 2147483712 is "
                     "above 2^31 elements");
  EXPECT_THDCP_ERROR(check("k", view(bf16, 100, 2, 64, int64_t{1} << 26, 64)), "is not below 2^26 elements");
  EXPECT_THDCP_ERROR(check("k", view(bf16, 100, 2, 64, -8, 0)), "k has row_stride=-8 and head_stride=0");
}

TEST(CudaViewChecks, UnusedStridesReachTheKernelsAsContiguousOnes) {
  const ConstThdTensor one_row = view(DType::kBFloat16, 1, 8, 128, 3, 0);
  EXPECT_EQ(strides_of(one_row).row, 8 * 128);
  EXPECT_TRUE(dense(one_row));
  const ConstThdTensor one_head = view(DType::kBFloat16, 10, 1, 128, 128, 5);
  EXPECT_EQ(strides_of(one_head).head, 128);
  EXPECT_TRUE(dense(one_head));
  const ConstThdTensor head_major = view(DType::kBFloat16, 10, 4, 128, 128, 10 * 128);
  EXPECT_EQ(strides_of(head_major).row, 128);
  EXPECT_EQ(strides_of(head_major).head, 10 * 128);
  EXPECT_FALSE(dense(head_major));
}

}  // namespace
}  // namespace thdcp::test
