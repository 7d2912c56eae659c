// AllGather CP over NCCL. Label gpu: with cp = 1, the CP step over NCCL (and over the
// shared-GPU communicator) equals the plain single-GPU attention call on the same table bit
// for bit. Label multi_gpu (test_cuda_cp_multi_gpu.cpp, test_cuda_cp_mpi.cpp): the edge-case
// table with cp = the visible GPUs, eager against the CPU reference and graph replay against
// eager, one process with a thread per GPU and a process per GPU.
#include <gtest/gtest.h>

#include <vector>

#include "support/cp/cuda_cp_cases.h"
#include "support/cuda/device_step.h"
#include "support/cuda/one_shot.h"
#include "thdcp/comm_device/nccl.h"
#include "thdcp/comm_device/shared_gpu.h"

namespace thdcp {
namespace {

class CudaCpNccl : public test::CudaTest {};

// The plain single-GPU calls on the cp = 1 table of `b` (rank 0 holds the whole batch).
test::Outputs plain_call(const test::Batch& b, const Mask& mask) {
  THDCP_CHECK_CUDA(cudaSetDevice(0));
  const LayoutView layout = b.layout.view();
  const int64_t rows = layout.total_rows();
  const HeadShape heads{b.q.heads(), b.k.heads(), b.q.head_dim()};
  test::DeviceStep step(b.q.dtype(), rows, rows, heads, b.q.dtype());
  step.upload_inputs(b.q, b.k, b.v, b.dout);
  test::DeviceBuffer cu(sizeof(int32_t) * b.layout.cu_seqlens.size()), cup(cu.bytes());
  cu.upload(b.layout.cu_seqlens.data(), cu.bytes());
  cup.upload(b.layout.cu_seqlens_padded.data(), cup.bytes());
  test::DeviceBuffer segments(sizeof(Segment) * 2 * static_cast<size_t>(layout.num_seqs));
  const cuda::DeviceSegmentTable table =
      test::build_cp_segment_table(cu.as<int32_t>(), cup.as<int32_t>(), layout.num_seqs, rows, 1, 0, mask,
                                   segments.as<Segment>(), nullptr);
  test::DeviceBuffer fwd_ws(test::forward_workspace_size(table));
  test::DeviceBuffer bwd_ws(
      test::backward_workspace_size(table, heads.q_heads, heads.kv_heads, heads.head_dim, b.k.dtype()));
  test::attention_step(table, step, fwd_ws, bwd_ws, nullptr);
  THDCP_CHECK_CUDA(cudaDeviceSynchronize());
  return step.download_outputs();
}

TEST_F(CudaCpNccl, CpOneEqualsThePlainSingleGpuCallBitForBit) {
  if (!nccl::built_with_nccl()) GTEST_SKIP() << "thdcp was built without NCCL";
  for (int index : {0, 3, 4}) {
    const test::EdgeCase& c = test::edge_cases()[static_cast<size_t>(index)];
    SCOPED_TRACE(c.name);
    const cp::Problem problem = test::problem_of(c, 1);
    const test::Batch b = test::make_case_batch(c, 1, problem.capacity, 77 + index, false);
    const test::Outputs plain = plain_call(b, c.mask);
    test::Outputs over_nccl, over_shared_gpu;
    run_in_process(1, [&](Communicator& host) {
      std::unique_ptr<DeviceCommunicator> comm = nccl::create(host, 0);
      test::CudaCpRank state(*comm, problem);
      comm->warm_up(state.stream());
      over_nccl = state.run(b);
    });
    run_shared_gpu(1, [&](DeviceCommunicator& comm) {
      test::CudaCpRank state(comm, problem);
      over_shared_gpu = state.run(b);
    });
    EXPECT_TRUE(test::identical(over_nccl, plain)) << "NCCL cp=1 vs the plain call";
    EXPECT_TRUE(test::identical(over_shared_gpu, plain)) << "shared-GPU cp=1 vs the plain call";
  }
}

}  // namespace
}  // namespace thdcp
