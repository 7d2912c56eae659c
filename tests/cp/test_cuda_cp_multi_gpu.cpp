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

// NCCL's copy-engine path (nccl::Options::copy_engine: the zero-CTA policy, buffers in a
// symmetric window over nccl::window_memory): an all_gather and an all_to_all into a window
// give exact values; CP over it (every plan's workspace a window) on the edge-case table,
// all_gather and all_to_all under both layouts, eager against the reference and each rank's
// captured step against eager, bit for bit.
std::unique_ptr<DeviceCommunicator> copy_engine_comm(Communicator& host) {
  nccl::Options options;
  options.copy_engine = true;
  return nccl::create(host, host.rank(), options);
}

class NcclCopyEngine : public CudaCpThreadPerGpu {};

class NcclCopyEngineCollectives : public test::MultiGpuTest {
 protected:
  void SetUp() override {
    test::MultiGpuTest::SetUp();
    if (IsSkipped()) return;
    if (!nccl::built_with_nccl()) GTEST_SKIP() << "thdcp was built without NCCL";
  }
};

TEST_P(NcclCopyEngine, CpOverWindowsMatchesReferenceAndReplayMatchesEager) {
  const auto [layout, index] = GetParam();
  for (const cp::CpComm kind : {cp::CpComm::kAllGather, cp::CpComm::kAllToAll}) {
    SCOPED_TRACE(cp::cp_comm_name(kind));
    run_in_process(gpus_, [&](Communicator& host) {
      std::unique_ptr<DeviceCommunicator> comm = copy_engine_comm(host);
      EXPECT_TRUE(comm->wants_windows());
      test::check_edge_case_with_own_capture(*comm, index, cudaStreamCaptureModeThreadLocal, layout, kind);
    });
  }
}

// An all_gather and an all_to_all into one window, on `stream`, against the values each
// rank sent. nullptr is the legacy default stream (PyTorch's default stream), on which NCCL
// before 2.29.7 cannot start a copy-engine collective: the communicator runs them on a
// stream of its own, ordered with the caller's.
void check_window_collectives(int n, bool legacy_stream) {
  const size_t block = size_t{1} << 20;  // bytes per rank
  run_in_process(n, [&](Communicator& host) {
    std::unique_ptr<DeviceCommunicator> comm = copy_engine_comm(host);
    const int rank = comm->rank();
    // Four regions of n blocks: the all_gather's send (its first block) and receive, the
    // all_to_all's send and receive; the same offsets on every rank.
    const size_t region = static_cast<size_t>(n) * block;
    std::shared_ptr<void> memory = nccl::window_memory(4 * region);
    std::unique_ptr<DeviceCommunicator::Window> window = comm->register_window(memory.get(), 4 * region);
    ASSERT_NE(window, nullptr);
    auto* base = static_cast<unsigned char*>(memory.get());
    // Byte i of block j from rank r: (r * 31 + j * 7 + i) mod 251.
    const auto value = [](int r, int j, size_t i) { return static_cast<unsigned char>((r * 31 + j * 7 + i) % 251); };
    std::vector<unsigned char> send(region);
    for (int j = 0; j < n; ++j) {
      for (size_t i = 0; i < block; ++i) send[static_cast<size_t>(j) * block + i] = value(rank, j, i);
    }
    test::Stream own;
    const cudaStream_t stream = legacy_stream ? nullptr : own.get();
    THDCP_CHECK_CUDA(cudaMemcpy(base, send.data(), block, cudaMemcpyHostToDevice));
    THDCP_CHECK_CUDA(cudaMemcpy(base + 2 * region, send.data(), region, cudaMemcpyHostToDevice));
    comm->all_gather(base, base + region, block, stream);
    comm->all_to_all(base + 2 * region, base + 3 * region, block, stream);
    comm->synchronize(stream, 60);
    std::vector<unsigned char> gathered(region), exchanged(region);
    THDCP_CHECK_CUDA(cudaMemcpy(gathered.data(), base + region, region, cudaMemcpyDeviceToHost));
    THDCP_CHECK_CUDA(cudaMemcpy(exchanged.data(), base + 3 * region, region, cudaMemcpyDeviceToHost));
    size_t wrong_gather = 0, wrong_exchange = 0;
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < block; ++i) {
        wrong_gather += gathered[static_cast<size_t>(r) * block + i] != value(r, 0, i);  // rank r's block 0
        wrong_exchange += exchanged[static_cast<size_t>(r) * block + i] != value(r, rank, i);  // rank r's block for me
      }
    }
    EXPECT_EQ(wrong_gather, 0u) << "rank " << rank;
    EXPECT_EQ(wrong_exchange, 0u) << "rank " << rank;
    window.reset();  // before the memory and the communicator
  });
}

TEST_F(NcclCopyEngineCollectives, AllGatherAndAllToAllIntoAWindowAreExact) {
  check_window_collectives(gpus_, /*legacy_stream=*/false);
}

TEST_F(NcclCopyEngineCollectives, OnTheLegacyDefaultStreamTheyAreExact) {
  check_window_collectives(gpus_, /*legacy_stream=*/true);
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
INSTANTIATE_TEST_SUITE_P(EdgeCases, NcclCopyEngine,
                         ::testing::Combine(::testing::Values(CpLayout::kDualChunk, CpLayout::kContiguous),
                                            ::testing::Range(0, 6)),
                         case_name);
INSTANTIATE_TEST_SUITE_P(EdgeCases, CudaCpA2aAgThreadPerGpu,
                         ::testing::Combine(::testing::Values(CpLayout::kDualChunk, CpLayout::kContiguous),
                                            ::testing::Range(0, 6)),
                         case_name);

}  // namespace
}  // namespace thdcp
