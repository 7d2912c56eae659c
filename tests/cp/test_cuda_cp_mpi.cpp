// AllGather CP over NCCL with one MPI process per GPU (the way a training job runs it):
// the edge-case table under both layouts with cp = the process count, eager against the CPU
// reference and the captured step replayed on a new batch against eager, bit for bit. Registered as
// cuda_cp_mpi_np{2,4,8} (label multi_gpu); exits 77 (skipped) with the reason when a process
// sees fewer GPUs than the job has processes.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <tuple>

#include "support/cp/cuda_cp_cases.h"
#include "support/mpi_main.h"
#include "thdcp/comm/mpi.h"
#include "thdcp/comm_device/nccl.h"

namespace thdcp {
namespace {

constexpr int kSkipped = 77;
std::unique_ptr<Communicator> g_world;
std::unique_ptr<DeviceCommunicator> g_comm;

class CudaCpProcessPerGpu : public ::testing::TestWithParam<std::tuple<CpLayout, int /*edge case*/>> {};

TEST_P(CudaCpProcessPerGpu, EagerMatchesReferenceAndReplayMatchesEager) {
  const auto [layout, index] = GetParam();
  test::check_edge_case_with_own_capture(*g_comm, index, cudaStreamCaptureModeGlobal, layout);
}

// Both layouts: dual chunk (the default) and contiguous.
INSTANTIATE_TEST_SUITE_P(EdgeCases, CudaCpProcessPerGpu,
                         ::testing::Combine(::testing::Values(CpLayout::kDualChunk, CpLayout::kContiguous),
                                            ::testing::Range(0, 6)));

// All-to-all CP (kv_heads = the process count, the case's GQA ratio kept).
class CudaCpAllToAllProcessPerGpu : public CudaCpProcessPerGpu {};

TEST_P(CudaCpAllToAllProcessPerGpu, EagerMatchesReferenceAndReplayMatchesEager) {
  const auto [layout, index] = GetParam();
  test::check_edge_case_with_own_capture(*g_comm, index, cudaStreamCaptureModeGlobal, layout, cp::CpComm::kAllToAll);
}

INSTANTIATE_TEST_SUITE_P(EdgeCases, CudaCpAllToAllProcessPerGpu,
                         ::testing::Combine(::testing::Values(CpLayout::kDualChunk, CpLayout::kContiguous),
                                            ::testing::Range(0, 6)));

// a2a+ag CP: all-to-all groups of 2 processes, AllGather across the rest (kv_heads = 2).
class CudaCpA2aAgProcessPerGpu : public CudaCpProcessPerGpu {};

TEST_P(CudaCpA2aAgProcessPerGpu, EagerMatchesReferenceAndReplayMatchesEager) {
  const auto [layout, index] = GetParam();
  if (g_comm->size() % 2 != 0) GTEST_SKIP() << "a2a+ag in groups of 2 needs an even process count";
  test::check_edge_case_with_own_capture(*g_comm, index, cudaStreamCaptureModeGlobal, layout, cp::CpComm::kA2aAg,
                                         /*a2a_size=*/2);
}

INSTANTIATE_TEST_SUITE_P(EdgeCases, CudaCpA2aAgProcessPerGpu,
                         ::testing::Combine(::testing::Values(CpLayout::kDualChunk, CpLayout::kContiguous),
                                            ::testing::Range(0, 6)));

int run(int argc, char** argv) {
  g_world = mpi::world();
  const test::VisibleGpus gpus = test::visible_gpus(*g_world);
  if (gpus.fewest < g_world->size() || !nccl::built_with_nccl()) {
    if (g_world->rank() == 0) {
      std::printf("test_cuda_cp_mpi: SKIPPED: needs %d GPUs (one per process) and NCCL; %d visible%s\n",
                  g_world->size(), gpus.fewest, nccl::built_with_nccl() ? "" : ", built without NCCL");
    }
    return kSkipped;
  }
  const int device = test::launched_device(g_world->rank(), gpus.here);
  THDCP_CHECK_CUDA(cudaSetDevice(device));
  g_comm = nccl::create(*g_world, device);
  return test::run_tests_on_every_rank(*g_world, argc, argv);
}

}  // namespace
}  // namespace thdcp

int main(int argc, char** argv) {
  return thdcp::test::mpi_test_main(argc, argv, "test_cuda_cp_mpi", thdcp::run, thdcp::g_comm, thdcp::g_world);
}
