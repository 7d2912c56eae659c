// The in-process communicator: collective results and release on failure.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "support/random_batch.h"
#include "thdcp/comm/communicator.h"

namespace thdcp {
namespace {

TEST(InProcessComm, Collectives) {
  const int size = 4;
  std::vector<std::vector<float>> gathered(size), scattered(size), maxima(size), exchanged(size);
  run_in_process(size, [&](Communicator& comm) {
    const int r = comm.rank();
    EXPECT_EQ(comm.size(), size);
    std::vector<float> send = {static_cast<float>(r), static_cast<float>(10 * r)};
    std::vector<float> all(2 * size);
    comm.all_gather(send.data(), all.data(), 2 * sizeof(float));
    gathered[r] = all;
    // Rank r contributes r + 1 to block b's element i: block b's sum is sum_r (r + 1) * (b + i + 1).
    std::vector<float> blocks(3 * size);
    for (int b = 0; b < size; ++b) {
      for (int i = 0; i < 3; ++i) blocks[b * 3 + i] = static_cast<float>((r + 1) * (b + i + 1));
    }
    std::vector<float> mine(3);
    comm.reduce_scatter_sum(blocks.data(), mine.data(), 3);
    scattered[r] = mine;
    std::vector<float> m = {static_cast<float>(r), static_cast<float>(-r), r == 2 ? 100.0f : -1.0f};
    comm.all_reduce_max(m.data(), m.size());
    maxima[r] = m;
    // Rank r sends 100 * r + b, 100 * r + b + 0.5 to rank b.
    std::vector<float> outgoing(2 * size), incoming(2 * size);
    for (int b = 0; b < size; ++b) {
      outgoing[2 * b] = static_cast<float>(100 * r + b);
      outgoing[2 * b + 1] = static_cast<float>(100 * r + b) + 0.5f;
    }
    comm.all_to_all(outgoing.data(), incoming.data(), 2 * sizeof(float));
    exchanged[r] = incoming;
  });
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(gathered[r], (std::vector<float>{0, 0, 1, 10, 2, 20, 3, 30}));
    const float rank_sum = 1 + 2 + 3 + 4;
    EXPECT_EQ(scattered[r], (std::vector<float>{rank_sum * (r + 1), rank_sum * (r + 2), rank_sum * (r + 3)}));
    EXPECT_EQ(maxima[r], (std::vector<float>{3, 0, 100}));
    for (int from = 0; from < size; ++from) {
      EXPECT_EQ(exchanged[r][2 * from], static_cast<float>(100 * from + r));
      EXPECT_EQ(exchanged[r][2 * from + 1], static_cast<float>(100 * from + r) + 0.5f);
    }
  }
}

// all_to_all_v: rank f sends (f + t) % 3 floats to rank t (empty blocks included), each
// float naming its sender, receiver and index; every block lands at its place.
TEST(InProcessComm, AllToAllVMovesBlocksOfAnySize) {
  const int size = 4;
  auto count = [](int from, int to) { return static_cast<size_t>((from + to) % 3); };
  auto value = [](int from, int to, size_t i) { return static_cast<float>(100 * from + 10 * to) + static_cast<float>(i); };
  std::vector<std::vector<float>> received(size);
  run_in_process(size, [&](Communicator& comm) {
    const int r = comm.rank();
    std::vector<size_t> send_bytes, recv_bytes;
    std::vector<float> outgoing;
    for (int to = 0; to < size; ++to) {
      send_bytes.push_back(count(r, to) * sizeof(float));
      recv_bytes.push_back(count(to, r) * sizeof(float));
      for (size_t i = 0; i < count(r, to); ++i) outgoing.push_back(value(r, to, i));
    }
    std::vector<float> incoming(8, -1.0f);
    comm.all_to_all_v(outgoing.data(), send_bytes.data(), incoming.data(), recv_bytes.data());
    received[static_cast<size_t>(r)] = incoming;
  });
  for (int r = 0; r < size; ++r) {
    std::vector<float> wanted;
    for (int from = 0; from < size; ++from) {
      for (size_t i = 0; i < count(from, r); ++i) wanted.push_back(value(from, r, i));
    }
    wanted.resize(8, -1.0f);  // nothing written past the blocks
    EXPECT_EQ(received[static_cast<size_t>(r)], wanted) << "rank " << r;
  }
}

// Block sizes that disagree throw the same error on every rank: no truncation, no hang.
TEST(InProcessComm, AllToAllVRefusesBlockSizesThatDisagree) {
  const int size = 3;
  std::vector<std::string> messages(size);
  EXPECT_THDCP_ERROR(run_in_process(size,
                                    [&](Communicator& comm) {
                                      // Rank 2 sends 8 bytes to rank 1, which expects 4.
                                      std::vector<size_t> send_bytes(size, 4), recv_bytes(size, 4);
                                      if (comm.rank() == 2) send_bytes[1] = 8;
                                      std::vector<unsigned char> out(16), in(16);
                                      try {
                                        comm.all_to_all_v(out.data(), send_bytes.data(), in.data(), recv_bytes.data());
                                      } catch (const Error& e) {
                                        messages[static_cast<size_t>(comm.rank())] = e.what();
                                        throw;
                                      }
                                    }),
                     "all_to_all_v: rank 2 sends 8 bytes to rank 1 but rank 1 expects 4 from it");
  for (int r = 0; r < size; ++r) {
    EXPECT_NE(messages[static_cast<size_t>(r)].find("rank 2 sends 8 bytes to rank 1"), std::string::npos)
        << "rank " << r << ": " << messages[static_cast<size_t>(r)];
  }
}

// reduce_scatter_sum adds in rank order from +0.0f: ((0 + 1e8) + 1) + -1e8 is 0 in fp32
// (1e8 + 1 rounds to 1e8), where another order would give 1.
TEST(InProcessComm, ReduceScatterAddsInRankOrder) {
  std::vector<float> result(3);
  run_in_process(3, [&](Communicator& comm) {
    const float mine = std::vector<float>{1e8f, 1.0f, -1e8f}[static_cast<size_t>(comm.rank())];
    const std::vector<float> blocks(3, mine);
    comm.reduce_scatter_sum(blocks.data(), &result[static_cast<size_t>(comm.rank())], 1);
  });
  EXPECT_EQ(result, (std::vector<float>{0.0f, 0.0f, 0.0f}));
}

// Empty tensors may have null data: collectives of zero bytes (or floats) read and write
// nothing, and pass no null pointer to memcpy (UBSan reports that; the C ABI fuzzer found it
// through a CP backward that gathered K/V of no bytes).
TEST(InProcessComm, CollectivesOfNothingTakeNullPointers) {
  run_in_process(3, [](Communicator& comm) {
    comm.all_gather(nullptr, nullptr, 0);
    comm.all_to_all(nullptr, nullptr, 0);
    comm.all_reduce_max(nullptr, 0);
    comm.reduce_scatter_sum(nullptr, nullptr, 0);
  });
}

TEST(InProcessComm, FailingRankReleasesTheOthers) {
  // Rank 0 throws before its collective; the others must not hang in theirs.
  EXPECT_THDCP_ERROR(run_in_process(3,
                                    [](Communicator& comm) {
                                      if (comm.rank() == 0) THDCP_FAIL("rank 0 gives up");
                                      float x = 1.0f;
                                      comm.all_reduce_max(&x, 1);
                                    }),
                     "rank 0 gives up");
  EXPECT_THDCP_ERROR(run_in_process(3,
                                    [](Communicator& comm) {
                                      if (comm.rank() == 1) THDCP_FAIL("rank 1 gives up");
                                      const std::vector<size_t> bytes(3, 0);
                                      comm.all_to_all_v(nullptr, bytes.data(), nullptr, bytes.data());
                                    }),
                     "rank 1 gives up");
}

// split: ranks of one color form a sub-group ranked by (key, rank); color < 0 gets none.
// Six ranks: colors rank % 2 with keys that reverse the order, and rank 5 left out.
TEST(InProcessComm, SplitMakesSubGroupsRankedByKey) {
  const int size = 6;
  std::vector<int> sub_rank(size, -2), sub_size(size, -2);
  std::vector<std::vector<int>> gathered(size);
  run_in_process(size, [&](Communicator& comm) {
    const int r = comm.rank();
    const int color = r == 5 ? -1 : r % 2;
    std::unique_ptr<Communicator> sub = comm.split(color, /*key=*/-r);
    sub_rank[r] = sub ? sub->rank() : -1;
    if (sub) {
      sub_size[r] = sub->size();
      std::vector<int> all(static_cast<size_t>(sub->size()));
      sub->all_gather(&r, all.data(), sizeof(int));
      gathered[r] = all;
    }
    // The parent still works alongside.
    float x = static_cast<float>(r);
    comm.all_reduce_max(&x, 1);
    EXPECT_EQ(x, 5.0f);
  });
  EXPECT_EQ(sub_rank, (std::vector<int>{2, 1, 1, 0, 0, -1}));
  EXPECT_EQ(sub_size, (std::vector<int>{3, 2, 3, 2, 3, -2}));
  for (int r : {0, 2, 4}) EXPECT_EQ(gathered[r], (std::vector<int>{4, 2, 0}));
  for (int r : {1, 3}) EXPECT_EQ(gathered[r], (std::vector<int>{3, 1}));
}

// A rank that fails releases the ranks waiting in a group split from the one it fails in.
TEST(InProcessComm, FailingRankReleasesSplitGroups) {
  EXPECT_THDCP_ERROR(run_in_process(4,
                                    [](Communicator& comm) {
                                      std::unique_ptr<Communicator> sub = comm.split(comm.rank() / 2, 0);
                                      if (comm.rank() == 0) THDCP_FAIL("rank 0 gives up");
                                      float x = 1.0f;
                                      sub->all_reduce_max(&x, 1);  // rank 1 waits for rank 0 here
                                    }),
                     "rank 0 gives up");
  InProcessGroup group(2);
  std::unique_ptr<Communicator> sub;
  std::thread rank0([&] { sub = group.communicator(0)->split(0, 0); });
  std::unique_ptr<Communicator> other = group.communicator(1)->split(1, 0);
  rank0.join();
  group.abort("the parent was aborted");
  float y = 0.0f;
  EXPECT_THDCP_ERROR(sub->all_reduce_max(&y, 1), "the parent was aborted");
  EXPECT_THDCP_ERROR(other->all_reduce_max(&y, 1), "another rank failed");
}

// An InProcessGroup is run_in_process without the threads: the caller starts them.
TEST(InProcessGroup, CallerThreadsRunTheCollectives) {
  const int size = 3;
  InProcessGroup group(size);
  EXPECT_EQ(group.size(), size);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < size; ++r) comms.push_back(group.communicator(r));
  std::vector<std::vector<int>> gathered(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      Communicator& comm = *comms[static_cast<size_t>(r)];
      const int mine = 7 * comm.rank() + 1;
      std::vector<int> all(size);
      comm.all_gather(&mine, all.data(), sizeof(int));
      gathered[static_cast<size_t>(r)] = all;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(comms[static_cast<size_t>(r)]->rank(), r);
    EXPECT_EQ(comms[static_cast<size_t>(r)]->size(), size);
    EXPECT_EQ(gathered[static_cast<size_t>(r)], (std::vector<int>{1, 8, 15}));
  }
  EXPECT_THDCP_ERROR(group.communicator(size), "rank=3 must be in [0, 3)");
  EXPECT_THDCP_ERROR(InProcessGroup(0), "in-process group size 0 must be >= 1");
}

