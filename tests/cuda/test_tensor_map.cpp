// The TMA maps of the Hopper forward (src/cuda/tensor_map.h), checked on the host: the
// arguments encode_thd_tensor_map gives the driver, captured by a stand-in encoder. No GPU
// needed (label cpu); the maps' use by the kernel is covered by the GPU tests.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "cuda/tensor_map.h"
#include "support/expect_error.h"
#include "thdcp/core/error.h"

namespace thdcp::test {
namespace {

struct EncodeCall {
  int calls = 0;
  CUtensorMapDataType type{};
  cuuint32_t rank = 0;
  const void* address = nullptr;
  std::vector<cuuint64_t> dims, strides;
  std::vector<cuuint32_t> box;
  CUtensorMapSwizzle swizzle{};
  CUresult result = CUDA_SUCCESS;
};
EncodeCall g_call;

CUresult fake_encode(CUtensorMap*, CUtensorMapDataType type, cuuint32_t rank, void* address, const cuuint64_t* dims,
                     const cuuint64_t* strides, const cuuint32_t* box, const cuuint32_t*, CUtensorMapInterleave,
                     CUtensorMapSwizzle swizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  ++g_call.calls;
  g_call.type = type;
  g_call.rank = rank;
  g_call.address = address;
  g_call.dims.assign(dims, dims + rank);
  g_call.strides.assign(strides, strides + rank - 1);
  g_call.box.assign(box, box + rank);
  g_call.swizzle = swizzle;
  return g_call.result;
}

class TensorMap : public ::testing::Test {
 protected:
  void SetUp() override { g_call = EncodeCall{}; }
  alignas(16) unsigned char storage_[64] = {};
};

TEST_F(TensorMap, ContiguousTensorIsColumnsHeadsRows) {
  const ConstThdTensor t(storage_, DType::kBFloat16, 1000, 8, 128);
  cuda::detail::encode_thd_tensor_map(fake_encode, "k", t, 128);
  ASSERT_EQ(g_call.calls, 1);
  EXPECT_EQ(g_call.type, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16);
  EXPECT_EQ(g_call.rank, 3u);
  EXPECT_EQ(g_call.address, storage_);
  EXPECT_EQ(g_call.dims, (std::vector<cuuint64_t>{128, 8, 1000}));
  EXPECT_EQ(g_call.strides, (std::vector<cuuint64_t>{256, 8 * 256}));
  // 64 columns (one 128-byte swizzle row) x one head x box_rows rows.
  EXPECT_EQ(g_call.box, (std::vector<cuuint32_t>{64, 1, 128}));
  EXPECT_EQ(g_call.swizzle, CU_TENSOR_MAP_SWIZZLE_128B);
}

TEST_F(TensorMap, PackedViewKeepsItsStrides) {
  // k of a packed QKV buffer [T, 8 + 2 * 2 slots, 64] fp16 with slots 72 elements apart.
  ConstThdTensor t(storage_, DType::kFloat16, 300, 2, 64);
  t.row_stride = 12 * 72;
  t.head_stride = 72;
  cuda::detail::encode_thd_tensor_map(fake_encode, "k", t, 128);
  ASSERT_EQ(g_call.calls, 1);
  EXPECT_EQ(g_call.type, CU_TENSOR_MAP_DATA_TYPE_FLOAT16);
  EXPECT_EQ(g_call.dims, (std::vector<cuuint64_t>{64, 2, 300}));
  EXPECT_EQ(g_call.strides, (std::vector<cuuint64_t>{72 * 2, 12 * 72 * 2}));
  EXPECT_EQ(g_call.box, (std::vector<cuuint32_t>{64, 1, 128}));
}

TEST_F(TensorMap, OneHeadTakesTheRowStrideForItsUnusedHeadStride) {
  ConstThdTensor t(storage_, DType::kBFloat16, 50, 1, 128);
  t.row_stride = 136;
  t.head_stride = 3;  // never applied with one head, and not checked by the plans
  cuda::detail::encode_thd_tensor_map(fake_encode, "v", t, 128);
  ASSERT_EQ(g_call.calls, 1);
  EXPECT_EQ(g_call.dims, (std::vector<cuuint64_t>{128, 1, 50}));
  EXPECT_EQ(g_call.strides, (std::vector<cuuint64_t>{136 * 2, 136 * 2}));
}

TEST_F(TensorMap, EmptyViewGetsAZeroMapWithoutTheDriver) {
  const ConstThdTensor t(nullptr, DType::kBFloat16, 0, 8, 128);
  const cuda::detail::ThdTensorMap map = cuda::detail::encode_thd_tensor_map(fake_encode, "q", t, 128);
  EXPECT_EQ(g_call.calls, 0);
  const cuda::detail::ThdTensorMap zero{};
  EXPECT_EQ(0, std::memcmp(&map, &zero, sizeof(map)));
}

TEST_F(TensorMap, DriverRefusalNamesTheTensorAndItsLayout) {
  g_call.result = CUDA_ERROR_INVALID_VALUE;
  const ConstThdTensor t(storage_, DType::kBFloat16, 1000, 8, 128);
  expect_error([&] { cuda::detail::encode_thd_tensor_map(fake_encode, "q", t, 128); },
               {"cannot describe q", "1000 rows, 8 heads", "THDCP_PORTABLE_KERNELS=1"});
}

// A head-major view ([H, T, D] memory: row stride D, head stride of a cache's rows) is
// described heads outermost, (columns, rows, heads), so that the outer strides increase,
// with boxes of box_rows rows of one head; heads_outer tells the kernel to swap the
// coordinates. The same for rows interleaved with heads (head stride above row stride).
TEST_F(TensorMap, HeadMajorViewIsColumnsRowsHeads) {
  ConstThdTensor t(storage_, DType::kBFloat16, 100, 4, 64);
  t.head_stride = 4096 * 64;  // a slice of a cache of 4096 rows
  t.row_stride = 64;
  const cuda::detail::ThdTensorMap map = cuda::detail::encode_thd_tensor_map(fake_encode, "v", t, 128);
  ASSERT_EQ(g_call.calls, 1);
  EXPECT_EQ(map.heads_outer, 1);
  EXPECT_EQ(g_call.dims, (std::vector<cuuint64_t>{64, 100, 4}));
  EXPECT_EQ(g_call.strides, (std::vector<cuuint64_t>{64 * 2, 4096 * 64 * 2}));
  EXPECT_EQ(g_call.box, (std::vector<cuuint32_t>{64, 128, 1}));

  ConstThdTensor interleaved(storage_, DType::kFloat16, 300, 2, 128, 2 * 128, 3 * 128);
  EXPECT_EQ(cuda::detail::encode_thd_tensor_map(fake_encode, "k", interleaved, 64).heads_outer, 1);
  EXPECT_EQ(g_call.dims, (std::vector<cuuint64_t>{128, 300, 2}));
  EXPECT_EQ(g_call.strides, (std::vector<cuuint64_t>{2 * 128 * 2, 3 * 128 * 2}));
  EXPECT_EQ(g_call.box, (std::vector<cuuint32_t>{64, 64, 1}));

  const ConstThdTensor contiguous(storage_, DType::kBFloat16, 1000, 8, 128);
  EXPECT_EQ(cuda::detail::encode_thd_tensor_map(fake_encode, "q", contiguous, 128).heads_outer, 0);
}

// One row: its stride is never applied (and not checked); the map takes the span of its
// heads, so the outer strides still increase.
TEST_F(TensorMap, OneRowTakesTheHeadsSpanForItsUnusedRowStride) {
  ConstThdTensor t(storage_, DType::kBFloat16, 1, 4, 64);
  t.row_stride = 7;
  t.head_stride = 1000 * 64;
  const cuda::detail::ThdTensorMap map = cuda::detail::encode_thd_tensor_map(fake_encode, "k", t, 128);
  EXPECT_EQ(map.heads_outer, 0);
  EXPECT_EQ(g_call.dims, (std::vector<cuuint64_t>{64, 4, 1}));
  EXPECT_EQ(g_call.strides, (std::vector<cuuint64_t>{1000 * 64 * 2, 4 * 1000 * 64 * 2}));
}

}  // namespace
}  // namespace thdcp::test
