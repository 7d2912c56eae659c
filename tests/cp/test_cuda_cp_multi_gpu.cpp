// AllGather CP over NCCL, one process driving every visible GPU (a thread per GPU, cp = the
// GPU count): the edge-case table under both layouts, eager against the CPU reference and each rank's captured
// step replayed on a new batch against eager, bit for bit. Skipped with the reason on fewer
// than 2 GPUs.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <string>
#include <tuple>

#include <algorithm>
#include <vector>

#include "support/comm/collective_step.h"
#include "support/cp/cuda_cp_cases.h"
#include "support/cp/cuda_cp_rank.h"
#include "thdcp/comm_device/nccl.h"
#include "thdcp/core/error.h"
#include "thdcp/comm_device/shared_gpu.h"

namespace thdcp {
namespace {

class CudaCpThreadPerGpu : public test::CudaTest,
                           public ::testing::WithParamInterface<std::tuple<CpLayout, int /*edge case*/>> {
 protected:
  void SetUp() override {
    test::CudaTest::SetUp();
    if (IsSkipped()) return;
    if (!nccl::built_with_nccl()) GTEST_SKIP() << "thdcp was built without NCCL";
    THDCP_CHECK_CUDA(cudaGetDeviceCount(&gpus_));
    if (gpus_ < 2) GTEST_SKIP() << "needs 2 GPUs, " << gpus_ << " visible";
  }
  int gpus_ = 0;
};

TEST_P(CudaCpThreadPerGpu, EagerMatchesReferenceAndReplayMatchesEager) {
  const auto [layout, index] = GetParam();
  run_in_process(gpus_, [&](Communicator& host) {
    std::unique_ptr<DeviceCommunicator> comm = nccl::create(host, host.rank());
    // Several threads capture at once: each its own stream, thread-local mode.
    test::check_edge_case_with_own_capture(*comm, index, cudaStreamCaptureModeThreadLocal, layout);
  });
}

// All-to-all CP over NCCL (kv_heads = the GPU count, the case's GQA ratio kept).
class CudaCpAllToAllThreadPerGpu : public CudaCpThreadPerGpu {};

TEST_P(CudaCpAllToAllThreadPerGpu, EagerMatchesReferenceAndReplayMatchesEager) {
  const auto [layout, index] = GetParam();
  run_in_process(gpus_, [&](Communicator& host) {
    std::unique_ptr<DeviceCommunicator> comm = nccl::create(host, host.rank());
    test::check_edge_case_with_own_capture(*comm, index, cudaStreamCaptureModeThreadLocal, layout,
                                           cp::CpComm::kAllToAll);
  });
}

// a2a+ag CP over NCCL: all-to-all groups of 2 (every visible GPU count is even), AllGather
// across the rest (on 2 GPUs one group; kv_heads = 2, the case's GQA ratio kept). The groups
// are NCCL communicators split from the plan's.
class CudaCpA2aAgThreadPerGpu : public CudaCpThreadPerGpu {};

TEST_P(CudaCpA2aAgThreadPerGpu, EagerMatchesReferenceAndReplayMatchesEager) {
  const auto [layout, index] = GetParam();
  if (gpus_ % 2 != 0) GTEST_SKIP() << "a2a+ag in groups of 2 needs an even GPU count, " << gpus_ << " visible";
  run_in_process(gpus_, [&](Communicator& host) {
    std::unique_ptr<DeviceCommunicator> comm = nccl::create(host, host.rank());
    test::check_edge_case_with_own_capture(*comm, index, cudaStreamCaptureModeThreadLocal, layout,
                                           cp::CpComm::kA2aAg, /*a2a_size=*/2);
  });
}

// The same GPUs as one peer-copy group (a thread per GPU of one process, SharedGpuOptions::
// devices): all_gather and all_to_all are peer copies on the copy engines, the reductions
// kernels reading the peers' buffers. Every collective's exact values; the edge-case table
// under both layouts, eager against the reference and one graph over every GPU replayed
// against eager, bit for bit. Skipped with the reason on fewer than 2 GPUs.
class PeerCopyGroup : public test::MultiGpuTest {
 protected:
  void SetUp() override {
    test::MultiGpuTest::SetUp();
    if (IsSkipped()) return;
    for (int d = 0; d < gpus_; ++d) options_.devices.push_back(d);
  }
  SharedGpuOptions options_;
};

TEST_F(PeerCopyGroup, EveryCollectiveGivesExactValues) {
  SharedGpuOptions options = options_;
  for (const test::CollectiveSizes& sizes : test::collective_sizes()) {
    options.reduce_scratch_bytes = std::max(options.reduce_scratch_bytes, sizes.count * sizeof(float));
  }
  run_shared_gpu(
      gpus_,
      [&](DeviceCommunicator& comm) {
        EXPECT_STREQ(comm.kind(), "peer-copy");
        EXPECT_EQ(comm.device(), comm.rank());
        test::Stream stream;
        test::expect_exact_collectives(comm, stream.get());
        test::expect_reduce_scatter16(comm, stream.get(), /*rank_order=*/true);
      },
      options);
}

// Faults under the peer-copy data path: a rank that fails between the forward and the
// backward releases every other rank with thdcp::Error naming it, and one that stalls past
// the group's timeout (then fails) makes the others raise within that timeout: no hang.
TEST_F(PeerCopyGroup, ARankFailingOrStallingMidStepEndsEveryRankWithAnError) {
  for (const bool stall : {false, true}) {
    SCOPED_TRACE(stall ? "rank 1 stalls" : "rank 1 fails");
    SharedGpuOptions options = options_;
    options.timeout_seconds = 3;
    const test::EdgeCase& c = test::edge_cases()[0];
    const cp::Problem problem = test::problem_of(c, gpus_);
    const test::Batch b = test::make_case_batch(c, gpus_, problem.capacity, 77, false);
    std::vector<std::string> messages(static_cast<size_t>(gpus_));
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THROW(run_shared_gpu(
                     gpus_,
                     [&](DeviceCommunicator& comm) {
                       test::CudaCpRank state(comm, problem);
                       try {
                         state.load(b);
                         state.plan().forward(state.layout(), state.forward_tensors(), state.stream());
                         if (comm.rank() == 1) {
                           if (stall) std::this_thread::sleep_for(std::chrono::seconds(8));
                           throw Error("rank 1 lost its gradients");
                         }
                         state.plan().backward(state.layout(), state.backward_tensors(), state.stream());
                         comm.synchronize(state.stream(), 30);
                       } catch (const Error& e) {
                         messages[static_cast<size_t>(comm.rank())] = e.what();
                         throw;
                       }
                     },
                     options),
                 Error);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 30.0);
    for (int r = 0; r < gpus_; ++r) {
      if (r == 1) continue;
      const std::string& m = messages[static_cast<size_t>(r)];
      EXPECT_NE(m.find(stall ? " waited 3 s in " : "rank 1 failed (rank 1 lost its gradients)"), std::string::npos)
          << "rank " << r << ": " << m;
    }
  }
}

class CudaCpPeerCopy : public PeerCopyGroup, public ::testing::WithParamInterface<std::tuple<CpLayout, int>> {};

TEST_P(CudaCpPeerCopy, EagerMatchesReferenceAndOneGraphOverEveryGpuReplaysEager) {
  const auto [layout, index] = GetParam();
  test::expect_group_case(layout, cp::CpComm::kAllGather, gpus_, index, cp::KvGather::kAuto, 1, options_);
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<CpLayout, int>>& info) {
  return test::layout_prefix(std::get<0>(info.param)) +
         test::edge_cases()[static_cast<size_t>(std::get<1>(info.param))].name;
}

INSTANTIATE_TEST_SUITE_P(EdgeCases, CudaCpThreadPerGpu,
                         ::testing::Combine(::testing::Values(CpLayout::kDualChunk, CpLayout::kContiguous),
                                            ::testing::Range(0, 6)),
                         case_name);
INSTANTIATE_TEST_SUITE_P(EdgeCases, CudaCpAllToAllThreadPerGpu,
                         ::testing::Combine(::testing::Values(CpLayout::kDualChunk, CpLayout::kContiguous),
                                            ::testing::Range(0, 6)),
                         case_name);
INSTANTIATE_TEST_SUITE_P(EdgeCases, CudaCpPeerCopy,
                         ::testing::Combine(::testing::Values(CpLayout::kDualChunk, CpLayout::kContiguous),
                                            ::testing::Range(0, 6)),
                         case_name);
INSTANTIATE_TEST_SUITE_P(EdgeCases, CudaCpA2aAgThreadPerGpu,
                         ::testing::Combine(::testing::Values(CpLayout::kDualChunk, CpLayout::kContiguous),
                                            ::testing::Range(0, 6)),
                         case_name);

}  // namespace
}  // namespace thdcp
