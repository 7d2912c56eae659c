// The GraphBank on one GPU, ranks sharing it (DESIGN.md section 7): random packings replayed
// through one captured graph equal eager bit for bit and the CPU reference; a batch over a
// smaller max_seqs falls back, is counted and is correct; a batch over the token capacity
// takes the next bucket or gets a clear error; dynamic CP alternating 1/2/4 with replay
// equals eager; a host sync inside the captured work makes the capture fail with a clear
// message; a bank of the contiguous layout replays like the dual-chunk one.
#include <gtest/gtest.h>

#include <array>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "support/graph/bank_rank.h"
#include "support/expect_error.h"
#include "thdcp/comm_device/shared_gpu.h"
#include "thdcp/graph/cp_groups.h"
#include "thdcp/graph/graph_bank.h"

namespace thdcp::test {
namespace {

// (cp, layout, communication): AllGather banks of the dual-chunk layout at cp 1 and 2 and of
// the contiguous layout (BankOptions::cp_layout) at cp 3, whose capacity is a multiple of cp
// only; an all-to-all bank at cp 2 and an a2a+ag bank (groups of 2) at cp 4.
struct BankParam {
  int cp;
  CpLayout layout;
  CpMode mode;
};

class GraphBankTest : public CudaTest, public ::testing::WithParamInterface<BankParam> {};

TEST_P(GraphBankTest, RandomPackingsReplayedFromOneGraphEqualEagerAndTheReference) {
  const auto [cp, layout, mode] = GetParam();
  const Shape s;
  const Capacity capacity = layout == CpLayout::kDualChunk ? default_capacity(1024, cp)
                                                           : default_capacity(1023 / cp * cp, cp, layout);
  const std::vector<std::vector<int64_t>> lengths = packings(cp, capacity, 11 + static_cast<uint64_t>(cp), layout);
  std::vector<Batch> batches;
  for (size_t i = 0; i < lengths.size(); ++i) batches.push_back(batch_of(lengths[i], cp, capacity, s, 100 + i, layout));
  const int n = static_cast<int>(batches.size());
  std::vector<How> how;
  graph::KeyCounters counters;

  // Every packing through the bank, each against the eager step and the reference.
  run_shared_gpu(cp, [&](DeviceCommunicator& comm) {
    graph::BankOptions options;
    options.cp_layout = layout;
    GraphBank bank(comm, options);
    bank.add_capacity(capacity);
    const std::vector<How> ran = run_packings(comm, bank, capacity, lengths, batches, s, mode);
    if (comm.rank() == 0) {
      how = ran;
      counters = bank.counters(capacity);
    }
  });

  ASSERT_EQ(how.size(), lengths.size());
  EXPECT_EQ(how[0], How::kWarmUp);
  EXPECT_EQ(how[1], How::kCaptured);
  for (int i = 2; i < n; ++i) EXPECT_EQ(how[i], How::kReplayed) << "packing " << i;
  EXPECT_EQ(counters.warmups, 1);
  EXPECT_EQ(counters.captures, 1);
  EXPECT_EQ(counters.replays, n - 2);
  EXPECT_EQ(counters.fallbacks, 0);
}

std::string bank_name(const ::testing::TestParamInfo<BankParam>& p) {
  const char* comm = p.param.mode.comm == cp::CpComm::kAllToAll ? "all_to_all_"
                     : p.param.mode.comm == cp::CpComm::kA2aAg  ? "a2a_ag_"
                                                                : "";
  return test::layout_prefix(p.param.layout) + comm + "cp" + std::to_string(p.param.cp);
}

INSTANTIATE_TEST_SUITE_P(Cp, GraphBankTest,
                         ::testing::Values(BankParam{1, CpLayout::kDualChunk, {}}, BankParam{2, CpLayout::kDualChunk, {}},
                                           BankParam{3, CpLayout::kContiguous, {}},
                                           BankParam{2, CpLayout::kDualChunk, {cp::CpComm::kAllToAll, 1}},
                                           BankParam{4, CpLayout::kContiguous, {cp::CpComm::kA2aAg, 2}}),
                         bank_name);

// Buckets {9 seqs, 512 rows} and {9, 1024} at cp = 2: a batch of 20 short documents fits
// the 512-row bucket by rows but not by documents, so it runs eagerly on the zero-fallback
// capacity and is counted; a 700-row batch takes the next bucket; a 2000-row batch is an
// error that names the largest capacity, and the bank works on afterwards.
class GraphBankFallback : public CudaTest {};

TEST_F(GraphBankFallback, OverMaxSeqsFallsBackCountedAndCorrectOverTokensTakesTheNextBucketOrErrs) {
  const int cp = 2;
  const Shape s;
  const Capacity small{9, 512}, large{9, 1024};
  const std::vector<std::vector<int64_t>> lengths = {
      {100, 50, 7, 1, 90},             // small: warm-up
      std::vector<int64_t>(20, 10),    // 20 documents, 240 rows: fallback of small
      {300, 250, 150},                 // 704 rows: large, warm-up
      {100, 3, 60},                    // small: captured
      std::vector<int64_t>(12, 30),    // 12 documents, 384 rows: fallback of small again
      {200, 9, 17, 40},                // small: replayed
  };
  const std::vector<How> expected = {How::kWarmUp, How::kFallback, How::kWarmUp, How::kCaptured, How::kFallback,
                                     How::kReplayed};
  const std::vector<Capacity> ran_at = {small, default_capacity(512, cp), large, small, default_capacity(512, cp),
                                        small};
  std::vector<Batch> batches;
  for (size_t i = 0; i < lengths.size(); ++i) batches.push_back(batch_of(lengths[i], cp, ran_at[i], s, 300 + i));
  const int n = static_cast<int>(batches.size());
  std::vector<std::vector<Outputs>> out(n, std::vector<Outputs>(cp));
  std::vector<GraphBank::Outcome> outcome(n);
  graph::KeyCounters small_counters, large_counters;
  std::vector<Capacity> run_capacities;
  std::string too_large;

  run_shared_gpu(cp, [&](DeviceCommunicator& comm) {
    GraphBank bank(comm);
    bank.add_capacity(large);
    bank.add_capacity(small);
    BankRank rank(comm, bank, large.max_tokens, s);
    rank.warm_up();
    for (int i = 0; i < n; ++i) {
      GraphBank::Outcome o;
      out[i][comm.rank()] = rank.banked(bank, batches[i], lengths[i], &o);
      if (comm.rank() == 0) outcome[i] = o;
      if (i == 2) {
        try {
          bank.run({2000}, rank.work(), rank.stream());
        } catch (const Error& e) {
          if (comm.rank() == 0) too_large = e.what();
        }
      }
    }
    if (comm.rank() == 0) {
      small_counters = bank.counters(small);
      large_counters = bank.counters(large);
      run_capacities = bank.run_capacities();
    }
  });
  // Every capacity a batch could run at, each bucket then its zero-fallback one, in add order.
  const std::vector<Capacity> every = {large, default_capacity(1024, cp), small, default_capacity(512, cp)};
  EXPECT_TRUE(run_capacities == every);

  for (int i = 0; i < n; ++i) {
    SCOPED_TRACE("batch " + std::to_string(i));
    EXPECT_EQ(outcome[i].how, expected[i]) << GraphBank::how_name(outcome[i].how);
    EXPECT_TRUE(outcome[i].capacity == ran_at[i]) << capacity_key_name(cp, outcome[i].capacity);
    for (int r = 0; r < cp; ++r) expect_matches_reference(out[i][r], batches[i], s.mask, cp, r);
  }
  EXPECT_TRUE(outcome[1].bucket == small);
  EXPECT_EQ(small_counters.fallbacks, 2);
  EXPECT_EQ(small_counters.warmups, 1);
  EXPECT_EQ(small_counters.captures, 1);
  EXPECT_EQ(small_counters.replays, 1);
  EXPECT_EQ(large_counters.warmups, 1);
  EXPECT_EQ(large_counters.fallbacks, 0);
  EXPECT_NE(too_large.find("2000 rows at cp=2"), std::string::npos) << too_large;
  EXPECT_NE(too_large.find("max_tokens=1024"), std::string::npos) << too_large;
  EXPECT_NE(too_large.find("add a larger capacity"), std::string::npos) << too_large;
}

// Dynamic CP on ranks sharing the GPU: steps alternate the CP sizes (three rounds: warm-up,
// capture, replay of each size); each group of c ranks takes its own micro-batch; every step
// of every rank in a group equals the eager step and the reference. World 4 with sizes 1, 2,
// 4; world 3 with sizes 1, 2, 3, where the third rank has no group of 2 and sits those steps
// out.
class GraphDynamicCp : public CudaTest {
 protected:
  // max_tokens: a multiple of 2c for every size c.
  void expect_alternating(int world, const std::vector<int>& sizes, int64_t max_tokens) {
    const Shape s;
    std::vector<int> order;
    for (int round = 0; round < 3; ++round) order.insert(order.end(), sizes.begin(), sizes.end());
    const size_t n = sizes.size();
    // batches[step][group]
    std::vector<std::vector<std::vector<int64_t>>> lengths(order.size());
    std::vector<std::vector<Batch>> batches(order.size());
    Rng rng(5);
    for (size_t step = 0; step < order.size(); ++step) {
      const int c = order[step];
      for (int g = 0; g < world / c; ++g) {
        std::vector<int64_t> l;
        while (true) {
          const int64_t len = rng.uniform_int(0, 200);
          if (padded_rows(l, c) + cp_padded_length(len, c) > max_tokens) break;
          l.push_back(len);
        }
        if (l.empty()) l.push_back(2);
        batches[step].push_back(batch_of(l, c, default_capacity(max_tokens, c), s, 1000 * step + g));
        lengths[step].push_back(l);
      }
    }
    std::vector<std::vector<Outputs>> banked(order.size(), std::vector<Outputs>(world)), eager = banked;
    std::vector<std::vector<How>> how(order.size(), std::vector<How>(world));
    std::vector<std::vector<bool>> ran(order.size(), std::vector<bool>(static_cast<size_t>(world), false));

    // Per world rank: the arena's bytes and sum of reservations, and what they should be (the
    // largest and the sum of the workspaces of the sizes the rank has a group of).
    std::vector<std::array<size_t, 4>> arena(static_cast<size_t>(world));
    run_shared_gpu(world, [&](DeviceCommunicator& comm) {
      DynamicCpRank rank(comm, sizes, max_tokens, s);
      for (size_t step = 0; step < order.size(); ++step) {
        const int c = order[step];
        if (!rank.has_group(c)) continue;
        const int g = rank.group_index(c);
        GraphBank::Outcome o;
        banked[step][comm.rank()] = rank.banked(c, batches[step][g], lengths[step][g], &o);
        how[step][comm.rank()] = o.how;
        eager[step][comm.rank()] = rank.eager(c, batches[step][g], lengths[step][g]);
        ran[step][static_cast<size_t>(comm.rank())] = true;
      }
      std::array<size_t, 4>& a = arena[static_cast<size_t>(comm.rank())];
      a[0] = rank.arena().bytes();
      a[1] = rank.arena().separate_bytes();
      for (int c : sizes) {
        if (!rank.has_group(c)) continue;
        a[2] = std::max(a[2], rank.workspace_bytes(c));
        a[3] += rank.workspace_bytes(c);
      }
    });
    for (int w = 0; w < world; ++w) {
      const std::array<size_t, 4>& a = arena[static_cast<size_t>(w)];
      SCOPED_TRACE("world rank " + std::to_string(w));
      EXPECT_EQ(a[0], a[2]);  // one workspace, the largest size's
      EXPECT_EQ(a[1], a[3]);  // what a workspace per size would take
      EXPECT_LT(a[0], a[1]);  // every rank has groups of two sizes at least
    }

    for (size_t step = 0; step < order.size(); ++step) {
      const int c = order[step];
      const How expected = step < n ? How::kWarmUp : step < 2 * n ? How::kCaptured : How::kReplayed;
      for (int w = 0; w < world; ++w) {
        SCOPED_TRACE("world " + std::to_string(world) + " step " + std::to_string(step) + " cp " + std::to_string(c) +
                     " world rank " + std::to_string(w));
        const bool member = w < world / c * c;
        EXPECT_EQ(ran[step][static_cast<size_t>(w)], member);
        if (!member) continue;
        EXPECT_EQ(how[step][w], expected);
        EXPECT_TRUE(identical(banked[step][w], eager[step][w]));
        expect_matches_reference(banked[step][w], batches[step][w / c], s.mask, c, w % c);
      }
    }
  }
};

TEST_F(GraphDynamicCp, AlternatingOneTwoFourWithReplayEqualsEager) { expect_alternating(4, {1, 2, 4}, 512); }

TEST_F(GraphDynamicCp, AlternatingOneTwoThreeAnIdleRankSitsTheTwosOut) { expect_alternating(3, {1, 2, 3}, 516); }

// A host synchronisation inside the captured work makes the capture fail with a message
// that says so, whether the work ignores CUDA's error (the capture is invalidated) or
// raises it; the stream stays usable.
class GraphCaptureFailure : public CudaTest {};

TEST_F(GraphCaptureFailure, AHostSyncInTheCapturedWorkFailsTheCaptureWithAClearMessage) {
  for (bool checked : {false, true}) {
    SCOPED_TRACE(checked ? "the work raises CUDA's error" : "the work ignores CUDA's error");
    std::string message;
    bool stream_usable = false;
    run_shared_gpu(1, [&](DeviceCommunicator& comm) {
      GraphBank bank(comm);
      const Capacity capacity = default_capacity(64, 1);
      bank.add_capacity(capacity);
      void* scratch = bank.buffer(capacity, "scratch", 4096);
      cudaStream_t stream = nullptr;
      THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      const graph::Work work = [&](const StaticBatch&, cudaStream_t s) {
        THDCP_CHECK_CUDA(cudaMemsetAsync(scratch, 1, 4096, s));
        const cudaError_t synced = cudaStreamSynchronize(s);  // the deliberate host sync
        if (checked) THDCP_CHECK_CUDA(synced);
        cudaMemsetAsync(scratch, 2, 4096, s);
      };
      EXPECT_EQ(bank.run({10}, work, stream).how, How::kWarmUp);  // eager: the sync is allowed
      try {
        bank.run({10}, work, stream);
      } catch (const Error& e) {
        message = e.what();
      }
      stream_usable = cudaMemsetAsync(scratch, 3, 4096, stream) == cudaSuccess &&
                      cudaStreamSynchronize(stream) == cudaSuccess;
      EXPECT_EQ(bank.counters(capacity).captures, 0);
      cudaStreamDestroy(stream);
    });
    EXPECT_NE(message.find("capturing the graph of cp=1 max_seqs=33 max_tokens=64 failed"), std::string::npos)
        << message;
    EXPECT_NE(message.find("no host synchronisation"), std::string::npos) << message;
    if (checked) {
      EXPECT_NE(message.find("cudaErrorStreamCaptureUnsupported"), std::string::npos) << message;
    }
    EXPECT_TRUE(stream_usable);
  }
}

}  // namespace
}  // namespace thdcp::test
