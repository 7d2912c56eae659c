// AllGather CP over NCCL with one MPI process per GPU (the way a training job runs it):
// the edge-case table with cp = the process count, eager against the CPU reference and the
// captured step replayed on a new batch against eager, bit for bit. Registered as
// cuda_cp_mpi_np{2,4,8} (label multi_gpu); exits 77 (skipped) with the reason when a process
// sees fewer GPUs than the job has processes.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "support/cp/cuda_cp_cases.h"
#include "thdcp/comm/mpi.h"
#include "thdcp/comm_device/nccl.h"

namespace thdcp {
namespace {

constexpr int kSkipped = 77;
std::unique_ptr<Communicator> g_world;
std::unique_ptr<DeviceCommunicator> g_comm;

class CudaCpProcessPerGpu : public ::testing::TestWithParam<int> {};

TEST_P(CudaCpProcessPerGpu, EagerMatchesReferenceAndReplayMatchesEager) {
  test::check_edge_case_with_own_capture(*g_comm, GetParam(), cudaStreamCaptureModeGlobal);
}

INSTANTIATE_TEST_SUITE_P(EdgeCases, CudaCpProcessPerGpu, ::testing::Range(0, 6));

int run(int argc, char** argv) {
  g_world = mpi::world();
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    count = 0;
  }
  std::vector<int> counts(static_cast<size_t>(g_world->size()));
  g_world->all_gather(&count, counts.data(), sizeof(int));
  const int fewest = *std::min_element(counts.begin(), counts.end());
  if (fewest < g_world->size() || !nccl::built_with_nccl()) {
    if (g_world->rank() == 0) {
      std::printf("test_cuda_cp_mpi: SKIPPED: needs %d GPUs (one per process) and NCCL; %d visible%s\n",
                  g_world->size(), fewest, nccl::built_with_nccl() ? "" : ", built without NCCL");
    }
    return kSkipped;
  }
  const int local_rank = nccl::local_rank_from_environment();
  const int device = nccl::device_for_local_rank(local_rank < 0 ? g_world->rank() : local_rank, count);
  THDCP_CHECK_CUDA(cudaSetDevice(device));
  g_comm = nccl::create(*g_world, device);
  ::testing::InitGoogleTest(&argc, argv);
  if (g_world->rank() != 0) {
    delete ::testing::UnitTest::GetInstance()->listeners().Release(
        ::testing::UnitTest::GetInstance()->listeners().default_result_printer());
  }
  const int failed = RUN_ALL_TESTS();
  float any = failed ? 1.0f : 0.0f;
  g_world->all_reduce_max(&any, 1);
  return any > 0 ? 1 : 0;
}

}  // namespace
}  // namespace thdcp

int main(int argc, char** argv) {
  thdcp::mpi::Session session(&argc, &argv);
  int code = 1;
  try {
    code = thdcp::run(argc, argv);
  } catch (const thdcp::Error& e) {
    std::fprintf(stderr, "test_cuda_cp_mpi: %s\n", e.what());
    session.abort(1);
  }
  thdcp::g_comm.reset();
  thdcp::g_world.reset();
  return code;
}
