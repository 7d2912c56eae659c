#include "support/cuda/cuda_test.h"

#include <algorithm>

#include "thdcp/comm_device/nccl.h"

namespace thdcp::test {

void CudaTest::SetUp() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    GTEST_SKIP() << "no CUDA device: cudaGetDeviceCount failed with " << cudaGetErrorName(status) << " ("
                 << cudaGetErrorString(status) << ")";
  }
  if (count == 0) GTEST_SKIP() << "no CUDA device: cudaGetDeviceCount reports 0 devices";
}

void MultiGpuTest::SetUp() {
  CudaTest::SetUp();
  if (IsSkipped()) return;
  THDCP_CHECK_CUDA(cudaGetDeviceCount(&gpus_));
  if (gpus_ < 2) GTEST_SKIP() << "needs 2 GPUs, " << gpus_ << " visible";
}

VisibleGpus visible_gpus(Communicator& world) {
  VisibleGpus gpus;
  if (cudaGetDeviceCount(&gpus.here) != cudaSuccess) {
    (void)cudaGetLastError();
    gpus.here = 0;
  }
  std::vector<int> counts(static_cast<size_t>(world.size()));
  world.all_gather(&gpus.here, counts.data(), sizeof(int));
  gpus.fewest = *std::min_element(counts.begin(), counts.end());
  return gpus;
}

int launched_device(int fallback_rank, int gpus) {
  const int local_rank = nccl::local_rank_from_environment();
  return nccl::device_for_local_rank(local_rank < 0 ? fallback_rank : local_rank, gpus);
}

}  // namespace thdcp::test
