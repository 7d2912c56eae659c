// Sizes the C ABI computes from its arguments are overflow-checked before use, and buffers
// that may not overlap are refused when they do: each refusal names the argument, and what
// the caller owns is left as it was; the values just inside each limit are accepted.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "support/capi/capi_support.h"
#include "support/random_batch.h"
#include "thdcp/plan/rank_split.h"
#include "thdcp/thdcp.h"

namespace thdcp {
namespace {

using test::c_layout;
using test::c_tensor;
using test::Snapshot;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

TEST(CApiSizes, SplitAndMergeRefuseRowBytesThatOverflow) {
  const BatchLayout layout = make_layout({5, 11}, 2);  // T = 8 + 12 = 20 rows
  const thdcp_layout_t c = c_layout(layout);
  std::vector<float> global(20, 1.0f), local(10, -1.0f);
  Snapshot snapshot;
  snapshot.add(local).add(global);
  for (const size_t row_bytes : {size_t{1} << 62, std::numeric_limits<size_t>::max(), size_t{1} << 59}) {
    SCOPED_TRACE(row_bytes);
    const std::string named = "row_bytes=" + std::to_string(row_bytes) + " times the layout's T=20 rows";
    EXPECT_C_STATUS(thdcp_cp_split(global.data(), local.data(), row_bytes, &c, 2, 0), THDCP_ERROR_INVALID_ARGUMENT,
                    "thdcp_cp_split: " + named, "the bytes of one row");
    EXPECT_C_STATUS(thdcp_cp_merge(local.data(), global.data(), row_bytes, &c, 2, 1), THDCP_ERROR_INVALID_ARGUMENT,
                    "thdcp_cp_merge: " + named);
  }
  EXPECT_TRUE(snapshot.unchanged());
}

// One allocation holds both buffers: they overlap, or sit side by side (accepted).
TEST(CApiSizes, SplitAndMergeRefuseOverlappingBuffers) {
  const BatchLayout layout = make_layout({5, 11}, 2);  // T = 20 rows of 4 bytes; a rank holds 10
  const thdcp_layout_t c = c_layout(layout);
  std::vector<float> memory(40);
  for (size_t i = 0; i < memory.size(); ++i) memory[i] = static_cast<float>(i);
  const std::vector<float> original = memory;
  float* global = memory.data();
  for (const size_t local_offset : {size_t{0}, size_t{10}, size_t{19}}) {
    SCOPED_TRACE(local_offset);
    EXPECT_C_STATUS(thdcp_cp_split(global, global + local_offset, 4, &c, 2, 0), THDCP_ERROR_INVALID_ARGUMENT,
                    "thdcp_cp_split: global=", "(80 bytes) and local=", "(40 bytes) overlap", "separate buffers");
    EXPECT_C_STATUS(thdcp_cp_merge(global + local_offset, global, 4, &c, 2, 1), THDCP_ERROR_INVALID_ARGUMENT,
                    "thdcp_cp_merge: local=", "(40 bytes) and global=", "(80 bytes) overlap");
  }
  // The local rows before the global ones, overlapping by one row.
  EXPECT_C_STATUS(thdcp_cp_split(global + 9, global, 4, &c, 2, 0), THDCP_ERROR_INVALID_ARGUMENT, "overlap");
  EXPECT_EQ(memory, original) << "a refused call wrote the buffers";

  // Side by side: global [0, 20), local [20, 30).
  ASSERT_C_OK(thdcp_cp_split(global, global + 20, 4, &c, 2, 1));
  const std::vector<int32_t> map = rank_row_map(layout.view(), 2, 1);
  for (size_t i = 0; i < map.size(); ++i) EXPECT_EQ(memory[20 + i], original[static_cast<size_t>(map[i])]) << i;
  std::vector<float> back(20, -1.0f);
  ASSERT_C_OK(thdcp_cp_merge(global + 20, back.data(), 4, &c, 2, 1));
  for (size_t i = 0; i < map.size(); ++i) EXPECT_EQ(back[static_cast<size_t>(map[i])], original[static_cast<size_t>(map[i])]);
}

TEST(CApiSizes, PaddedRowsThatOverflowAreRefused) {
  int64_t rows = -1;
  const int64_t largest[] = {kInt64Max - 2};  // padded to kInt64Max - 1
  EXPECT_C_OK(thdcp_padded_rows(largest, 1, 1, &rows));
  EXPECT_EQ(rows, kInt64Max - 1) << "the largest sum that fits";
  const int64_t one_past[] = {kInt64Max};  // padded to an even count: 2^63
  const int64_t two_halves[] = {int64_t{1} << 62, 0, int64_t{1} << 62};
  rows = -1;
  EXPECT_C_STATUS(thdcp_padded_rows(one_past, 1, 1, &rows), THDCP_ERROR_INVALID_ARGUMENT,
                  "thdcp_padded_rows: lengths[0]=9223372036854775807 is within 2*cp=2 of 2^63-1");
  EXPECT_C_STATUS(thdcp_padded_rows(two_halves, 3, 1, &rows), THDCP_ERROR_INVALID_ARGUMENT,
                  "thdcp_padded_rows: lengths: the documents padded to multiples of 2*cp=2 add up to more than "
                  "2^63-1 rows at lengths[2]=4611686018427387904");
  EXPECT_C_STATUS(thdcp_padded_rows(largest, 1, 3, &rows), THDCP_ERROR_INVALID_ARGUMENT,
                  "lengths[0]=9223372036854775805 is within 2*cp=6");
  EXPECT_EQ(rows, -1) << "a refused call wrote the rows";

  // The helpers that pad documents refuse the same sums before their layout arithmetic.
  const thdcp_capacity_t capacity{64, 4};
  thdcp_fit_t fit = THDCP_FIT_FITS;
  EXPECT_C_STATUS(thdcp_capacity_check_fit(two_halves, 3, 1, &capacity, &fit), THDCP_ERROR_INVALID_ARGUMENT,
                  "thdcp_capacity_check_fit: lengths: the documents padded");
  int32_t cu[5] = {}, cup[5] = {};
  EXPECT_C_STATUS(thdcp_make_layout(two_halves, 3, 1, cu, cup), THDCP_ERROR_INVALID_ARGUMENT,
                  "thdcp_make_layout: lengths: the documents padded");
  EXPECT_C_STATUS(thdcp_capacity_layout(one_past, 1, 1, &capacity, cu, cup), THDCP_ERROR_INVALID_ARGUMENT,
                  "thdcp_capacity_layout: lengths[0]=9223372036854775807");
  const int32_t sizes[] = {1, 2};
  int32_t chosen = -1;
  EXPECT_C_STATUS(thdcp_choose_cp_size(two_halves, 3, sizes, 2, 1024, &chosen), THDCP_ERROR_INVALID_ARGUMENT,
                  "thdcp_choose_cp_size: lengths: the documents padded");
  thdcp_capacity_plan_params params = THDCP_CAPACITY_PLAN_PARAMS_INIT;
  params.tokens = 64;
  params.long_documents = 1;
  thdcp_capacity_plan_result result{};
  result.struct_size = sizeof(result);
  EXPECT_C_STATUS(thdcp_plan_capacity(one_past, 1, &params, &result), THDCP_ERROR_INVALID_ARGUMENT,
                  "thdcp_plan_capacity: lengths[0]=9223372036854775807");
  // Splitting 2^40 tokens into pieces of 64 would make 2^34 documents: refused before any.
  const int64_t huge[] = {int64_t{1} << 40};
  EXPECT_C_STATUS(thdcp_plan_capacity(huge, 1, &params, &result), THDCP_ERROR_INVALID_ARGUMENT,
                  "lengths split into pieces of at most 64 tokens (params->tokens=64) make more than 2^31-1 "
                  "documents");
  EXPECT_EQ(fit, THDCP_FIT_FITS);
  EXPECT_EQ(chosen, -1);
  EXPECT_EQ(result.batches, 0);
}

TEST(CApiSizes, ChooseCpSizeAndPlanCapacityBounds) {
  const int64_t lengths[] = {5, 11};
  const int32_t sizes[] = {1, 4};
  int32_t chosen = -1;
  EXPECT_C_STATUS(thdcp_choose_cp_size(lengths, 2, sizes, 2, kInt64Max, &chosen), THDCP_ERROR_INVALID_ARGUMENT,
                  "rows_per_rank=9223372036854775807 times cp_sizes[1]=4 overflows 64 bits");
  const int32_t zero[] = {2, 0};
  EXPECT_C_STATUS(thdcp_choose_cp_size(lengths, 2, zero, 2, 8, &chosen), THDCP_ERROR_INVALID_ARGUMENT,
                  "cp_sizes[1]=0 must be >= 1");
  EXPECT_C_STATUS(thdcp_choose_cp_size(lengths, 2, sizes, 2, 0, &chosen), THDCP_ERROR_INVALID_ARGUMENT,
                  "rows_per_rank=0 must be >= 1");
  EXPECT_EQ(chosen, -1);
  EXPECT_C_OK(thdcp_choose_cp_size(lengths, 2, sizes, 2, kInt64Max / 4, &chosen));
  EXPECT_EQ(chosen, 1);

  thdcp_capacity_plan_params params = THDCP_CAPACITY_PLAN_PARAMS_INIT;
  params.tokens = int64_t{1} << 31;
  thdcp_capacity_plan_result result{};
  result.struct_size = sizeof(result);
  EXPECT_C_STATUS(thdcp_plan_capacity(lengths, 2, &params, &result), THDCP_ERROR_INVALID_ARGUMENT,
                  "params->tokens=2147483648 must be in [2*cp_size=2, 2^31)");
}

// A refused cp_size's message prints 2*cp_size in 64 bits: from 2^30 on it does not fit an
// int (signed overflow under UBSan before; tests/fuzz findings, 4).
TEST(CApiSizes, MessagesPrintTwiceTheLargestCpSize) {
  const int64_t lengths[] = {5, 11};
  thdcp_capacity_plan_params params = THDCP_CAPACITY_PLAN_PARAMS_INIT;
  params.tokens = 64;
  params.cp_size = std::numeric_limits<int32_t>::max();
  thdcp_capacity_plan_result result{};
  result.struct_size = sizeof(result);
  EXPECT_C_STATUS(thdcp_plan_capacity(lengths, 2, &params, &result), THDCP_ERROR_INVALID_ARGUMENT,
                  "params->tokens=64 must be in [2*cp_size=4294967294, 2^31)");

  thdcp_cp_params cp = THDCP_CP_PARAMS_INIT;
  cp.cp_size = int32_t{1} << 30;
  cp.max_tokens = 16;
  cp.max_seqs = 1;
  cp.q_heads = 1;
  cp.kv_heads = 1;
  cp.head_dim = 8;
  size_t bytes = 99;
  EXPECT_C_STATUS(thdcp_cp_plan_workspace_size(&cp, &bytes), THDCP_ERROR_INVALID_ARGUMENT,
                  "params->max_tokens=16 must be a multiple of 2*cp_size=2147483648");
  EXPECT_EQ(bytes, 99u);
}

// thdcp_plan_capacity estimates its memory before it allocates: one document of 2^20 tokens
// split for batches of 16 rows is 65536 documents in as many batches, a few MiB; a budget
// of 1 MiB refuses it with OUT_OF_MEMORY, this machine's memory (max_memory 0) plans it.
TEST(CApiSizes, PlanCapacityChecksItsMemoryEstimateFirst) {
  const int64_t one[] = {int64_t{1} << 20};
  thdcp_capacity_plan_params params = THDCP_CAPACITY_PLAN_PARAMS_INIT;
  params.tokens = 16;
  params.long_documents = 1;
  params.max_memory = 1 << 20;
  thdcp_capacity_plan_result result{};
  result.struct_size = sizeof(result);
  EXPECT_C_STATUS(thdcp_plan_capacity(one, 1, &params, &result), THDCP_ERROR_OUT_OF_MEMORY,
                  "(65536 documents in 65536 batches), more than params->max_memory=1 MiB: raise params->tokens");
  EXPECT_EQ(result.batches, 0);
  params.max_memory = -1;
  EXPECT_C_STATUS(thdcp_plan_capacity(one, 1, &params, &result), THDCP_ERROR_INVALID_ARGUMENT,
                  "params->max_memory=-1 must be >= 0");
  params.max_memory = 0;
  EXPECT_C_OK(thdcp_plan_capacity(one, 1, &params, &result));
  EXPECT_EQ(result.batches, 65536);
  EXPECT_EQ(result.capacity.max_tokens, 16);
}

// max_tokens * q_heads * head_dim below 2^53: the largest plan shapes are accepted, one
// head more is refused at plan time, on both plan types.
TEST(CApiSizes, PlanShapesWhoseSizesOverflowAreRefused) {
  thdcp_attention_params p = THDCP_ATTENTION_PARAMS_INIT;
  p.max_tokens = std::numeric_limits<int32_t>::max();
  p.max_seqs = 1;
  p.q_heads = int64_t{1} << 14;
  p.kv_heads = 1;
  p.head_dim = 256;
  size_t bytes = 99;
  EXPECT_C_OK(thdcp_attention_plan_workspace_size(&p, &bytes));  // (2^31 - 1) * 2^22 < 2^53
  p.q_heads += 1;
  bytes = 99;
  EXPECT_C_STATUS(thdcp_attention_plan_workspace_size(&p, &bytes), THDCP_ERROR_INVALID_ARGUMENT,
                  "params->max_tokens=2147483647 * q_heads=16385 * head_dim=256", "2^53 or more");
  p.q_heads = int64_t{1} << 30;  // the product overflows 64 bits
  thdcp_attention_plan_t plan = nullptr;
  EXPECT_C_STATUS(thdcp_attention_plan_create(&p, nullptr, 0, &plan), THDCP_ERROR_INVALID_ARGUMENT,
                  "q_heads=1073741824", "overflow 64 bits");
  EXPECT_EQ(plan, nullptr);
  EXPECT_EQ(bytes, 99u);

  thdcp_cp_params cp = THDCP_CP_PARAMS_INIT;
  cp.max_tokens = int64_t{1} << 30;
  cp.max_seqs = 1;
  cp.q_heads = int64_t{1} << 16;
  cp.kv_heads = 1;
  cp.head_dim = 256;
  EXPECT_C_STATUS(thdcp_cp_plan_workspace_size(&cp, &bytes), THDCP_ERROR_INVALID_ARGUMENT,
                  "thdcp_cp_plan_workspace_size: params->max_tokens=1073741824 * q_heads=65536 * head_dim=256");
}

// A tensor's strides are the caller's: one whose last element lies past a 64-bit byte offset
// is refused at the run, naming it, before anything is written.
TEST(CApiSizes, TensorStridesThatOverflowAreRefused) {
  const test::Batch b = test::make_batch(make_layout({5, 9}, 1), DType::kFloat32, 2, 1, 8, 31);
  thdcp_attention_params p = THDCP_ATTENTION_PARAMS_INIT;
  test::set_shape(p, test::Shape{DType::kFloat32, 2, 1, 8, Mask::causal()}, Capacity{2, 16});
  p.num_threads = 1;
  thdcp_attention_plan_t plan = nullptr;
  ASSERT_C_OK(thdcp_attention_plan_create(&p, nullptr, 0, &plan));
  HostTensor out(DType::kFloat32, 16, 2, 8);
  std::vector<float> lse(32, -5.0f);
  Snapshot snapshot;
  snapshot.add(out).add(lse);
  const thdcp_layout_t layout = c_layout(b.layout);
  thdcp_tensor_t q = c_tensor(b.q), k = c_tensor(b.k), v = c_tensor(b.v), o = c_tensor(out);
  q.row_stride = kInt64Max / 8;  // 15 rows of it overflow
  EXPECT_C_STATUS(thdcp_attention_forward(plan, &layout, &q, &k, &v, &o, lse.data(), nullptr, nullptr),
                  THDCP_ERROR_INVALID_ARGUMENT, "thdcp_attention_forward: q is [16, 2, 8] with row_stride=",
                  "overflows 64 bits");
  q = c_tensor(b.q);
  o.head_stride = kInt64Max / 2;
  EXPECT_C_STATUS(thdcp_attention_forward(plan, &layout, &q, &k, &v, &o, lse.data(), nullptr, nullptr),
                  THDCP_ERROR_INVALID_ARGUMENT, "out is [16, 2, 8] with row_stride=0 and head_stride=",
                  "overflows 64 bits");
  o = c_tensor(out);
  v.row_stride = (kInt64Max / 4) / 15 + 1;  // elements fit, bytes (x4) do not
  EXPECT_C_STATUS(thdcp_attention_forward(plan, &layout, &q, &k, &v, &o, lse.data(), nullptr, nullptr),
                  THDCP_ERROR_INVALID_ARGUMENT, "v is [16, 1, 8]", "overflows 64 bits");
  EXPECT_TRUE(snapshot.unchanged());
  EXPECT_C_OK(thdcp_attention_plan_destroy(plan));
}

}  // namespace
}  // namespace thdcp
