// The NCCL communicators of the C ABI (libthdcp.so) on a GPU (label gpu; SKIPPED with the
// reason where no CUDA device is visible, or where libthdcp was built without NCCL): a
// communicator from thdcp_nccl_unique_id, and one borrowed from the caller's
// ncclCommInitAll; a cp = 1 CP plan over each equals the single-device C ABI attention
// within the GPU tolerances of tests/cp; the borrowed ncclComm_t stays the caller's.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#if defined(THDCP_HAVE_NCCL)
#include <nccl.h>
#endif

#include "support/capi/capi_cuda.h"
#include "support/gpu_tolerance.h"
#include "thdcp/thdcp.h"

namespace thdcp::test {
namespace {

class CApiCudaNccl : public CApiCudaTest {
 protected:
  void SetUp() override {
    CApiCudaTest::SetUp();
    if (IsSkipped()) return;
    int built = 0;
    ASSERT_C_OK(thdcp_built_with(THDCP_FEATURE_NCCL, &built));
    if (!built) GTEST_SKIP() << "libthdcp was built without NCCL (thdcp_built_with(THDCP_FEATURE_NCCL) gives 0)";
  }
};

const Shape kNcclShape{DType::kFloat16, 8, 2, 128, Mask::window(200, 0)};

// What every NCCL communicator of one rank on device 0 reports.
void expect_one_nccl_rank(thdcp_communicator_t comm) {
  int rank = -1, size = 0, is_device = 0, device = -1;
  const char* kind = nullptr;
  EXPECT_C_OK(thdcp_communicator_rank(comm, &rank));
  EXPECT_C_OK(thdcp_communicator_size(comm, &size));
  EXPECT_C_OK(thdcp_communicator_is_device(comm, &is_device));
  EXPECT_C_OK(thdcp_communicator_device(comm, &device));
  EXPECT_C_OK(thdcp_communicator_kind(comm, &kind));
  EXPECT_EQ(rank, 0);
  EXPECT_EQ(size, 1);
  EXPECT_EQ(is_device, 1);
  EXPECT_EQ(device, 0);
  EXPECT_STREQ(kind, "nccl");
}

TEST_F(CApiCudaNccl, CpOneOverACommunicatorFromAUniqueIdEqualsSingleDeviceAttention) {
  const Batch b = varlen_batch(kNcclShape, 21);
  const Outputs reference = c_single_device(b, kNcclShape);
  unsigned char id[THDCP_NCCL_UNIQUE_ID_BYTES] = {};
  ASSERT_C_OK(thdcp_nccl_unique_id(id, sizeof(id)));
  thdcp_communicator_t comm = nullptr;
  ASSERT_C_OK(thdcp_communicator_create_nccl(id, sizeof(id), /*rank=*/0, /*size=*/1, /*device=*/0, &comm));
  expect_one_nccl_rank(comm);
  const Outputs local = c_cp_rank(comm, b, kNcclShape);
  EXPECT_C_OK(thdcp_communicator_destroy(comm));
  expect_gpu_close(c_merge_ranks({local}, b), reference, kNcclShape.dtype);
}

TEST_F(CApiCudaNccl, CpOneOverABorrowedNcclCommEqualsSingleDeviceAttentionAndTheCommStaysTheCallers) {
#if !defined(THDCP_HAVE_NCCL)
  GTEST_SKIP() << "this test was compiled without nccl.h (THDCP_HAVE_NCCL is not defined): it cannot make the "
                  "caller's ncclComm_t";
#else
  const Batch b = varlen_batch(kNcclShape, 22);
  const Outputs reference = c_single_device(b, kNcclShape);
  ncclComm_t raw = nullptr;
  const int devices[1] = {0};
  ASSERT_EQ(ncclCommInitAll(&raw, 1, devices), ncclSuccess);
  thdcp_communicator_t comm = nullptr;
  EXPECT_C_OK(thdcp_communicator_borrow_nccl(raw, 0, &comm));
  Outputs local;
  if (comm != nullptr) {
    expect_one_nccl_rank(comm);
    local = c_cp_rank(comm, b, kNcclShape);
    EXPECT_C_OK(thdcp_communicator_destroy(comm));
  }

  // Still the caller's once thdcp's handle is gone: it all-reduces, then its owner destroys it.
  const Stream stream;
  DeviceBuffer value(sizeof(float));
  const float three = 3.0f;
  value.upload(&three, sizeof(float), stream.get());
  EXPECT_EQ(ncclAllReduce(value.data(), value.data(), 1, ncclFloat, ncclSum, raw, stream.get()), ncclSuccess);
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream.get()));
  float reduced = 0.0f;
  value.download(&reduced, sizeof(float));
  EXPECT_EQ(reduced, 3.0f);
  EXPECT_EQ(ncclCommDestroy(raw), ncclSuccess);

  expect_gpu_close(c_merge_ranks({local}, b), reference, kNcclShape.dtype);
#endif
}

}  // namespace
}  // namespace thdcp::test
