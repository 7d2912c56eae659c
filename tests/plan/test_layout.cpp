// Layouts: padding, capacity with placeholders, and every validation rule.
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "support/expect_error.h"
#include "support/random_batch.h"
#include "thdcp/core/error.h"
#include "thdcp/plan/layout.h"
#include "thdcp/plan/rank_split.h"

namespace thdcp {
namespace {

LayoutView view_of(const std::vector<int32_t>& cu, const std::vector<int32_t>& cup) {
  return LayoutView{cu.data(), cup.data(), static_cast<int>(cu.size()) - 1};
}

TEST(Layout, PadsToMultiplesOfTwoCp) {
  EXPECT_EQ(cp_padded_length(0, 1), 0);
  EXPECT_EQ(cp_padded_length(1, 1), 2);
  EXPECT_EQ(cp_padded_length(7, 2), 8);
  EXPECT_EQ(cp_padded_length(8, 2), 8);
  EXPECT_EQ(cp_padded_length(9, 4), 16);
  const BatchLayout layout = make_layout({5, 0, 1, 16}, 4);
  EXPECT_EQ(layout.cu_seqlens, (std::vector<int32_t>{0, 5, 5, 6, 22}));
  EXPECT_EQ(layout.cu_seqlens_padded, (std::vector<int32_t>{0, 8, 8, 16, 32}));
  validate_layout(layout.view(), 32, 4);
}

TEST(Layout, PaddingThatWouldOverflowInt64IsRefused) {
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(cp_padded_length(max - 7, 4), max - 7);  // max - 7 = 2^63 - 8, a multiple of 8
  test::expect_error([&] { cp_padded_length(max - 6, 4); }, {"sequence length", "2*cp=8", "int64"});
  test::expect_error([&] { make_layout({max}, 1); }, {"cannot be padded"});
}

TEST(Layout, CapacityAddsPlaceholders) {
  const BatchLayout layout = make_layout({5, 3}, 2, Capacity{5, 40});
  EXPECT_EQ(layout.cu_seqlens, (std::vector<int32_t>{0, 5, 8, 8, 8, 8}));
  EXPECT_EQ(layout.cu_seqlens_padded, (std::vector<int32_t>{0, 8, 12, 12, 12, 40}));
  validate_layout(layout.view(), 40, 2);
  // Exactly max_seqs - 1 real sequences fit; the last placeholder absorbs the slack.
  const BatchLayout full = make_layout({4, 4, 4, 4}, 2, Capacity{5, 16});
  EXPECT_EQ(full.cu_seqlens_padded, (std::vector<int32_t>{0, 4, 8, 12, 16, 16}));
}

TEST(Layout, CapacityErrors) {
  EXPECT_THDCP_ERROR(make_layout({1, 1, 1, 1, 1}, 1, Capacity{5, 64}), "holds at most 4");
  EXPECT_THDCP_ERROR(make_layout({30, 30}, 1, Capacity{5, 40}), "raise max_tokens");
  EXPECT_THDCP_ERROR(make_layout({3}, 2, Capacity{5, 42}), "not a multiple of 2*cp=4");
  EXPECT_THDCP_ERROR(make_layout({3}, 2, Capacity{0, 40}), "capacity.max_seqs=0");
  EXPECT_THDCP_ERROR(make_layout({-3}, 2), "lengths[0]=-3 is negative");
  EXPECT_THDCP_ERROR(make_layout({3}, 0), "cp=0 must be >= 1");
}

// The contiguous layout in capacity form: no padding of the documents, placeholders after
// them, the last absorbing the rows up to max_tokens; the rank split accepts it.
TEST(Layout, ContiguousCapacityAddsPlaceholders) {
  const BatchLayout layout = make_contiguous_layout({5, 0, 7}, 4, Capacity{6, 24});
  EXPECT_EQ(layout.cu_seqlens, (std::vector<int32_t>{0, 5, 5, 12, 12, 12, 12}));
  EXPECT_EQ(layout.cu_seqlens_padded, (std::vector<int32_t>{0, 5, 5, 12, 12, 12, 24}));
  validate_cp_layout(layout.view(), 24, 4, CpLayout::kContiguous);
  const BatchLayout full = make_contiguous_layout({3, 9}, 3, Capacity{3, 12});
  EXPECT_EQ(full.cu_seqlens_padded, (std::vector<int32_t>{0, 3, 12, 12}));
  EXPECT_THDCP_ERROR(make_contiguous_layout({1, 1, 1}, 2, Capacity{3, 8}), "holds at most 2");
  EXPECT_THDCP_ERROR(make_contiguous_layout({30, 30}, 2, Capacity{5, 40}), "raise max_tokens");
  EXPECT_THDCP_ERROR(make_contiguous_layout({3}, 3, Capacity{5, 40}), "not a multiple of cp=3");
  EXPECT_THDCP_ERROR(make_contiguous_layout({3}, 2, Capacity{0, 40}), "capacity.max_seqs=0");
  EXPECT_THDCP_ERROR(make_contiguous_layout({-3}, 2, Capacity{5, 40}), "lengths[0]=-3 is negative");
}

TEST(Layout, ValidationRules) {
  // Each rule, broken once, with the message naming index, value and rule.
  EXPECT_THDCP_ERROR(validate_layout(view_of({1, 4}, {0, 4}), 4, 0), "cu_seqlens[0]=1 must be 0");
  EXPECT_THDCP_ERROR(validate_layout(view_of({0, 4}, {2, 4}), 4, 0), "cu_seqlens_padded[0]=2 must be 0");
  EXPECT_THDCP_ERROR(validate_layout(view_of({0, 4, 3}, {0, 4, 8}), 8, 0),
                     "cu_seqlens[2]=3 is less than cu_seqlens[1]=4");
  EXPECT_THDCP_ERROR(validate_layout(view_of({0, 2, 3}, {0, 4, 2}), 2, 0),
                     "cu_seqlens_padded[2]=2 is less than cu_seqlens_padded[1]=4");
  EXPECT_THDCP_ERROR(validate_layout(view_of({0, 5}, {0, 4}), 4, 0), "P_b must be >= L_b");
  EXPECT_THDCP_ERROR(validate_layout(view_of({0, 3, 6}, {0, 4, 10}), 10, 2),
                     "cu_seqlens_padded[2]-cu_seqlens_padded[1]=6 is not a multiple of 2*cp=4");
  EXPECT_THDCP_ERROR(validate_layout(view_of({0, 3}, {0, 4}), 8, 0),
                     "cu_seqlens_padded[1]=4 must equal the number of rows of the tensors, T=8");
  EXPECT_THDCP_ERROR(validate_layout(view_of({0}, {0}), 0, 0), "needs at least 2");
  EXPECT_THDCP_ERROR(validate_layout(view_of({0, 3}, {0, 4}), int64_t{1} << 32, 0), "2^31-1");
  EXPECT_THDCP_ERROR(validate_layout(view_of({0, 3}, {0, 4}), 4, -1), "cp=-1 must be >= 1");
  EXPECT_THDCP_ERROR(layout_from_int64({0, int64_t{3} << 31}, {0, int64_t{3} << 31}),
                     "cu_seqlens[1]=6442450944 does not fit int32");
  EXPECT_THDCP_ERROR(layout_from_int64({0, 3}, {0, 4, 8}), "cu_seqlens has 2 entries but cu_seqlens_padded has 3");
  // cp = 1 still needs even padded lengths: its two chunks must be equal.
  EXPECT_THDCP_ERROR(validate_layout(view_of({0, 3}, {0, 3}), 3, 1), "not a multiple of 2*cp=2");
  // A single-device call (cp = 0) accepts any padding.
  validate_layout(view_of({0, 3}, {0, 3}), 3, 0);
}

}  // namespace
}  // namespace thdcp
