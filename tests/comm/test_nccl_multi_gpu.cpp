// The NCCL communicator across GPUs (label multi_gpu): one process, one thread per visible
// GPU (rank r on device r), bootstrapped by the in-process group. With fewer than 2 GPUs
// every case reports SKIPPED with the reason.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "support/comm/collective_step.h"
#include "support/cuda/cuda_test.h"
#include "support/expect_error.h"
#include "thdcp/comm/communicator.h"
#include "thdcp/comm_device/nccl.h"

namespace thdcp {
namespace {

class NcclMultiGpu : public test::MultiGpuTest {
 protected:
  // Runs body on one thread per GPU, each with its rank's warmed-up communicator and a
  // stream of its device.
  void on_every_gpu(const std::function<void(DeviceCommunicator&, cudaStream_t)>& body,
                    double timeout_seconds = test::kTestTimeoutSeconds) {
    nccl::Options options;
    options.timeout_seconds = timeout_seconds;
    run_in_process(gpus_, [&](Communicator& host) {
      std::unique_ptr<DeviceCommunicator> comm = nccl::create(host, host.rank(), options);
      EXPECT_EQ(comm->rank(), host.rank());
      EXPECT_EQ(comm->size(), gpus_);
      EXPECT_EQ(comm->device(), host.rank());
      test::Stream stream;
      comm->warm_up(stream.get());
      body(*comm, stream.get());
    });
  }
};

TEST_F(NcclMultiGpu, CollectivesGiveExactValues) {
  on_every_gpu([](DeviceCommunicator& comm, cudaStream_t stream) { test::expect_exact_collectives(comm, stream); });
}

TEST_F(NcclMultiGpu, CapturedStepReplaysTheEagerValues) {
  // Thread-local capture: the other ranks' threads capture at the same time.
  on_every_gpu([](DeviceCommunicator& comm, cudaStream_t stream) {
    test::expect_captured_step_replays(comm, stream, cudaStreamCaptureModeThreadLocal);
  });
}

TEST_F(NcclMultiGpu, SplitByParityRunsACollectiveInEachHalf) {
  const int ranks = gpus_;
  on_every_gpu([ranks](DeviceCommunicator& comm, cudaStream_t stream) {
    const int color = comm.rank() % 2;
    // Keys in reverse rank order, so that the split must order by key, not by rank.
    std::unique_ptr<DeviceCommunicator> half = comm.split(color, ranks - comm.rank());
    ASSERT_NE(half, nullptr);
    int expected_size = 0, expected_rank = 0;
    for (int r = color; r < ranks; r += 2) {
      ++expected_size;
      if (r > comm.rank()) ++expected_rank;
    }
    EXPECT_EQ(half->size(), expected_size);
    EXPECT_EQ(half->rank(), expected_rank);
    EXPECT_EQ(half->device(), comm.device());
    half->warm_up(stream);
    test::expect_exact_collectives(*half, stream);
    test::expect_exact_collectives(comm, stream);  // the parent still works
  });
}

TEST_F(NcclMultiGpu, CollectiveWithAnotherDeviceCurrentThrowsAndEnqueuesNothing) {
  const int ranks = gpus_;
  on_every_gpu([ranks](DeviceCommunicator& comm, cudaStream_t stream) {
    cuda::DeviceBuffer send(64 * sizeof(float)), recv(64 * sizeof(float) * static_cast<size_t>(ranks));
    const int other = (comm.device() + 1) % ranks;
    THDCP_CHECK_CUDA(cudaSetDevice(other));
    const std::string expected = "called with device " + std::to_string(other) +
                                 " current, but the communicator's device is " + std::to_string(comm.device());
    EXPECT_THDCP_ERROR(comm.all_gather(send.data(), recv.data(), send.bytes(), stream), expected);
    EXPECT_THDCP_ERROR(comm.reduce_scatter_sum(recv.as<float>(), send.as<float>(), 64, stream), expected);
    EXPECT_THDCP_ERROR(comm.all_reduce_max(send.as<float>(), 64, stream), expected);
    THDCP_CHECK_CUDA(cudaSetDevice(comm.device()));
    // Nothing reached NCCL on any rank, so the group is still in step.
    test::expect_exact_collectives(comm, stream);
  });
}

// A peer that never calls the collective: rank 0 must not hang. Its synchronize() times out
// after 5 s, aborts the communicator and throws; later calls throw too.
TEST_F(NcclMultiGpu, APeerThatSkipsACollectiveMakesSynchronizeThrow) {
  double waited_seconds = -1;
  on_every_gpu(
      [&](DeviceCommunicator& comm, cudaStream_t stream) {
        if (comm.rank() != 0) return;  // the peers leave without calling all_gather
        cuda::DeviceBuffer send(256), recv(256 * static_cast<size_t>(comm.size()));
        comm.all_gather(send.data(), recv.data(), 256, stream);
        const auto start = std::chrono::steady_clock::now();
        test::expect_error([&] { comm.synchronize(stream, 5.0); },
                           {"nccl rank 0 (device 0): timed out after 5 s waiting for the stream"});
        waited_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        EXPECT_THDCP_ERROR(comm.all_gather(send.data(), recv.data(), 256, stream), "an earlier failure aborted");
      },
      /*timeout_seconds=*/30);
  EXPECT_GE(waited_seconds, 4.9);
  EXPECT_LT(waited_seconds, 10.0) << "synchronize(stream, 5 s) took " << waited_seconds << " s to throw";
}

}  // namespace
}  // namespace thdcp
