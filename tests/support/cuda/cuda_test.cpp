#include "support/cuda/cuda_test.h"

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

}  // namespace thdcp::test
