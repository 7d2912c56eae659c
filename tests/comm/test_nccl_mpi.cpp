// The NCCL communicator with one MPI process per GPU, bootstrapped by the MPI world: the
// way a training job runs it. Registered with ctest as `nccl_mpi` (mpirun -np 2, label
// multi_gpu). Exits with 77 (skipped) when a process sees fewer than 2 GPUs, 0 when every
// rank passes, 1 otherwise.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "support/comm/collective_step.h"
#include "support/cuda/cuda_test.h"
#include "support/mpi_main.h"
#include "thdcp/comm/mpi.h"
#include "thdcp/comm_device/nccl.h"

namespace thdcp {
namespace {

constexpr int kSkipped = 77;

// Made in main() before the tests run, destroyed after them (before MPI finalizes).
std::unique_ptr<Communicator> g_world;
std::unique_ptr<DeviceCommunicator> g_comm;

TEST(NcclOverMpi, CollectivesGiveExactValues) {
  test::Stream stream;
  test::expect_exact_collectives(*g_comm, stream.get());
}

// The 16-bit reduce-scatter across processes: NCCL's order and roundings, within size() u of
// the exact sums.
TEST(NcclOverMpi, SixteenBitReduceScatterIsWithinItsRoundings) {
  test::Stream stream;
  test::expect_reduce_scatter16(*g_comm, stream.get(), /*rank_order=*/false);
}

TEST(NcclOverMpi, CapturedStepReplaysTheEagerValues) {
  test::Stream stream;
  test::expect_captured_step_replays(*g_comm, stream.get(), cudaStreamCaptureModeGlobal);
}

TEST(NcclOverMpi, SplitByParityRunsACollectiveInEachHalf) {
  test::Stream stream;
  const int color = g_comm->rank() % 2;
  std::unique_ptr<DeviceCommunicator> half = g_comm->split(color, g_comm->rank());
  ASSERT_NE(half, nullptr);
  EXPECT_EQ(half->size(), (g_comm->size() - color + 1) / 2);
  EXPECT_EQ(half->rank(), g_comm->rank() / 2);
  half->warm_up(stream.get());
  test::expect_exact_collectives(*half, stream.get());
}

int run(int argc, char** argv) {
  g_world = mpi::world();
  // Every rank takes the same decision, so none waits in a collective for one that left.
  const int gpus = test::visible_gpus(*g_world).fewest;
  if (gpus < 2) {
    if (g_world->rank() == 0) {
      std::printf("test_nccl_mpi: SKIPPED: needs 2 GPUs, %d visible to a process of this job\n", gpus);
    }
    return kSkipped;
  }
  const int device = test::launched_device(0, gpus);
  nccl::Options options;
  options.timeout_seconds = test::kTestTimeoutSeconds;
  g_comm = nccl::create(*g_world, device, options);
  test::Stream stream;
  g_comm->warm_up(stream.get());
  return test::run_tests_on_every_rank(*g_world, argc, argv);
}

}  // namespace
}  // namespace thdcp

int main(int argc, char** argv) {
  return thdcp::test::mpi_test_main(argc, argv, "test_nccl_mpi", thdcp::run, thdcp::g_comm, thdcp::g_world);
}
