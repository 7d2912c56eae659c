// The dual-chunk map: local <-> global round trips for cp 1..8 and awkward lengths.
#include <gtest/gtest.h>

#include <vector>

#include "support/random_batch.h"
#include "thdcp/plan/rank_split.h"
#include "thdcp/plan/dual_chunk.h"

namespace thdcp {
namespace {

TEST(DualChunk, PositionAndLocateAreInverse) {
  for (int cp = 1; cp <= 8; ++cp) {
    for (int64_t chunk_rows : {1, 2, 3, 7, 16}) {
      std::vector<int> seen(static_cast<size_t>(2 * cp * chunk_rows), 0);
      for (int rank = 0; rank < cp; ++rank) {
        for (int64_t j = 0; j < 2 * chunk_rows; ++j) {
          const int64_t p = dual_chunk_position(j, chunk_rows, cp, rank);
          ASSERT_GE(p, 0);
          ASSERT_LT(p, 2 * cp * chunk_rows);
          ++seen[static_cast<size_t>(p)];
          const DualChunkLocation back = dual_chunk_locate(p, chunk_rows, cp);
          EXPECT_EQ(back.rank, rank) << "cp " << cp << " c " << chunk_rows << " j " << j;
          EXPECT_EQ(back.local_row, j) << "cp " << cp << " c " << chunk_rows << " p " << p;
        }
      }
      for (int count : seen) ASSERT_EQ(count, 1) << "every position belongs to exactly one (rank, row)";
    }
  }
}

TEST(DualChunk, RankHoldsChunksRAndMirror) {
  // Rank r: chunk r first, then chunk 2cp-1-r (DESIGN section 3), checked by position.
  const int cp = 4;
  const int64_t c = 5;
  for (int rank = 0; rank < cp; ++rank) {
    EXPECT_EQ(dual_chunk_position(0, c, cp, rank), rank * c);
    EXPECT_EQ(dual_chunk_position(c, c, cp, rank), (2 * cp - 1 - rank) * c);
    EXPECT_EQ(dual_chunk_index(cp, rank, 0), rank);
    EXPECT_EQ(dual_chunk_index(cp, rank, 1), 2 * cp - 1 - rank);
  }
}

TEST(DualChunk, ValidRowsOfChunksSumToLength) {
  for (int cp = 1; cp <= 8; ++cp) {
    for (int64_t length = 0; length <= 70; ++length) {
      const int64_t padded = cp_padded_length(length, cp);
      const int64_t c = dual_chunk_rows(padded, cp);
      int64_t total = 0;
      for (int k = 0; k < 2 * cp; ++k) {
        const int64_t valid = dual_chunk_valid_rows(length, c, k);
        // Brute force: positions of chunk k below the length.
        int64_t count = 0;
        for (int64_t p = k * c; p < (k + 1) * c; ++p) count += p < length;
        EXPECT_EQ(valid, count) << "cp " << cp << " L " << length << " chunk " << k;
        total += valid;
      }
      EXPECT_EQ(total, length);
    }
  }
}

TEST(DualChunk, SequenceOfRowSkipsEmptySequences) {
  const std::vector<int32_t> offsets = {0, 0, 4, 4, 4, 12, 12};  // sequences 0, 2, 3, 5 empty
  const int num_seqs = 6;
  const int expected[12] = {1, 1, 1, 1, 4, 4, 4, 4, 4, 4, 4, 4};
  for (int row = 0; row < 12; ++row) EXPECT_EQ(sequence_of_row(offsets.data(), num_seqs, row, 1), expected[row]);
  // The local layout of cp = 2 divides offsets by 2.
  for (int row = 0; row < 6; ++row) EXPECT_EQ(sequence_of_row(offsets.data(), num_seqs, row, 2), expected[2 * row]);
}

TEST(DualChunk, GlobalRowRoundTripOnRandomLayouts) {
  Rng rng(7);
  for (int cp = 1; cp <= 8; ++cp) {
    for (int trial = 0; trial < 5; ++trial) {
      std::vector<int64_t> lengths = test::random_lengths(rng, 9, 3 * 2 * cp + 5);
      lengths.push_back(0);
      lengths.push_back(1);
      lengths.insert(lengths.begin(), 1);
      const BatchLayout layout = make_layout(lengths, cp);
      const LayoutView view = layout.view();
      std::vector<int> owner(static_cast<size_t>(layout.total_rows()), 0);
      for (int rank = 0; rank < cp; ++rank) {
        const std::vector<int32_t> map = rank_row_map(view, cp, rank);
        ASSERT_EQ(static_cast<int64_t>(map.size()), layout.total_rows() / cp);
        for (size_t local = 0; local < map.size(); ++local) {
          const int64_t global = dual_chunk_global_row(view.cu_seqlens_padded, view.num_seqs, cp, rank, local);
          EXPECT_EQ(global, map[local]);
          const DualChunkLocation where = dual_chunk_locate_row(view.cu_seqlens_padded, view.num_seqs, cp, global);
          EXPECT_EQ(where.rank, rank);
          EXPECT_EQ(where.local_row, static_cast<int64_t>(local));
          ++owner[static_cast<size_t>(global)];
        }
      }
      for (int count : owner) ASSERT_EQ(count, 1) << "cp " << cp << ": every global row has one owner";
    }
  }
}

}  // namespace
}  // namespace thdcp
