// The GraphBank at the head dims the CUDA backend gained in issue 27 (96, 256 and MLA's
// (192, 128)), 2 ranks sharing one GPU: a CP forward and backward warmed up, captured on one
// packing and replayed on others of the same capacity (one document filling it, max_seqs - 1
// documents, empty and one-token documents, random ones) equals the eager step on each
// packing bit for bit, and the CPU reference.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/cuda/head_dims.h"
#include "support/graph/bank_rank.h"
#include "thdcp/comm_device/shared_gpu.h"

namespace thdcp::test {
namespace {

struct BankCase {
  HeadDims dims;
  DType dtype;
  Mask mask;
};

std::ostream& operator<<(std::ostream& os, const BankCase& c) {
  return os << head_dims_label(c.dims) << "_" << dtype_name(c.dtype) << "_" << mask_label(c.mask);
}

class GraphHeadDims : public CudaTest, public ::testing::WithParamInterface<BankCase> {};

TEST_P(GraphHeadDims, PackingsReplayedFromOneGraphEqualEagerAndTheReference) {
  const BankCase& c = GetParam();
  const int cp = 2;
  const Shape s{c.dtype, 4, 1, c.dims.head_dim, c.mask, c.dims.v_head_dim};  // GQA 4
  const Capacity capacity = default_capacity(512, cp);
  const Packings p = make_packings(cp, capacity, s, 6);
  std::vector<How> how;
  run_shared_gpu(cp, [&](DeviceCommunicator& comm) {
    GraphBank bank(comm);
    bank.add_capacity(capacity);
    const std::vector<How> ran = run_packings(comm, bank, capacity, p.lengths, p.batches, s);
    if (comm.rank() == 0) how = ran;
  });
  const std::vector<How> expected = {How::kWarmUp,   How::kCaptured, How::kReplayed,
                                     How::kReplayed, How::kReplayed, How::kReplayed};
  ASSERT_EQ(how.size(), expected.size());
  for (size_t i = 0; i < how.size(); ++i) EXPECT_EQ(how[i], expected[i]) << "packing " << i;
}

INSTANTIATE_TEST_SUITE_P(Pairs, GraphHeadDims,
                         ::testing::Values(BankCase{{96, 0}, DType::kBFloat16, Mask::causal()},
                                           BankCase{{192, 128}, DType::kFloat16, Mask::window(100, 0)},
                                           BankCase{{256, 0}, DType::kBFloat16, Mask::window(64, 16)}),
                         [](const ::testing::TestParamInfo<BankCase>& case_info) {
                           return ::testing::PrintToString(case_info.param);
                         });

}  // namespace
}  // namespace thdcp::test
