// AllGather CP through the C ABI (libthdcp.so) on a GPU (label gpu; SKIPPED with the reason
// where no CUDA device is visible): a shared-GPU group of cp = 2 ranks on threads runs the CP
// step; its rows, merged with thdcp_cp_merge, equal the single-device C ABI attention within
// the GPU tolerances of tests/cp.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "support/capi/capi_cuda.h"
#include "support/gpu_tolerance.h"
#include "thdcp/thdcp.h"

namespace thdcp::test {
namespace {

struct CpCase {
  const char* name;
  Shape shape;
};
void PrintTo(const CpCase& c, std::ostream* os) { *os << c.name; }

class CApiCudaSharedGpu : public CApiCudaTest, public ::testing::WithParamInterface<CpCase> {};

TEST_P(CApiCudaSharedGpu, TwoRanksOnThreadsEqualSingleDeviceAttention) {
  const Shape& s = GetParam().shape;
  const int cp = 2;
  const Batch b = varlen_batch(s, 31 + static_cast<uint64_t>(s.q_heads + s.head_dim));
  const Outputs reference = c_single_device(b, s);

  std::vector<thdcp_communicator_t> comms(cp, nullptr);
  ASSERT_C_OK(thdcp_communicator_create_shared_gpu_group(cp, 0, comms.data()));
  for (int r = 0; r < cp; ++r) {
    int rank = -1, device = -1;
    const char* kind = nullptr;
    EXPECT_C_OK(thdcp_communicator_rank(comms[static_cast<size_t>(r)], &rank));
    EXPECT_C_OK(thdcp_communicator_device(comms[static_cast<size_t>(r)], &device));
    EXPECT_C_OK(thdcp_communicator_kind(comms[static_cast<size_t>(r)], &kind));
    EXPECT_EQ(rank, r);
    EXPECT_EQ(device, 0);
    EXPECT_STREQ(kind, "shared-gpu");
  }
  std::vector<Outputs> local(static_cast<size_t>(cp));
  run_ranks(comms, [&](thdcp_communicator_t comm, int rank) {
    local[static_cast<size_t>(rank)] = c_cp_rank(comm, b, s);
  });
  for (thdcp_communicator_t comm : comms) EXPECT_C_OK(thdcp_communicator_destroy(comm));

  expect_gpu_close(c_merge_ranks(local, b), reference, s.dtype);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CApiCudaSharedGpu,
    ::testing::Values(CpCase{"causal_gqa2_bf16_d64", Shape{DType::kBFloat16, 4, 2, 64, Mask::causal()}},
                      CpCase{"window_mqa_fp16_d128", Shape{DType::kFloat16, 8, 1, 128, Mask::window(64, 32)}},
                      CpCase{"full_bf16_d128", Shape{DType::kBFloat16, 4, 4, 128, Mask::full()}}),
    [](const ::testing::TestParamInfo<CpCase>& param_info) { return std::string(param_info.param.name); });

// The other CP communications through the C ABI, dual-chunk layout: all_to_all at cp 2 and
// a2a+ag at cp 4 (all-to-all groups of 2, AllGather across 2), each rank's rows merged and
// compared with the single-device C ABI attention.
struct CommCase {
  const char* name;
  int cp;
  thdcp_cp_comm_t comm;
  int a2a_size;
};
void PrintTo(const CommCase& c, std::ostream* os) { *os << c.name; }

class CApiCudaCpComms : public CApiCudaTest, public ::testing::WithParamInterface<CommCase> {};

TEST_P(CApiCudaCpComms, RanksOnThreadsEqualSingleDeviceAttention) {
  const CommCase& c = GetParam();
  const Shape s{DType::kBFloat16, 8, 4, 128, Mask::window(96, 0)};
  // varlen_batch's documents, padded to 2*cp for this cp.
  const Batch b = make_batch(make_layout({301, 0, 1, 37, 513, 64, 90}, c.cp, kVarlenCapacity), s, 57);
  const Outputs reference = c_single_device(b, s);
  std::vector<thdcp_communicator_t> comms(static_cast<size_t>(c.cp), nullptr);
  ASSERT_C_OK(thdcp_communicator_create_shared_gpu_group(c.cp, 0, comms.data()));
  std::vector<Outputs> local(static_cast<size_t>(c.cp));
  run_ranks(comms, [&](thdcp_communicator_t comm, int rank) {
    local[static_cast<size_t>(rank)] = c_cp_rank(comm, b, s, [&](thdcp_cp_params& p) {
      p.cp_comm = c.comm;
      p.a2a_size = c.a2a_size;
    });
  });
  for (thdcp_communicator_t comm : comms) EXPECT_C_OK(thdcp_communicator_destroy(comm));
  expect_gpu_close(c_merge_ranks(local, b), reference, s.dtype);
}

INSTANTIATE_TEST_SUITE_P(Comms, CApiCudaCpComms,
                         ::testing::Values(CommCase{"all_to_all_cp2", 2, THDCP_CP_COMM_ALL_TO_ALL, 0},
                                           CommCase{"a2a_ag_cp4_groups_of_2", 4, THDCP_CP_COMM_A2A_AG, 2}),
                         [](const ::testing::TestParamInfo<CommCase>& param_info) {
                           return std::string(param_info.param.name);
                         });

// thdcp_cp_params::backward_kv_from_forward: the backward on the forward's K/V (1) and on the
// choice of THDCP_CP_BACKWARD_KV_AUTO (2) give the bits of gathering them again (0), for each
// communication, on a shared-GPU group of cp = 2 (all-to-all keeps its head-sharded tensors).
TEST_F(CApiCudaTest, BackwardKvFromForwardAndAutoEqualGatherBitForBit) {
  const Shape s{DType::kBFloat16, 8, 4, 128, Mask::causal()};
  const int cp = 2;
  const Batch b = varlen_batch(s, 71);
  for (const thdcp_cp_comm_t comm_kind : {THDCP_CP_COMM_ALL_GATHER, THDCP_CP_COMM_ALL_TO_ALL}) {
    std::vector<std::vector<Outputs>> by(3, std::vector<Outputs>(static_cast<size_t>(cp)));
    for (int kv = THDCP_CP_BACKWARD_KV_GATHER; kv <= THDCP_CP_BACKWARD_KV_AUTO; ++kv) {
      std::vector<thdcp_communicator_t> comms(static_cast<size_t>(cp), nullptr);
      ASSERT_C_OK(thdcp_communicator_create_shared_gpu_group(cp, 0, comms.data()));
      run_ranks(comms, [&](thdcp_communicator_t comm, int rank) {
        by[static_cast<size_t>(kv)][static_cast<size_t>(rank)] = c_cp_rank(comm, b, s, [&](thdcp_cp_params& p) {
          p.cp_comm = comm_kind;
          p.backward_kv_from_forward = kv;
        });
      });
      for (thdcp_communicator_t comm : comms) EXPECT_C_OK(thdcp_communicator_destroy(comm));
    }
    for (int rank = 0; rank < cp; ++rank) {
      for (int kv : {THDCP_CP_BACKWARD_KV_FROM_FORWARD, THDCP_CP_BACKWARD_KV_AUTO}) {
        EXPECT_TRUE(identical(by[static_cast<size_t>(kv)][static_cast<size_t>(rank)], by[0][static_cast<size_t>(rank)]))
            << "cp_comm " << comm_kind << ", backward_kv_from_forward " << kv << ", rank " << rank;
      }
    }
  }
}

}  // namespace
}  // namespace thdcp::test
