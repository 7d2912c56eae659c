// The NCCL communicator on one GPU (label gpu). A one-rank group still runs NCCL's kernels,
// so values, graph capture and split are checked for real; two ranks on one device check
// that a failing init throws. Without a GPU every case reports SKIPPED with the reason.
#include <gtest/gtest.h>
#include <nccl.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "support/comm/collective_step.h"
#include "support/cuda/cuda_test.h"
#include "support/expect_error.h"
#include "thdcp/comm/communicator.h"
#include "thdcp/comm_device/nccl.h"

namespace thdcp {
namespace {

class NcclSingleGpu : public test::CudaTest {};

nccl::Options test_options() {
  nccl::Options options;
  options.timeout_seconds = test::kTestTimeoutSeconds;
  return options;
}

// Runs body on a one-rank NCCL communicator on device 0 (warmed up), in the rank's thread.
void with_one_rank(const std::function<void(DeviceCommunicator&, cudaStream_t)>& body) {
  run_in_process(1, [&](Communicator& host) {
    std::unique_ptr<DeviceCommunicator> comm = nccl::create(host, 0, test_options());
    test::Stream stream;
    comm->warm_up(stream.get());
    body(*comm, stream.get());
  });
}

TEST_F(NcclSingleGpu, CreateGivesTheBootstrapRankAndTheDevice) {
  EXPECT_TRUE(nccl::built_with_nccl());
  with_one_rank([](DeviceCommunicator& comm, cudaStream_t) {
    EXPECT_EQ(comm.rank(), 0);
    EXPECT_EQ(comm.size(), 1);
    EXPECT_EQ(comm.device(), 0);
    EXPECT_STREQ(comm.kind(), "nccl");
    int current = -1;
    THDCP_CHECK_CUDA(cudaGetDevice(&current));
    EXPECT_EQ(current, 0) << "create() makes the device current on the calling thread";
  });
}

TEST_F(NcclSingleGpu, CollectivesGiveExactValues) {
  with_one_rank([](DeviceCommunicator& comm, cudaStream_t stream) { test::expect_exact_collectives(comm, stream); });
}

// The 16-bit reduce-scatter (bf16, fp16): one rank's sum is its own value, bit for bit.
TEST_F(NcclSingleGpu, SixteenBitReduceScatterGivesTheRoundedSums) {
  with_one_rank([](DeviceCommunicator& comm, cudaStream_t stream) { test::expect_reduce_scatter16(comm, stream, true); });
}

TEST_F(NcclSingleGpu, ZeroSizedCollectivesDoNothing) {
  with_one_rank([](DeviceCommunicator& comm, cudaStream_t stream) {
    comm.all_gather(nullptr, nullptr, 0, stream);
    comm.reduce_scatter_sum(nullptr, nullptr, 0, stream);
    comm.all_reduce_max(nullptr, 0, stream);
    comm.all_to_all(nullptr, nullptr, 0, stream);
    comm.synchronize(stream, test::kTestTimeoutSeconds);
    test::expect_exact_collectives(comm, stream);
  });
}

TEST_F(NcclSingleGpu, CapturedStepReplaysTheEagerValues) {
  with_one_rank([](DeviceCommunicator& comm, cudaStream_t stream) {
    test::expect_captured_step_replays(comm, stream, cudaStreamCaptureModeGlobal);
  });
}

TEST_F(NcclSingleGpu, SplitWithAColorGivesAOneRankCommunicator) {
  with_one_rank([](DeviceCommunicator& comm, cudaStream_t stream) {
    std::unique_ptr<DeviceCommunicator> child = comm.split(0, 0);
    ASSERT_NE(child, nullptr);
    EXPECT_EQ(child->rank(), 0);
    EXPECT_EQ(child->size(), 1);
    EXPECT_EQ(child->device(), comm.device());
    EXPECT_STREQ(child->kind(), "nccl");
    child->warm_up(stream);
    test::expect_exact_collectives(*child, stream);
    test::expect_exact_collectives(comm, stream);  // the parent still works
  });
}

TEST_F(NcclSingleGpu, SplitWithANegativeColorGivesNothing) {
  with_one_rank([](DeviceCommunicator& comm, cudaStream_t stream) {
    EXPECT_EQ(comm.split(-1, 0), nullptr);
    test::expect_exact_collectives(comm, stream);  // the parent still works
  });
}

TEST_F(NcclSingleGpu, CreateOnAnInvalidDeviceThrowsNamingIt) {
  int count = 0;
  THDCP_CHECK_CUDA(cudaGetDeviceCount(&count));
  run_in_process(1, [&](Communicator& host) {
    EXPECT_THDCP_ERROR(nccl::create(host, count, test_options()),
                       "device " + std::to_string(count) + " is not a CUDA device of this process");
    EXPECT_THDCP_ERROR(nccl::create(host, -1, test_options()), "device -1 is not a CUDA device of this process");
  });
}

// NCCL refuses two ranks of one communicator on one GPU: both ranks must throw (not hang),
// naming themselves and NCCL's reason.
TEST_F(NcclSingleGpu, TwoRanksOnOneDeviceThrowOnEveryRank) {
  int failures = 0;
  std::mutex mutex;
  run_in_process(2, [&](Communicator& host) {
    try {
      nccl::create(host, 0, test_options());
      ADD_FAILURE() << "rank " << host.rank() << ": no thdcp::Error thrown";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("rank " + std::to_string(host.rank()) + " of 2 (device 0): ncclCommInitRankConfig failed"),
                std::string::npos)
          << message;
      std::lock_guard<std::mutex> lock(mutex);
      ++failures;
    }
  });
  EXPECT_EQ(failures, 2);
}

// The unique-id way in (what the PyTorch package uses: the id travels over torch.distributed).
TEST_F(NcclSingleGpu, CreateFromAUniqueIdGivesAWorkingCommunicator) {
  const std::vector<char> id = nccl::unique_id();
  ASSERT_EQ(id.size(), nccl::kUniqueIdBytes);
  std::unique_ptr<DeviceCommunicator> comm = nccl::create_from_unique_id(id.data(), id.size(), 0, 1, 0, test_options());
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  test::Stream stream;
  comm->warm_up(stream.get());
  test::expect_exact_collectives(*comm, stream.get());
}

TEST_F(NcclSingleGpu, CreateFromAUniqueIdRefusesBadArguments) {
  const std::vector<char> id = nccl::unique_id();
  EXPECT_THDCP_ERROR(nccl::create_from_unique_id(nullptr, id.size(), 0, 1, 0), "id is null");
  EXPECT_THDCP_ERROR(nccl::create_from_unique_id(id.data(), 16, 0, 1, 0), "id_bytes = 16");
  EXPECT_THDCP_ERROR(nccl::create_from_unique_id(id.data(), id.size(), 1, 1, 0), "rank = 1 with size 1");
  EXPECT_THDCP_ERROR(nccl::create_from_unique_id(id.data(), id.size(), 0, 0, 0), "size = 0");
  EXPECT_THDCP_ERROR(nccl::create_from_unique_id(id.data(), id.size(), 0, 1, -1), "device -1 is not a CUDA device");
}

// A borrowed communicator works through thdcp and stays the caller's: still usable after
// the wrapper is gone, and destroyed by the caller.
TEST_F(NcclSingleGpu, BorrowUsesTheCallersCommunicatorAndLeavesItAlive) {
  THDCP_CHECK_CUDA(cudaSetDevice(0));
  ncclComm_t raw = nullptr;
  ASSERT_EQ(ncclCommInitAll(&raw, 1, nullptr), ncclSuccess);
  test::Stream stream;
  {
    std::unique_ptr<DeviceCommunicator> comm = nccl::borrow(raw, 0, test_options());
    EXPECT_EQ(comm->rank(), 0);
    EXPECT_EQ(comm->size(), 1);
    comm->warm_up(stream.get());
    test::expect_exact_collectives(*comm, stream.get());
  }
  float* value = nullptr;
  THDCP_CHECK_CUDA(cudaMalloc(&value, sizeof(float)));
  EXPECT_EQ(ncclAllReduce(value, value, 1, ncclFloat32, ncclMax, raw, stream.get()), ncclSuccess);
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream.get()));
  THDCP_CHECK_CUDA(cudaFree(value));
  EXPECT_EQ(ncclCommDestroy(raw), ncclSuccess);
  EXPECT_THDCP_ERROR(nccl::borrow(nullptr, 0), "nccl_comm is null");
}

}  // namespace
}  // namespace thdcp
