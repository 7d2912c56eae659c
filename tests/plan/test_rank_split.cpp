// Dispatch: split a global tensor over ranks and merge it back.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "support/random_batch.h"
#include "thdcp/plan/rank_split.h"

namespace thdcp {
namespace {

TEST(Dispatch, SplitThenMergeRestoresTheTensor) {
  Rng rng(11);
  for (int cp = 1; cp <= 8; ++cp) {
    const BatchLayout layout = make_layout(test::random_lengths(rng, 7, 40), cp);
    HostTensor global(DType::kBFloat16, layout.total_rows(), 3, 8);
    fill_normal(global, 100 + cp);
    HostTensor merged(DType::kBFloat16, layout.total_rows(), 3, 8);
    for (int rank = 0; rank < cp; ++rank) {
      HostTensor local(DType::kBFloat16, layout.total_rows() / cp, 3, 8);
      split_for_rank(global.data(), local.data(), global.row_bytes(), layout.view(), cp, rank);
      // Row j of the local tensor is the global row the dual-chunk map names.
      const std::vector<int32_t> map = rank_row_map(layout.view(), cp, rank);
      for (size_t j = 0; j < map.size(); ++j) {
        ASSERT_EQ(0, std::memcmp(static_cast<const char*>(local.data()) + j * local.row_bytes(),
                                 static_cast<const char*>(global.data()) + map[j] * global.row_bytes(),
                                 local.row_bytes()));
      }
      merge_from_rank(local.data(), merged.data(), global.row_bytes(), layout.view(), cp, rank);
    }
    EXPECT_EQ(0, std::memcmp(global.data(), merged.data(), global.numel() * dtype_size(global.dtype())))
        << "cp " << cp;
  }
}

// Contiguous: rank r holds rows [r T/cp, (r+1) T/cp); split then merge restores the tensor,
// and a layout whose rows are not a multiple of cp is refused, naming the rule.
TEST(Dispatch, ContiguousPiecesAreInOrder) {
  Rng rng(12);
  for (int cp = 1; cp <= 8; ++cp) {
    const BatchLayout layout = make_contiguous_layout(test::random_lengths(rng, 7, 40), cp);
    const int64_t local_rows = layout.total_rows() / cp;
    ASSERT_EQ(layout.total_rows() % cp, 0);
    HostTensor global(DType::kFloat32, layout.total_rows(), 2, 4);
    fill_normal(global, 200 + cp);
    HostTensor merged(DType::kFloat32, layout.total_rows(), 2, 4);
    for (int rank = 0; rank < cp; ++rank) {
      HostTensor local(DType::kFloat32, local_rows, 2, 4);
      split_for_rank(global.data(), local.data(), global.row_bytes(), layout.view(), cp, rank, CpLayout::kContiguous);
      ASSERT_EQ(0, std::memcmp(local.data(), static_cast<const char*>(global.data()) + rank * local_rows * global.row_bytes(),
                               local_rows * global.row_bytes()));
      merge_from_rank(local.data(), merged.data(), global.row_bytes(), layout.view(), cp, rank, CpLayout::kContiguous);
    }
    EXPECT_EQ(0, std::memcmp(global.data(), merged.data(), global.numel() * dtype_size(global.dtype())));
  }
  BatchLayout odd;
  odd.cu_seqlens = {0, 3, 8};
  odd.cu_seqlens_padded = {0, 3, 9};
  try {
    rank_row_map(odd.view(), 2, 0, CpLayout::kContiguous);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("9 rows, not a multiple of cp=2"), std::string::npos) << e.what();
  }
}

TEST(Dispatch, RejectsBadRank) {
  const BatchLayout layout = make_layout({5, 3}, 2);
  try {
    rank_row_map(layout.view(), 2, 2);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank=2 must be in [0, cp=2)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace thdcp