TEST(InProcessGroup, AbortReleasesAWaitingRankWithTheReason) {
  InProcessGroup group(2);
  std::unique_ptr<Communicator> waiting = group.communicator(1);
  std::string message;
  // Rank 1 enters a collective that rank 0 never joins; the abort must release it.
  std::thread rank1([&] {
    try {
      float x = 1.0f;
      waiting->all_reduce_max(&x, 1);
    } catch (const Error& e) {
      message = e.what();
    }
  });
  group.abort("rank 0 refused its arguments");
  rank1.join();
  EXPECT_NE(message.find("another rank failed"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 0 refused its arguments"), std::string::npos) << message;
  // Every later collective of the group throws too, on any rank.
  std::unique_ptr<Communicator> rank0 = group.communicator(0);
  float y = 0.0f;
  EXPECT_THDCP_ERROR(rank0->all_reduce_max(&y, 1), "another rank failed");
}

// A rank whose peer failed gets a communication error, the failing rank its own.
TEST(ErrorKind, AnAbandonedCollectiveIsACommunicationError) {
  try {
    run_in_process(2, [](Communicator& comm) {
      if (comm.rank() == 1) THDCP_FAIL("rank 1 gives up");
      int mine = 0, all[2] = {};
      try {
        comm.all_gather(&mine, all, sizeof(int));
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kCommunication) << e.what();
        throw;
      }
    });
    ADD_FAILURE() << "run_in_process did not rethrow";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << "the cause is rethrown: " << e.what();
  }
}

}  // namespace
}  // namespace thdcp
