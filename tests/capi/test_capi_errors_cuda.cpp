// Bad arguments of the C ABI (libthdcp.so) on the CUDA backend (label gpu; SKIPPED with the
// reason where no CUDA device is visible): workspaces too small (attention and CP plans) or
// in host memory, a host pointer as q: the status, thdcp_last_error naming the argument,
// and nothing of the caller's written.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "support/capi/capi_cuda.h"
#include "thdcp/thdcp.h"

namespace thdcp::test {
namespace {

class CApiCudaErrors : public CApiCudaTest {};

template <typename Handle>
Handle untouched_handle() {
  return reinterpret_cast<Handle>(uintptr_t{0x5a5a});  // never dereferenced
}

// A device workspace of the size `workspace_size` (thdcp_attention_plan_workspace_size or
// thdcp_cp_plan_workspace_size) gives for `params`; empty if it fails.
template <typename Params>
DeviceBuffer workspace_for(thdcp_status_t (*workspace_size)(const Params*, size_t*), const Params& params) {
  size_t bytes = 0;
  EXPECT_C_OK(workspace_size(&params, &bytes));
  return DeviceBuffer(bytes);
}

TEST_F(CApiCudaErrors, AttentionWorkspaceTooSmallOrInHostMemoryIsRefusedNamingIt) {
  const Shape s{};
  const thdcp_attention_params p = cuda_attention_params(s, kVarlenCapacity, s.dtype);
  const DeviceBuffer workspace = workspace_for(thdcp_attention_plan_workspace_size, p);
  const size_t bytes = workspace.bytes();
  ASSERT_GT(bytes, 0u);
  const auto untouched = untouched_handle<thdcp_attention_plan_t>();
  thdcp_attention_plan_t plan = untouched;
  EXPECT_C_STATUS(thdcp_attention_plan_create(&p, workspace.data(), bytes - 1, &plan), THDCP_ERROR_INVALID_ARGUMENT,
                  "thdcp_attention_plan_create: workspace=", "workspace_bytes=" + std::to_string(bytes - 1),
                  "the plan needs " + std::to_string(bytes) + " bytes of device memory");
  EXPECT_EQ(plan, untouched);

  // Host memory of the right size and alignment: the device check names it.
  const size_t rounded = (bytes + 255) / 256 * 256;
  void* host = std::aligned_alloc(256, rounded);
  ASSERT_NE(host, nullptr);
  EXPECT_C_STATUS(thdcp_attention_plan_create(&p, host, bytes, &plan), THDCP_ERROR_INVALID_ARGUMENT,
                  "thdcp_attention_plan_create: ", "workspace points to unregistered host memory");
  EXPECT_EQ(plan, untouched);
  std::free(host);
}

TEST_F(CApiCudaErrors, CpWorkspaceTooSmallIsRefusedNamingIt) {
  thdcp_communicator_t comm = nullptr;
  ASSERT_C_OK(thdcp_communicator_create_shared_gpu_group(1, 0, &comm));
  const thdcp_cp_params p = cuda_cp_params(Shape{}, kVarlenCapacity, 1);
  const DeviceBuffer workspace = workspace_for(thdcp_cp_plan_workspace_size, p);
  const size_t bytes = workspace.bytes();
  ASSERT_GT(bytes, 0u);
  thdcp_cp_plan_t plan = untouched_handle<thdcp_cp_plan_t>();
  EXPECT_C_STATUS(thdcp_cp_plan_create(comm, &p, workspace.data(), bytes - 1, &plan), THDCP_ERROR_INVALID_ARGUMENT,
                  "thdcp_cp_plan_create: ", "workspace has " + std::to_string(bytes - 1) + " bytes",
                  "cuda_workspace_size gives " + std::to_string(bytes));
  EXPECT_EQ(plan, untouched_handle<thdcp_cp_plan_t>());
  EXPECT_C_OK(thdcp_communicator_destroy(comm));
}

// q in host memory. It is pinned (cudaMallocHost), which a kernel can read through unified
// addressing: should the library launch anyway, this case fails on its checks instead of
// faulting and leaving a broken CUDA context to the cases after it.
TEST_F(CApiCudaErrors, HostPointerAsQIsRefusedNamingItAndNothingIsWritten) {
  const Shape s{};
  const Batch b = varlen_batch(s, 3);
  const Stream stream;
  LayoutOnDevice layout(kVarlenCapacity.max_seqs);
  layout.upload(b.layout, stream.get());
  const StepBuffers buffers(s, b.q.tokens(), s.dtype);
  const StepTensors& t = buffers.tensors();
  upload_inputs(t, b.q, b.k, b.v, b.dout, stream.get());
  fill_outputs(t, stream.get(), 0x5a);
  const Outputs before = download_outputs(t, stream.get());

  void* host_q = nullptr;
  ASSERT_EQ(cudaMallocHost(&host_q, bytes_of(t.q)), cudaSuccess);
  std::memcpy(host_q, b.q.data(), bytes_of(t.q));
  thdcp_tensor_t q = t.q;
  q.data = host_q;
  {
    const AttentionPlan plan(cuda_attention_params(s, kVarlenCapacity, s.dtype));
    const thdcp_layout_t l = layout.c();
    EXPECT_C_STATUS(thdcp_attention_forward(plan.get(), &l, &q, &t.k, &t.v, &t.out, t.lse, t.max_logit, stream.get()),
                    THDCP_ERROR_INVALID_ARGUMENT, "thdcp_attention_forward: ", "q points to", "host memory");
    EXPECT_TRUE(identical(download_outputs(t, stream.get()), before)) << "the refused call wrote its outputs";
  }
  EXPECT_EQ(cudaFreeHost(host_q), cudaSuccess);
}

}  // namespace
}  // namespace thdcp::test
