// AllGather CP over NCCL. Label gpu: with cp = 1, the CP step over NCCL (and over the
// shared-GPU communicator) equals the plain single-GPU attention call on the same table bit
// for bit. Label multi_gpu (test_cuda_cp_multi_gpu.cpp, test_cuda_cp_mpi.cpp): the edge-case
// table with cp = the visible GPUs, eager against the CPU reference and graph replay against
// eager, one process with a thread per GPU and a process per GPU.
#include <gtest/gtest.h>

#include <vector>

#include "support/cuda/one_shot.h"
#include "support/cp/cuda_cp_cases.h"
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
  test::DeviceTensor q(b.q), k(b.k), v(b.v), dout(b.dout);
  const int64_t hq = q.heads, hkv = k.heads, dim = q.head_dim;
  test::DeviceTensor out(q.dtype, rows, hq, dim), dq(q.dtype, rows, hq, dim), dk(k.dtype, rows, hkv, dim),
      dv(k.dtype, rows, hkv, dim);
  test::DeviceBuffer lse(sizeof(float) * hq * rows), max_logit(sizeof(float) * hq);
  test::DeviceBuffer cu(sizeof(int32_t) * b.layout.cu_seqlens.size()), cup(cu.bytes());
  cu.upload(b.layout.cu_seqlens.data(), cu.bytes());
  cup.upload(b.layout.cu_seqlens_padded.data(), cup.bytes());
  test::DeviceBuffer segments(sizeof(Segment) * 2 * static_cast<size_t>(layout.num_seqs));
  const cuda::DeviceSegmentTable table =
      test::build_cp_segment_table(cu.as<int32_t>(), cup.as<int32_t>(), layout.num_seqs, rows, 1, 0, mask,
                                   segments.as<Segment>(), nullptr);
  test::DeviceBuffer fwd_ws(test::forward_workspace_size(table));
  test::DeviceBuffer bwd_ws(test::backward_workspace_size(table, hq, hkv, dim, k.dtype));
  test::attention_forward(table, q.cview(), k.cview(), v.cview(), out.view(), lse.as<float>(), max_logit.as<float>(),
                          fwd_ws.data(), fwd_ws.bytes(), nullptr);
  test::attention_backward(table, q.cview(), k.cview(), v.cview(), out.cview(), dout.cview(), lse.as<float>(),
                           dq.view(), dk.view(), dv.view(), bwd_ws.data(), bwd_ws.bytes(), nullptr);
  THDCP_CHECK_CUDA(cudaDeviceSynchronize());
  test::Outputs r;
  r.out = out.download();
  r.dq = dq.download();
  r.dk = dk.download();
  r.dv = dv.download();
  r.lse = test::download_vector<float>(lse, static_cast<size_t>(hq * rows));
  r.max_logit = test::download_vector<float>(max_logit, static_cast<size_t>(hq));
  return r;
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
      state.load(b);
      state.step(state.stream());
      over_nccl = state.download();
    });
    run_shared_gpu(1, [&](DeviceCommunicator& comm) {
      test::CudaCpRank state(comm, problem);
      state.load(b);
      state.step(state.stream());
      over_shared_gpu = state.download();
    });
    EXPECT_TRUE(test::identical(over_nccl, plain)) << "NCCL cp=1 vs the plain call";
    EXPECT_TRUE(test::identical(over_shared_gpu, plain)) << "shared-GPU cp=1 vs the plain call";
  }
}

}  // namespace
}  // namespace thdcp
