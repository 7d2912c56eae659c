// AllGather CP on one GPU at every (D_qk, D_v) pair the CUDA backend serves (issue 27): cp
// ranks as threads sharing it through the shared-GPU device communicator. For a causal mask
// at cp 2 and a window wider than a chunk at cp 3 or 4, with GQA, bf16 and fp16, lengths 0, 1
// and not multiples of 2*cp, exactly max_seqs - 1 sequences: every rank's out, lse,
// max_logit, dq, dk, dv equal its rows of the single-device CPU reference. MLA (192, 128) with
// sinks: dsinks too, the same bits on every rank. An unsupported pair is refused when the CP
// plan is made, on every rank, naming its values and the supported set.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "support/cp/cuda_cp_cases.h"
#include "support/cp/cuda_cp_rank.h"
#include "support/cuda/head_dims.h"
#include "support/expect_error.h"
#include "support/gpu_tolerance.h"
#include "thdcp/comm_device/shared_gpu.h"

namespace thdcp::test {
namespace {

struct CpDimCase {
  std::string name;
  int cp;
  EdgeCase edge;
  bool sinks;
};

std::ostream& operator<<(std::ostream& os, const CpDimCase& c) { return os << c.name; }

// Every served pair: causal at cp 2 (GQA 4, bf16, empty and one-token documents, spare
// capacity) and a left window wider than a chunk at cp 3 or 4 (GQA 8, fp16, exactly
// max_seqs - 1 documents); and MLA with sinks at cp 4 (a two-sided window, GQA 2).
std::vector<CpDimCase> cp_dim_cases() {
  std::vector<CpDimCase> cases;
  int index = 0;
  for (const HeadDims& dims : served_head_dims()) {
    const int windowed_cp = index++ % 2 == 0 ? 3 : 4;
    const std::string label = head_dims_label(dims);
    cases.push_back({label + "_cp2_causal_gqa4_bf16", 2,
                     EdgeCase{"", {0, 1, 17, 37, 300, 2}, 2, Mask::causal(), 8, 2, dims.head_dim, DType::kBFloat16,
                              dims.v_head_dim},
                     false});
    cases.push_back({label + "_cp" + std::to_string(windowed_cp) + "_window100_0_wider_than_a_chunk_gqa8_fp16",
                     windowed_cp,
                     EdgeCase{"", {333, 21, 160, 5}, 0, Mask::window(100, 0), 8, 1, dims.head_dim, DType::kFloat16,
                              dims.v_head_dim},
                     false});
  }
  cases.push_back({"d192_v128_cp4_window64_16_gqa2_bf16_sinks", 4,
                   EdgeCase{"", {400, 250, 9, 1}, 1, Mask::window(64, 16), 4, 2, 192, DType::kBFloat16, 128}, true});
  return cases;
}

class CudaCpHeadDims : public CudaTest, public ::testing::WithParamInterface<CpDimCase> {};

TEST_P(CudaCpHeadDims, EveryRankMatchesTheSingleDeviceReference) {
  const CpDimCase& c = GetParam();
  const int cp = c.cp;
  const cp::Problem problem = problem_of(c.edge, cp);
  const Batch b = make_case_batch(c.edge, cp, problem.capacity, std::hash<std::string>{}(c.name) % 1000, false);
  const std::vector<float> sinks = c.sinks ? sink_logits(c.edge.q_heads) : std::vector<float>{};
  AttentionOptions reference_options;
  reference_options.num_threads = 8;
  std::vector<float> want_dsinks;
  const Outputs want = single_device(b, c.edge.mask, reference_options, sinks, want_dsinks);

  std::vector<Outputs> got(static_cast<size_t>(cp));
  std::vector<std::vector<float>> dsinks(static_cast<size_t>(cp));
  THDCP_CHECK_CUDA(cudaSetDevice(0));
  run_shared_gpu(cp, [&](DeviceCommunicator& comm) {
    const size_t rank = static_cast<size_t>(comm.rank());
    CudaCpRank state(comm, problem);
    DeviceBuffer device_sinks(sizeof(float) * sinks.size()), device_dsinks(device_sinks.bytes());
    state.load(b);
    if (c.sinks) {
      device_sinks.upload(sinks.data(), device_sinks.bytes(), state.stream());
      device_dsinks.poison(state.stream());
    }
    state.step(state.stream(), cp::KvSource::kGather, device_sinks.as<float>(), device_dsinks.as<float>());
    got[rank] = state.download();
    if (c.sinks) dsinks[rank] = download_vector<float>(device_dsinks, sinks.size());
  });

  for (int rank = 0; rank < cp; ++rank) {
    expect_matches_reference(got[static_cast<size_t>(rank)], want, b, cp, rank);
    EXPECT_TRUE(dsinks[static_cast<size_t>(rank)] == dsinks[0]) << "rank " << rank << "'s dsinks differ from rank 0's";
  }
  if (c.sinks) {
    EXPECT_TRUE(gpu_dsinks_match(dsinks[0], want_dsinks, want, b, sinks));
  }
}

INSTANTIATE_TEST_SUITE_P(Pairs, CudaCpHeadDims, ::testing::ValuesIn(cp_dim_cases()),
                         [](const ::testing::TestParamInfo<CpDimCase>& case_info) { return case_info.param.name; });

class CudaCpHeadDimChecks : public CudaTest {};

// An unsupported pair is refused when the CP plan is made, on every rank, naming its values
// and the supported set.
TEST_F(CudaCpHeadDimChecks, UnsupportedPairsAreRefusedWhenThePlanIsMadeOnEveryRank) {
  for (const HeadDims& dims : refused_head_dims()) {
    SCOPED_TRACE(head_dims_label(dims));
    const cp::Problem problem =
        cp_problem(2, Capacity{4, 128}, Shape{DType::kBFloat16, 4, 2, dims.head_dim, Mask::causal(), dims.v_head_dim});
    std::vector<std::string> messages(2);
    run_shared_gpu(2, [&](DeviceCommunicator& comm) {
      messages[static_cast<size_t>(comm.rank())] = error_of([&] {
        DeviceBuffer workspace(cp::cuda_workspace_size(problem));
        (void)cp::CudaPlan(comm, problem, AttentionOptions{}, workspace.data(), workspace.bytes());
      });
    });
    for (const std::string& message : messages) expect_names_head_dims(message, dims);
  }
}

}  // namespace
}  // namespace thdcp::test
