// AllGather CP with the CUDA backend, cp ranks as threads on one GPU (in-process
// communicator, host-staged), equals the single-device CPU reference: out, lse, max_logit,
// dq, dk, dv. The layouts are in capacity form (placeholder sequences, slack rows).
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "cuda/cuda_test_support.h"
#include "support/cp_check.h"
#include "support/gpu_tolerance.h"
#include "thdcp/cp/cuda.h"
#include "thdcp/comm/host_staged.h"

namespace thdcp {
namespace {

struct RankOutputs {
  HostTensor out, dq, dk, dv;
  std::vector<float> lse, max_logit;
};

// One rank: uploads its local tensors, runs cp_forward and cp_backward on its own stream,
// downloads the outputs.
RankOutputs run_rank(Communicator& host_comm, const test::Batch& b, const Mask& mask, const cuda::Options& options) {
  THDCP_CHECK_CUDA(cudaSetDevice(0));
  cudaStream_t stream;
  THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cuda::HostStagedCommunicator comm(host_comm, stream);
  const LayoutView layout = b.layout.view();
  const int cp = comm.size(), rank = comm.rank();
  test::DeviceTensor q(test::local_part(b.q, layout, cp, rank)), k(test::local_part(b.k, layout, cp, rank)),
      v(test::local_part(b.v, layout, cp, rank)), dout(test::local_part(b.dout, layout, cp, rank));
  const int64_t rows = q.tokens, hq = q.heads, hkv = k.heads, dim = q.head_dim;
  test::DeviceTensor out(q.dtype, rows, hq, dim), dq(q.dtype, rows, hq, dim), dk(k.dtype, rows, hkv, dim),
      dv(k.dtype, rows, hkv, dim);
  test::DeviceBuffer lse(sizeof(float) * hq * rows), max_logit(sizeof(float) * hq);
  test::DeviceBuffer cu(sizeof(int32_t) * b.layout.cu_seqlens.size()),
      cup(sizeof(int32_t) * b.layout.cu_seqlens_padded.size());
  cu.upload(b.layout.cu_seqlens.data(), cu.bytes());
  cup.upload(b.layout.cu_seqlens_padded.data(), cup.bytes());
  for (test::DeviceBuffer* p : {&out.buffer, &dq.buffer, &dk.buffer, &dv.buffer, &lse, &max_logit}) p->poison();
  const cuda::DeviceLayout device_layout{cu.as<int32_t>(), cup.as<int32_t>(), layout.num_seqs, layout.total_rows()};
  test::DeviceBuffer fwd_ws(cuda::cp_forward_workspace_size(device_layout, cp, hq, hkv, dim, q.dtype));
  test::DeviceBuffer bwd_ws(cuda::cp_backward_workspace_size(device_layout, cp, hq, hkv, dim, q.dtype, options));
  cuda::cp_forward(comm, device_layout, mask, q.cview(), k.cview(), v.cview(), out.view(), lse.as<float>(),
                   max_logit.as<float>(), fwd_ws.data(), fwd_ws.bytes(), stream, options);
  cuda::cp_backward(comm, device_layout, mask, q.cview(), k.cview(), v.cview(), out.cview(), dout.cview(),
                    lse.as<float>(), dq.view(), dk.view(), dv.view(), bwd_ws.data(), bwd_ws.bytes(), stream, options);
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
  THDCP_CHECK_CUDA(cudaStreamDestroy(stream));
  RankOutputs r;
  r.out = out.download();
  r.dq = dq.download();
  r.dk = dk.download();
  r.dv = dv.download();
  r.lse = test::download_vector<float>(lse, static_cast<size_t>(hq * rows));
  r.max_logit = test::download_vector<float>(max_logit, static_cast<size_t>(hq));
  return r;
}

// Runs CP on `cp` ranks of one GPU and compares every rank's outputs with the reference.
void expect_cp_matches_reference(int cp, const Mask& mask, DType dtype, int dim, const cuda::Options& options) {
  Rng rng(static_cast<uint64_t>(cp * 31 + mask.window_left * 7 + mask.window_right + dim + static_cast<int>(dtype)));
  std::vector<int64_t> lengths = test::random_lengths(rng, 6, 300);
  for (int64_t extra : {int64_t{0}, int64_t{1}, int64_t{2 * cp + 1}, int64_t{1500}}) lengths.push_back(extra);
  // Capacity form: two placeholders' worth of sequences and 8*cp slack rows.
  int64_t rows = 0;
  for (int64_t n : lengths) rows += cp_padded_length(n, cp);
  const BatchLayout layout =
      make_layout(lengths, cp, Capacity{static_cast<int>(lengths.size()) + 2, rows + 8 * cp});
  const test::Batch b = test::make_batch(layout, dtype, 8, 2, dim, rng.next());
  const test::GlobalResult ref = test::single_device(b, mask, AttentionOptions{});

  std::vector<RankOutputs> outputs(static_cast<size_t>(cp));
  run_in_process(cp, [&](Communicator& comm) {
    outputs[static_cast<size_t>(comm.rank())] = run_rank(comm, b, mask, options);
  });

  const LayoutView view = layout.view();
  for (int rank = 0; rank < cp; ++rank) {
    const RankOutputs& o = outputs[static_cast<size_t>(rank)];
    SCOPED_TRACE("cp " + std::to_string(cp) + " rank " + std::to_string(rank));
    EXPECT_TRUE(test::matches("out", o.out, test::local_part(ref.out, view, cp, rank), test::gpu_out_tolerance(dtype)));
    EXPECT_TRUE(test::matches("dq", o.dq, test::local_part(ref.dq, view, cp, rank), test::gpu_grad_tolerance(dtype)));
    EXPECT_TRUE(test::matches("dk", o.dk, test::local_part(ref.dk, view, cp, rank), test::gpu_grad_tolerance(dtype)));
    EXPECT_TRUE(test::matches("dv", o.dv, test::local_part(ref.dv, view, cp, rank), test::gpu_grad_tolerance(dtype)));
    EXPECT_TRUE(test::matches("lse", o.lse, test::local_lse(ref.lse, 8, view, cp, rank), test::kGpuFp32ResultTolerance));
    EXPECT_TRUE(test::matches("max_logit", o.max_logit, ref.max_logit, test::kGpuFp32ResultTolerance));
  }
}

using CudaCpCase = std::tuple<int /*cp*/, Mask, DType, int /*head_dim*/>;

class CudaCp : public test::CudaTest, public ::testing::WithParamInterface<CudaCpCase> {};

TEST_P(CudaCp, EqualsSingleDeviceReference) {
  const auto [cp, mask, dtype, dim] = GetParam();
  expect_cp_matches_reference(cp, mask, dtype, dim, cuda::Options{});
}

class CudaCpFusedDq : public test::CudaTest {};

// The non-deterministic backward (dQ by atomics) through the same CP path.
TEST_F(CudaCpFusedDq, EqualsSingleDeviceReference) {
  cuda::Options options;
  options.deterministic = false;
  expect_cp_matches_reference(2, Mask::causal(), DType::kBFloat16, 128, options);
  expect_cp_matches_reference(4, Mask::window(64, 200), DType::kFloat16, 64, options);
}

std::string case_name(const ::testing::TestParamInfo<CudaCpCase>& param_info) {
  const auto& [cp, mask, dtype, dim] = param_info.param;
  return "cp" + std::to_string(cp) + "_" + test::mask_label(mask) + "_" + dtype_name(dtype) + "_d" + std::to_string(dim);
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, CudaCp,
    ::testing::Combine(::testing::Values(1, 2, 4),
                       ::testing::Values(Mask::causal(), Mask::full(), Mask::window(64, 200), Mask::window(1000, 0)),
                       ::testing::Values(DType::kBFloat16, DType::kFloat16), ::testing::Values(64, 128)),
    case_name);

}  // namespace
}  // namespace thdcp
