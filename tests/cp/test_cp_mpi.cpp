// AllGather CP over MPI: one rank per process, cp = the number of processes. Registered
// with ctest as `mpirun -np 2` and `mpirun -np 4`. Every rank builds the same batch,
// computes the single-device reference, and checks the rows it owns.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>
#include <tuple>

#include "support/cp_check.h"
#include "support/cp_halo_step.h"
#include "support/mpi_main.h"
#include "thdcp/comm/mpi.h"

namespace thdcp {
namespace {

Communicator& world() {
  static std::unique_ptr<Communicator> comm = mpi::world();
  return *comm;
}

class CpOverMpi : public ::testing::TestWithParam<std::tuple<Mask, int, DType>> {};

TEST_P(CpOverMpi, EqualsSingleDevice) {
  const auto [mask, ratio, dtype] = GetParam();
  Communicator& comm = world();
  const int cp = comm.size();
  Rng rng(static_cast<uint64_t>(cp * 7 + mask.window_left * 13 + mask.window_right * 5 + ratio));
  std::vector<int64_t> lengths = test::random_lengths(rng, 5, 300);
  for (int64_t extra : {int64_t{0}, int64_t{1}, int64_t{2 * cp + 1}, int64_t{900}}) lengths.push_back(extra);
  const test::Batch b = test::make_batch(make_layout(lengths, cp), dtype, 2 * ratio, 2, 16, rng.next());
  AttentionOptions options;
  options.num_threads = 1;
  const test::Outputs reference = test::single_device(b, mask, options);
  EXPECT_TRUE(test::check_cp_rank(comm, b, mask, reference, options));
}

INSTANTIATE_TEST_SUITE_P(Matrix, CpOverMpi,
                         ::testing::Combine(::testing::ValuesIn(test::all_test_masks()), ::testing::Values(1, 2, 4),
                                            ::testing::Values(DType::kBFloat16, DType::kFloat32)),
                         [](const ::testing::TestParamInfo<std::tuple<Mask, int, DType>>& param_info) {
                           return test::mask_label(std::get<0>(param_info.param)) + "_gqa" +
                                  std::to_string(std::get<1>(param_info.param)) + "_" +
                                  dtype_name(std::get<2>(param_info.param));
                         });

// The contiguous layout, all-to-all (MPI_Alltoall) and a2a+ag over MPI, with sinks: each against the
// single device.
TEST(CpModesOverMpi, EqualSingleDevice) {
  Communicator& comm = world();
  const int cp = comm.size();
  AttentionOptions options;
  options.num_threads = 1;
  for (CpLayout layout : {CpLayout::kDualChunk, CpLayout::kContiguous}) {
    for (cp::CpComm exchange : {cp::CpComm::kAllGather, cp::CpComm::kAllToAll, cp::CpComm::kA2aAg}) {
      SCOPED_TRACE(std::string(cp_layout_name(layout)) + " " + cp::cp_comm_name(exchange));
      const std::vector<int64_t> lengths = {37, 0, 1, 2 * static_cast<int64_t>(cp) + 1, 150};
      const BatchLayout batch_layout =
          layout == CpLayout::kDualChunk ? make_layout(lengths, cp) : make_contiguous_layout(lengths, cp);
      const test::Batch b = test::make_batch(batch_layout, DType::kFloat32, 4 * cp, cp, 16, 91);
      const std::vector<float> sinks(static_cast<size_t>(4 * cp), 0.5f);
      std::vector<float> reference_dsinks;
      const test::Outputs reference = test::single_device(b, Mask::window(40, 0), options, sinks, reference_dsinks);
      cp::Problem problem = test::cp_problem(cp, Capacity{batch_layout.num_seqs(), batch_layout.total_rows()},
                                             test::batch_shape(b, Mask::window(40, 0)));
      problem.layout = layout;
      problem.comm = exchange;
      // a2a+ag: all-to-all in pairs of ranks (MPI_Comm_split), AllGather across cp/2 pairs.
      if (exchange == cp::CpComm::kA2aAg) problem.a2a_size = 2;
      EXPECT_TRUE(test::check_cp_plan_rank(comm, b, problem, reference, options, sinks, reference_dsinks));
    }
  }
}

// The MPI communicator's all_to_all_v (blocks of any size, empty ones included) and its
// reduce_scatter_sum's rank order (the halo gathers' sums reproduce its bits).
TEST(MpiCommunicator, AllToAllVAndRankOrderSums) {
  Communicator& comm = world();
  const int size = comm.size(), r = comm.rank();
  auto count = [](int from, int to) { return static_cast<size_t>((from + 2 * to) % 3); };
  auto value = [](int from, int to, size_t i) { return static_cast<float>(100 * from + 10 * to) + static_cast<float>(i); };
  std::vector<size_t> send_bytes, recv_bytes;
  std::vector<float> outgoing, wanted;
  for (int peer = 0; peer < size; ++peer) {
    send_bytes.push_back(count(r, peer) * sizeof(float));
    recv_bytes.push_back(count(peer, r) * sizeof(float));
    for (size_t i = 0; i < count(r, peer); ++i) outgoing.push_back(value(r, peer, i));
    for (size_t i = 0; i < count(peer, r); ++i) wanted.push_back(value(peer, r, i));
  }
  std::vector<float> incoming(wanted.size() + 1, -1.0f);
  comm.all_to_all_v(outgoing.data(), send_bytes.data(), incoming.data(), recv_bytes.data());
  wanted.push_back(-1.0f);
  EXPECT_EQ(incoming, wanted);

  // Rank 0 sends 1e8, rank 1 -1e8, the others 1: in rank order ((0 + 1e8) - 1e8) + 1 + ... is
  // size - 2 exactly.
  const float mine = r == 0 ? 1e8f : (r == 1 ? -1e8f : 1.0f);
  const std::vector<float> blocks(static_cast<size_t>(size), mine);
  float sum = -1.0f;
  comm.reduce_scatter_sum(blocks.data(), &sum, 1);
  EXPECT_EQ(sum, static_cast<float>(size - 2));

  // Sizes that disagree throw on every rank.
  send_bytes.assign(static_cast<size_t>(size), 0);
  recv_bytes.assign(static_cast<size_t>(size), 0);
  if (r == size - 1) send_bytes[0] = 4;
  EXPECT_THDCP_ERROR(comm.all_to_all_v(outgoing.data(), send_bytes.data(), incoming.data(), recv_bytes.data()),
                     "all_to_all_v: rank " + std::to_string(size - 1) + " sends 4 bytes to rank 0 but rank 0 expects 0");
}

// Halo gathers over MPI (all_to_all_v, and the rank-order sums of the dK/dV it returns):
// every output the whole gather's bits, the bytes the plan's count, both layouts, with sinks.
TEST(HaloOverMpi, EqualsTheWholeGatherBitForBit) {
  Communicator& comm = world();
  const int cp = comm.size();
  for (CpLayout layout : {CpLayout::kDualChunk, CpLayout::kContiguous}) {
    SCOPED_TRACE(cp_layout_name(layout));
    const std::vector<int64_t> lengths = {37, 0, 1, 2 * static_cast<int64_t>(cp) + 1, 400};
    const BatchLayout batch_layout =
        layout == CpLayout::kDualChunk ? make_layout(lengths, cp) : make_contiguous_layout(lengths, cp);
    const test::Batch b = test::make_batch(batch_layout, DType::kBFloat16, 8, 2, 16, 92);
    const std::vector<float> sinks(8, 0.25f);
    cp::Problem problem = test::cp_problem(cp, Capacity{batch_layout.num_seqs(), batch_layout.total_rows()},
                                           test::batch_shape(b, Mask::window(30, 0)));
    problem.layout = layout;
    problem.kv_gather = cp::KvGather::kWhole;
    const test::RankStep whole = test::run_counted_step(comm, b, problem, sinks);
    problem.kv_gather = cp::KvGather::kHalo;
    const test::RankStep halo = test::run_counted_step(comm, b, problem, sinks);
    EXPECT_TRUE(test::all_written(halo.outputs));
    EXPECT_TRUE(test::identical(halo.outputs, whole.outputs));
    EXPECT_TRUE(test::same_bits(halo.dsinks, whole.dsinks));
    const size_t rank = static_cast<size_t>(comm.rank());
    EXPECT_EQ(halo.forward_bytes, halo.traffic.forward_bytes[rank]);
    EXPECT_EQ(halo.backward_bytes, halo.traffic.backward_bytes[rank]);
    EXPECT_EQ(whole.forward_bytes, whole.traffic.forward_bytes[rank]);
    EXPECT_LT(halo.forward_bytes, whole.forward_bytes);
  }
}

TEST(CpOverMpiErrors, OneBadRankMakesEveryRankThrow) {
  Communicator& comm = world();
  const BatchLayout layout = make_layout({10, 7}, comm.size());
  const int64_t rows = comm.rank() == comm.size() - 1 ? 3 : layout.total_rows() / comm.size();
  HostTensor t(DType::kBFloat16, rows, 1, 16), out(DType::kBFloat16, rows, 1, 16);
  std::vector<float> lse(static_cast<size_t>(rows));
  EXPECT_THDCP_ERROR(cp::forward(comm, layout.view(), Mask::causal(), t.view(), t.view(), t.view(), out.view(),
                                 lse.data(), nullptr),
                     "q is [3, 1, 16] but must be [T/cp=");
}

}  // namespace
}  // namespace thdcp

int main(int argc, char** argv) {
  thdcp::mpi::Session session(&argc, &argv);
  return thdcp::test::run_tests_on_every_rank(thdcp::world(), argc, argv);
}
