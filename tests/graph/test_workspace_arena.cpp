// WorkspaceArena's accounting, host only (no allocation): the largest need and the sum, a
// take beyond every reservation refused before anything is allocated. Its sharing on the
// GPU is GraphDynamicCp's (test_graph_bank.cpp).
#include <gtest/gtest.h>

#include <string>

#include "thdcp/core/error.h"
#include "thdcp/graph/workspace_arena.h"

namespace thdcp::graph {
namespace {

TEST(WorkspaceArena, HoldsTheLargestNeedAndCountsTheSum) {
  WorkspaceArena arena;
  EXPECT_EQ(arena.bytes(), 0u);
  arena.reserve(100);
  arena.reserve(300);
  arena.reserve(200);
  EXPECT_EQ(arena.bytes(), 300u);
  EXPECT_EQ(arena.separate_bytes(), 600u);
  EXPECT_EQ(arena.users(), 3);
  EXPECT_FALSE(arena.allocated());
}

TEST(WorkspaceArena, ATakeBeyondEveryReservationIsRefusedBeforeAllocating) {
  WorkspaceArena arena;
  arena.reserve(256);
  std::string message;
  try {
    arena.take(257);
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("take(257) but the largest reservation is 256 bytes: reserve(257) first"), std::string::npos)
      << message;
  EXPECT_FALSE(arena.allocated());
}

}  // namespace
}  // namespace thdcp::graph
