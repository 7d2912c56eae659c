// RoPE under AllGather CP on one GPU: every rank rotates its local Q/K (cuda::RopePlan, the
// positions of its dual-chunk rows), then runs the CP step (cp::CudaPlan, ranks sharing the
// GPU). Its out, lse, max_logit, dq, dk, dv equal the single-device CPU reference of RoPE then
// attention on the whole batch (cp = 1), with the tolerances of the other CP tests; and the
// RoPE backward of each rank's dq/dk equals the CPU backward with the same positions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "support/cp/cuda_cp_cases.h"
#include "support/cp/cuda_cp_rank.h"
#include "support/cuda/rope_shape.h"
#include "thdcp/comm_device/shared_gpu.h"
#include "thdcp/cpu/rope.h"
#include "thdcp/cuda/rope.h"

namespace thdcp {
namespace {

using test::EdgeCase;
using test::edge_cases;

// Two RoPE set-ups: NeoX over the whole head from theta; GPT-J over half the head from a
// table (built from theta by the CPU, so the rotated Q/K have the same bits on both sides),
// with per-sequence start offsets.
struct RopeVariant {
  const char* name;
  RopeLayout layout;
  bool half_rotary;
  bool table;
  bool offsets;
};

const RopeVariant kVariants[] = {
    {"halfsplit_theta", RopeLayout::kHalfSplit, false, false, false},
    {"interleaved_partial_table_offsets", RopeLayout::kInterleaved, true, true, true},
};

constexpr int kMaxOffset = 300;

using RopeCpParam = std::tuple<int /*cp*/, int /*edge case*/, int /*variant*/>;

class CudaRopeCp : public test::CudaTest, public ::testing::WithParamInterface<RopeCpParam> {};

TEST_P(CudaRopeCp, RopeThenCpAttentionEqualsRopeThenSingleDeviceAttention) {
  const int cp = std::get<0>(GetParam()), index = std::get<1>(GetParam());
  const EdgeCase& c = edge_cases()[static_cast<size_t>(index)];
  const RopeVariant& variant = kVariants[std::get<2>(GetParam())];
  const cp::Problem problem = test::problem_of(c, cp);
  const test::Batch batch = test::make_case_batch(c, cp, problem.capacity, 3000 + index * 10 + cp, false);
  const RopeConfig config{variant.layout, variant.half_rotary ? c.head_dim / 2 : 0,
                          variant.offsets ? 500000.0f : 10000.0f};
  const int64_t pairs = rope_rotary_dim(config, c.head_dim) / 2;

  std::vector<int32_t> offsets;
  if (variant.offsets) {
    Rng rng(17 + index);
    for (int b = 0; b < problem.capacity.max_seqs; ++b) {
      offsets.push_back(static_cast<int32_t>(rng.uniform_int(0, kMaxOffset)));
    }
  }
  const int32_t* host_offsets = offsets.empty() ? nullptr : offsets.data();
  std::vector<float> cos, sin;
  RopeTable host_table;
  if (variant.table) {
    const int64_t rows = problem.capacity.max_tokens + kMaxOffset + 1;
    cos.resize(static_cast<size_t>(rows * pairs));
    sin.resize(cos.size());
    cpu::rope_table(config, c.head_dim, rows, cos.data(), sin.data());
    host_table = RopeTable{cos.data(), sin.data(), rows};
  }

  // The reference: RoPE on the whole batch (cp = 1), then single-device attention.
  test::Batch roped = batch;
  cpu::rope_forward(roped.layout.view(), 1, 0, config, roped.q.view(), host_offsets, host_table);
  cpu::rope_forward(roped.layout.view(), 1, 0, config, roped.k.view(), host_offsets, host_table);
  const test::Outputs reference = test::single_device(roped, c.mask, AttentionOptions{});

  THDCP_CHECK_CUDA(cudaSetDevice(0));
  test::DeviceBuffer offsets_device(sizeof(int32_t) * offsets.size());
  offsets_device.upload(offsets.data(), offsets_device.bytes());
  test::DeviceBuffer cos_device(sizeof(float) * cos.size()), sin_device(sizeof(float) * sin.size());
  cos_device.upload(cos.data(), cos_device.bytes());
  sin_device.upload(sin.data(), sin_device.bytes());

  std::vector<test::Outputs> outputs(cp), after_rope_backward(cp);
  run_shared_gpu(cp, [&](DeviceCommunicator& comm) {
    const int rank = comm.rank();
    test::CudaCpRank state(comm, problem);
    cuda::RopeShape shape = test::rope_shape(cp, rank, problem.capacity, problem.heads(), problem.dtype, config);
    if (variant.table) shape.table = RopeTable{cos_device.as<float>(), sin_device.as<float>(), host_table.rows};
    shape.with_start_offsets = variant.offsets;
    const cuda::RopePlan rope(shape);
    rope.check_tensors(state.q(), state.k());
    const int32_t* device_offsets = variant.offsets ? offsets_device.as<int32_t>() : nullptr;

    state.load(batch);  // the rank's rows of the un-rotated batch
    THDCP_CHECK_CUDA(cudaDeviceSynchronize());  // the uploads ran on the legacy stream
    const DeviceLayout layout = state.layout();
    rope.forward(layout, device_offsets, state.q(), state.k(), state.stream());
    state.step(state.stream());
    outputs[rank] = state.download();

    // dq, dk are gradients with respect to the rotated q, k: the RoPE backward turns them into
    // gradients with respect to the inputs.
    const BackwardTensors grads = state.backward_tensors();
    rope.backward(layout, device_offsets, grads.dq, grads.dk, state.stream());
    after_rope_backward[rank] = state.download();
  });

  // The RoPE backward alone: the same bits with a table; from theta, one storage ulp where the
  // device's sincosf and the host's cosf/sinf round differently (as test_cuda_rope).
  const Tolerance rope_tolerance =
      variant.table ? Tolerance{0.0, 0.0} : Tolerance{2 * dtype_unit_roundoff(c.dtype), std::ldexp(1.0, -16)};
  for (int rank = 0; rank < cp; ++rank) {
    test::expect_matches_reference(outputs[rank], reference, roped, cp, rank);
    HostTensor dq = outputs[rank].dq, dk = outputs[rank].dk;
    cpu::rope_backward(batch.layout.view(), cp, rank, config, dq.view(), host_offsets, host_table);
    cpu::rope_backward(batch.layout.view(), cp, rank, config, dk.view(), host_offsets, host_table);
    EXPECT_TRUE(test::matches("dq after RoPE backward", after_rope_backward[rank].dq, dq, rope_tolerance))
        << "rank " << rank;
    EXPECT_TRUE(test::matches("dk after RoPE backward", after_rope_backward[rank].dk, dk, rope_tolerance))
        << "rank " << rank;
  }
}

std::string param_name(const ::testing::TestParamInfo<RopeCpParam>& info) {
  return "cp" + std::to_string(std::get<0>(info.param)) + "_" +
         edge_cases()[static_cast<size_t>(std::get<1>(info.param))].name + "_" +
         kVariants[std::get<2>(info.param)].name;
}

// Edge cases 0 (empty and short documents, causal, GQA 4, bf16, d64), 2 (max_seqs - 1
// documents, full, GQA 8, bf16, d128) and 3 (a window wider than a chunk, fp16, d64).
INSTANTIATE_TEST_SUITE_P(EdgeCases, CudaRopeCp,
                         ::testing::Combine(::testing::Values(1, 2, 4), ::testing::Values(0, 2, 3),
                                            ::testing::Values(0, 1)),
                         param_name);

}  // namespace
}  // namespace thdcp
