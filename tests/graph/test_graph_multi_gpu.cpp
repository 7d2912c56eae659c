// The GraphBank over NCCL across every visible GPU, a thread per GPU (label multi_gpu;
// skipped with the reason on fewer than 2 GPUs): cp = the GPUs, replay equals eager and the
// CPU reference; dynamic CP alternating 1 and all GPUs equals eager.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "support/graph/bank_rank.h"
#include "thdcp/comm/communicator.h"
#include "thdcp/comm_device/nccl.h"
#include "thdcp/graph/cp_groups.h"

namespace thdcp::test {
namespace {

using GraphNccl = GraphNcclTest;

class GraphNcclMultiGpu : public GraphNccl {
 protected:
  void SetUp() override {
    GraphNccl::SetUp();
    if (IsSkipped()) return;
    if (gpus_ < 2) GTEST_SKIP() << "needs 2 GPUs, " << gpus_ << " visible";
  }
};

TEST_F(GraphNcclMultiGpu, ThreadPerGpuCapturesReplayEqualEagerAndReference) {
  const Shape s;
  const Capacity capacity = default_capacity(2048, gpus_);
  const Packings p = make_packings(gpus_, capacity, s, 10);
  run_in_process(gpus_, [&](Communicator& host) {
    std::unique_ptr<DeviceCommunicator> comm = nccl::create(host, host.rank());
    graph::BankOptions options;
    options.capture_mode = cudaStreamCaptureModeThreadLocal;  // a thread per GPU captures at once
    GraphBank bank(*comm, options);
    bank.add_capacity(capacity);
    const std::vector<How> how = run_packings(*comm, bank, capacity, p.lengths, p.batches, s);
    EXPECT_EQ(how[1], How::kCaptured);
    EXPECT_EQ(how.back(), How::kReplayed);
  });
}

// Dynamic CP over NCCL: the world of every GPU split into groups of 1 and of all; the sizes
// alternate, each group runs its own micro-batch, every step equals eager.
TEST_F(GraphNcclMultiGpu, DynamicCpAlternatingOneAndAllEqualsEager) {
  const Shape s;
  const int world = gpus_;
  const int64_t max_tokens = 512;
  const std::vector<int> order = {1, world, 1, world, 1, world};
  std::vector<std::vector<std::vector<int64_t>>> lengths(order.size());
  std::vector<std::vector<Batch>> batches(order.size());
  for (size_t step = 0; step < order.size(); ++step) {
    const int c = order[step];
    const Capacity capacity = default_capacity(max_tokens, c);
    const std::vector<std::vector<int64_t>> all = packings(c, capacity, 77 + step);
    for (int g = 0; g < world / c; ++g) {
      lengths[step].push_back(all[static_cast<size_t>(4 + g) % all.size()]);
      batches[step].push_back(batch_of(lengths[step].back(), c, capacity, s, 900 + 10 * step + g));
    }
  }
  run_in_process(world, [&](Communicator& host) {
    std::unique_ptr<DeviceCommunicator> comm = nccl::create(host, host.rank());
    DynamicCpRank rank(*comm, {1, world}, max_tokens, s);
    for (size_t step = 0; step < order.size(); ++step) {
      const int c = order[step];
      const int g = rank.group_index(c);
      SCOPED_TRACE("step " + std::to_string(step) + " cp " + std::to_string(c) + " rank " + std::to_string(comm->rank()));
      const Batch& batch = batches[step][static_cast<size_t>(g)];
      const std::vector<int64_t>& documents = lengths[step][static_cast<size_t>(g)];
      GraphBank::Outcome o;
      const Outputs banked = rank.banked(c, batch, documents, &o);
      EXPECT_EQ(o.how, step < 2 ? How::kWarmUp : step < 4 ? How::kCaptured : How::kReplayed);
      EXPECT_TRUE(identical(banked, rank.eager(c, batch, documents)));
      expect_matches_reference(banked, batch, s.mask, c, rank.group_rank(c));
    }
  });
}

}  // namespace
}  // namespace thdcp::test
