// The GraphBank over NCCL with one rank on one GPU (label gpu): the rank captures its own
// stream (the per-rank capture of DeviceCommunicator, which NCCL uses); packings replayed from
// one graph equal the eager step bit for bit and the CPU reference.
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

TEST_F(GraphNccl, OneRankCapturesItsOwnStreamAndReplaysEqualEager) {
  const Shape s;
  const Capacity capacity = default_capacity(1024, 1);
  const Packings p = make_packings(1, capacity, s, 8);
  run_in_process(1, [&](Communicator& host) {
    std::unique_ptr<DeviceCommunicator> comm = nccl::create(host, 0);
    GraphBank bank(*comm);
    bank.add_capacity(capacity);
    const std::vector<How> how = run_packings(*comm, bank, capacity, p.lengths, p.batches, s);
    EXPECT_EQ(how[0], How::kWarmUp);
    EXPECT_EQ(how[1], How::kCaptured);
    for (size_t i = 2; i < how.size(); ++i) EXPECT_EQ(how[i], How::kReplayed);
  });
}

}  // namespace
}  // namespace thdcp::test
