// AllGather CP on one GPU with attention sinks (issue 27): cp ranks as threads sharing it.
// Every rank's out, lse, max_logit, dq, dk, dv equal its rows of the single-device CPU
// reference with the same sinks, and dsinks (each rank's rows summed over the ranks in rank
// order) equals the reference's on every rank, the same bits on every rank and run.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "support/cp/cuda_cp_cases.h"
#include "support/cp/cuda_cp_rank.h"
#include "thdcp/comm_device/shared_gpu.h"
#include "thdcp/cpu/attention.h"
#include "thdcp/plan/segment_table.h"
#include "thdcp/testing/compare.h"

namespace thdcp {
namespace {

using test::EdgeCase;

// The single-device CPU reference of a batch with sinks: outputs and dsinks.
test::Outputs reference_with_sinks(const test::Batch& b, const Mask& mask, const std::vector<float>& sinks,
                                   std::vector<float>& dsinks) {
  const SegmentTable table = build_segment_table(b.layout.view(), mask);
  test::Outputs r = test::outputs_for(b, b.q.tokens(), b.q.dtype(), b.q.dtype());
  AttentionOptions options;
  options.num_threads = 8;
  cpu::attention_forward(table, ForwardTensors{b.q.view(), b.k.view(), b.v.view(), r.out.view(), r.lse.data(),
                                               r.max_logit.data(), sinks.data()},
                         options);
  BackwardTensors g{b.q.view(), b.k.view(), b.v.view(), r.out.view(), b.dout.view(), r.lse.data(),
                    r.dq.view(), r.dk.view(), r.dv.view()};
  g.sinks = sinks.data();
  dsinks.assign(sinks.size(), NAN);
  g.dsinks = dsinks.data();
  cpu::attention_backward(table, g, options);
  return r;
}

using SinkParam = std::tuple<int /*cp*/, int /*edge case index*/>;
class CudaCpSinks : public test::CudaTest, public ::testing::WithParamInterface<SinkParam> {};

TEST_P(CudaCpSinks, EveryRankMatchesTheReferenceAndAgreesOnDsinks) {
  const auto [cp, index] = GetParam();
  const EdgeCase& c = test::edge_cases()[static_cast<size_t>(index)];
  const cp::Problem problem = test::problem_of(c, cp);
  const test::Batch batch = test::make_case_batch(c, cp, problem.capacity, 3000 + index * 10 + cp, false);
  std::vector<float> sinks(static_cast<size_t>(c.q_heads));
  for (size_t h = 0; h < sinks.size(); ++h) sinks[h] = 0.75f * static_cast<float>(h % 5) - 1.0f;
  sinks[0] = 5.0f;  // above every score of head 0's rows
  std::vector<float> want_dsinks;
  const test::Outputs want = reference_with_sinks(batch, c.mask, sinks, want_dsinks);

  std::vector<test::Outputs> got(static_cast<size_t>(cp));
  std::vector<std::vector<float>> dsinks(static_cast<size_t>(cp)), again(static_cast<size_t>(cp));
  THDCP_CHECK_CUDA(cudaSetDevice(0));
  run_shared_gpu(cp, [&](DeviceCommunicator& comm) {
    const int rank = comm.rank();
    test::CudaCpRank state(comm, problem);
    test::DeviceBuffer device_sinks(sizeof(float) * sinks.size()), device_dsinks(sizeof(float) * sinks.size());
    device_sinks.upload(sinks.data(), device_sinks.bytes());
    for (std::vector<float>* out : {&dsinks[rank], &again[rank]}) {
      state.load(batch);
      device_dsinks.poison();
      ForwardTensors f = state.forward_tensors();
      f.sinks = device_sinks.as<float>();
      state.plan().forward(state.layout(), f, state.stream());
      BackwardTensors b = state.backward_tensors();
      b.sinks = device_sinks.as<float>();
      b.dsinks = device_dsinks.as<float>();
      state.plan().backward(state.layout(), b, state.stream());
      THDCP_CHECK_CUDA(cudaStreamSynchronize(state.stream()));
      *out = test::download_vector<float>(device_dsinks, sinks.size());
    }
    got[rank] = state.download();
  });

  EXPECT_TRUE(test::matches("dsinks", dsinks[0], want_dsinks,
                            sink_gradient_tolerance(want.out, batch.dout, want.lse, sinks, want_dsinks)));
  for (int rank = 0; rank < cp; ++rank) {
    test::expect_matches_reference(got[static_cast<size_t>(rank)], want, batch, cp, rank);
    EXPECT_TRUE(dsinks[static_cast<size_t>(rank)] == dsinks[0]) << "rank " << rank << "'s dsinks differ from rank 0's";
    EXPECT_TRUE(again[static_cast<size_t>(rank)] == dsinks[static_cast<size_t>(rank)]) << "second run, rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(EdgeCases, CudaCpSinks, ::testing::Combine(::testing::Values(2, 3), ::testing::Values(0, 3, 5)),
                         [](const ::testing::TestParamInfo<SinkParam>& case_info) {
                           return "cp" + std::to_string(std::get<0>(case_info.param)) + "_" +
                                  test::edge_cases()[static_cast<size_t>(std::get<1>(case_info.param))].name;
                         });

}  // namespace
}  // namespace thdcp
