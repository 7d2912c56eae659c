// AllGather CP on one GPU: cp ranks as threads sharing it through the shared-GPU device
// communicator. On the edge-case table, under both layouts (dual chunk, contiguous), every rank's out, lse, max_logit, dq, dk, dv equal
// the single-device CPU reference (GPU tolerances); the whole step of every rank, captured
// into one CUDA graph (global capture mode) and replayed on a new batch of the same
// capacity, equals the eager step on that batch bit for bit. Local tensors as strided views
// (head-major, packed, padded, interleaved) equal contiguous ones bit for bit. Faults: a
// failing rank and disagreeing plans make every rank throw.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "support/cp/cuda_cp_cases.h"
#include "support/comm/collective_step.h"
#include "support/cp/cuda_cp_rank.h"
#include "support/cuda/placed_group.h"
#include "support/expect_error.h"
#include "support/gpu_tolerance.h"
#include "thdcp/comm_device/shared_gpu.h"

namespace thdcp {
namespace {

using test::EdgeCase;
using test::capacity_of;
using test::edge_cases;
using test::expect_matches_reference;
using test::make_case_batch;
using test::problem_of;

using EdgeParam = std::tuple<CpLayout, int /*cp*/, int /*edge case index*/>;

class CudaCpSharedGpu : public test::CudaTest, public ::testing::WithParamInterface<EdgeParam> {};

// Edge case `index` at `cp` ranks sharing GPU 0 (test::expect_group_case).
void expect_shared_gpu_case(CpLayout layout, cp::CpComm cp_comm, int cp, int index,
                            cp::KvGather gather = cp::KvGather::kAuto, int a2a_size = 1) {
  test::expect_group_case(layout, cp_comm, cp, index, gather, a2a_size);
}

TEST_P(CudaCpSharedGpu, EagerMatchesReferenceAndGraphReplayMatchesEager) {
  const auto [layout, cp, index] = GetParam();
  expect_shared_gpu_case(layout, cp::CpComm::kAllGather, cp, index);
}

// All-to-all (Ulysses) CP: the same table with kv_heads = cp (the case's GQA ratio kept).
class CudaCpAllToAllSharedGpu : public test::CudaTest, public ::testing::WithParamInterface<EdgeParam> {};

TEST_P(CudaCpAllToAllSharedGpu, EagerMatchesReferenceAndGraphReplayMatchesEager) {
  const auto [layout, cp, index] = GetParam();
  expect_shared_gpu_case(layout, cp::CpComm::kAllToAll, cp, index);
}

// Head slices (Problem::head_slices): all_to_all's (each slice's exchange beside the
// attention of another, on the plan's second stream) and all_gather's (the forward's gather of
// each slice beside the attention of the one before): the edge-case table against the
// reference, with one graph replayed against eager; and every rank's outputs the bits of one
// slice's, with the backward's inputs moved again or kept from the forward.
// (layout, (cp, n), edge case index): n is head_slices here, a2a_size for CudaCpA2aAgSharedGpu.
using SizedParam = std::tuple<CpLayout, std::pair<int, int>, int>;
using SlicesParam = SizedParam;

void expect_slices_case(cp::CpComm cp_comm, CpLayout layout, int cp, int slices, int index) {
  test::expect_group_case(layout, cp_comm, cp, index, cp::KvGather::kAuto, 1, {}, DType::kFloat32, slices);
  const EdgeCase c = test::heads_for(edge_cases()[static_cast<size_t>(index)], cp, cp_comm, 1, slices);
  const cp::Problem one = problem_of(c, cp, layout, cp_comm);
  cp::Problem sliced = one;
  sliced.head_slices = slices;
  const test::Batch b = make_case_batch(c, cp, one.capacity, 900 + index + cp, false, layout);
  std::vector<test::Outputs> whole(cp), by_slices(cp), kept(cp);
  run_shared_gpu(cp, [&](DeviceCommunicator& comm) {
    whole[comm.rank()] = test::CudaCpRank(comm, one).run(b);
    test::CudaCpRank state(comm, sliced);
    by_slices[comm.rank()] = state.run(b);
    kept[comm.rank()] = state.run(b, cp::KvSource::kFromForward);
  });
  for (int rank = 0; rank < cp; ++rank) {
    EXPECT_TRUE(test::identical(by_slices[rank], whole[rank])) << "rank " << rank;
    EXPECT_TRUE(test::identical(kept[rank], whole[rank])) << "rank " << rank << ", kept";
  }
}

class CudaCpHeadSlices : public test::CudaTest, public ::testing::WithParamInterface<SlicesParam> {};

TEST_P(CudaCpHeadSlices, MatchReferenceReplayAndEqualOneSliceBitForBit) {
  const auto [layout, sizes, index] = GetParam();
  expect_slices_case(cp::CpComm::kAllToAll, layout, sizes.first, sizes.second, index);
}

class CudaCpAllGatherHeadSlices : public CudaCpHeadSlices {};

TEST_P(CudaCpAllGatherHeadSlices, MatchReferenceReplayAndEqualOneSliceBitForBit) {
  const auto [layout, sizes, index] = GetParam();
  expect_slices_case(cp::CpComm::kAllGather, layout, sizes.first, sizes.second, index);
}

// "<layout>cp<cp>_<what><n>_<edge case>": the name of a (layout, (cp, n), edge case) case.
std::string sized_case_name(const SizedParam& param, const char* what) {
  const std::pair<int, int> sizes = std::get<1>(param);
  return test::layout_prefix(std::get<0>(param)) + "cp" + std::to_string(sizes.first) + what +
         std::to_string(sizes.second) + "_" + edge_cases()[static_cast<size_t>(std::get<2>(param))].name;
}

std::string slices_name(const ::testing::TestParamInfo<SlicesParam>& info) {
  return sized_case_name(info.param, "_slices");
}

INSTANTIATE_TEST_SUITE_P(EdgeCases, CudaCpHeadSlices,
                         ::testing::Combine(::testing::Values(CpLayout::kDualChunk, CpLayout::kContiguous),
                                            ::testing::Values(std::make_pair(2, 2), std::make_pair(2, 4),
                                                              std::make_pair(4, 2)),
                                            ::testing::Range(0, 6)),
                         slices_name);

INSTANTIATE_TEST_SUITE_P(EdgeCases, CudaCpAllGatherHeadSlices,
                         ::testing::Combine(::testing::Values(CpLayout::kDualChunk, CpLayout::kContiguous),
                                            ::testing::Values(std::make_pair(2, 2), std::make_pair(3, 4)),
                                            ::testing::Range(0, 6)),
                         slices_name);

// a2a+ag CP: an all-to-all in groups of a2a_size ranks, AllGather CP across the groups
// (kv_heads = a2a_size, the case's GQA ratio kept). (cp, a2a_size): 2 x 1 and 2 x 2 (one
// group of each kind: a one-rank exchange, a one-rank AllGather), 4 x 2, 6 x 3 and 8 x 4.
using A2aAgParam = SizedParam;  // (layout, (cp, a2a_size), edge case index)

class CudaCpA2aAgSharedGpu : public test::CudaTest, public ::testing::WithParamInterface<A2aAgParam> {};

TEST_P(CudaCpA2aAgSharedGpu, EagerMatchesReferenceAndGraphReplayMatchesEager) {
  const auto [layout, sizes, index] = GetParam();
  expect_shared_gpu_case(layout, cp::CpComm::kA2aAg, sizes.first, index, cp::KvGather::kAuto, sizes.second);
}

// a2a+ag with groups of one rank is all_gather over the same ranks: the all-to-all is a copy
// and the AllGather plan across the groups is all_gather's, so the forward (out, lse,
// max_logit) and dq (written by that plan in the problem's dtype, then moved) have its bits.
// (dk and dv reach the ranks' dtype by another rounding path, the exchange's cast of the
// fp32 sums, and are held to the reference by the test above.)
class CudaCpA2aAgOneRankGroups : public test::CudaTest {};

TEST_F(CudaCpA2aAgOneRankGroups, ForwardEqualsAllGatherBitForBit) {
  for (const CpLayout layout : {CpLayout::kDualChunk, CpLayout::kContiguous}) {
    for (const int cp : {2, 4}) {
      const int index = 4;  // window on both sides, GQA 1
      const EdgeCase c = test::heads_for(edge_cases()[static_cast<size_t>(index)], cp, cp::CpComm::kA2aAg, 1);
      const cp::Problem hybrid = problem_of(c, cp, layout, cp::CpComm::kA2aAg, 1);
      const cp::Problem plain = problem_of(c, cp, layout, cp::CpComm::kAllGather);
      const test::Batch b = make_case_batch(c, cp, hybrid.capacity, 5000 + cp, false, layout);
      std::vector<test::Outputs> by_hybrid(cp), by_plain(cp);
      run_shared_gpu(cp, [&](DeviceCommunicator& comm) {
        by_hybrid[comm.rank()] = test::CudaCpRank(comm, hybrid).run(b);
        by_plain[comm.rank()] = test::CudaCpRank(comm, plain).run(b);
      });
      for (int rank = 0; rank < cp; ++rank) {
        SCOPED_TRACE(std::string(cp_layout_name(layout)) + " cp " + std::to_string(cp) + " rank " +
                     std::to_string(rank));
        EXPECT_TRUE(test::same_bits(by_hybrid[rank].out, by_plain[rank].out));
        EXPECT_TRUE(test::same_bits(by_hybrid[rank].lse, by_plain[rank].lse));
        EXPECT_TRUE(test::same_bits(by_hybrid[rank].max_logit, by_plain[rank].max_logit));
        EXPECT_TRUE(test::same_bits(by_hybrid[rank].dq, by_plain[rank].dq));
        expect_matches_reference(by_hybrid[rank], b, c.mask, cp, rank, layout);
      }
    }
  }
}

// The halo gather (kv_gather halo: the contiguous layout, each rank's rows with the window's
// edges from its neighbours) on the windowed edge cases: against the reference with graph
// replay, and out, lse, max_logit and dq the same bits as the whole gather's (the attention
// reads the same keys, in the same tiles); auto runs the halo where left + right is below a
// rank's rows (else the whole gather), every output the bits of the one it takes. A window
// wider than a rank's rows is refused at plan time on every rank.
using HaloParam = std::tuple<int /*cp*/, int /*edge case index*/>;

class CudaCpHaloSharedGpu : public test::CudaTest, public ::testing::WithParamInterface<HaloParam> {};

TEST_P(CudaCpHaloSharedGpu, MatchesReferenceReplaysAndEqualsTheWholeGathersForward) {
  const auto [cp, index] = GetParam();
  const EdgeCase& c = edge_cases()[static_cast<size_t>(index)];
  cp::Problem halo = problem_of(c, cp, CpLayout::kContiguous);
  halo.kv_gather = cp::KvGather::kHalo;
  if (c.mask.window_left > halo.local_rows() || c.mask.window_right > halo.local_rows()) {
    run_shared_gpu(cp, [&](DeviceCommunicator& comm) {
      EXPECT_THDCP_ERROR(test::CudaCpRank(comm, halo), "the CUDA halo gather takes its edges from the neighbouring");
    });
    return;
  }
  expect_shared_gpu_case(CpLayout::kContiguous, cp::CpComm::kAllGather, cp, index, cp::KvGather::kHalo);
  cp::Problem whole = halo, automatic = halo;
  whole.kv_gather = cp::KvGather::kWhole;
  automatic.kv_gather = cp::KvGather::kAuto;
  // auto takes the halo where the window's rows on both sides are fewer than a rank's.
  const bool auto_halo = c.mask.window_left + c.mask.window_right < halo.local_rows();
  const test::Batch b = make_case_batch(c, cp, halo.capacity, 4000 + index * 10 + cp, false, CpLayout::kContiguous);
  std::vector<test::Outputs> by_halo(cp), by_whole(cp), by_auto(cp);
  std::vector<cp::KvGather> gathers(static_cast<size_t>(3 * cp));
  run_shared_gpu(cp, [&](DeviceCommunicator& comm) {
    const size_t r = static_cast<size_t>(comm.rank());
    test::CudaCpRank halo_rank(comm, halo), whole_rank(comm, whole), auto_rank(comm, automatic);
    by_halo[r] = halo_rank.run(b);
    by_whole[r] = whole_rank.run(b);
    by_auto[r] = auto_rank.run(b);
    gathers[3 * r] = halo_rank.plan().kv_gather();
    gathers[3 * r + 1] = whole_rank.plan().kv_gather();
    gathers[3 * r + 2] = auto_rank.plan().kv_gather();
  });
  for (int rank = 0; rank < cp; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_TRUE(test::same_bits(by_halo[rank].out, by_whole[rank].out));
    EXPECT_TRUE(test::same_bits(by_halo[rank].dq, by_whole[rank].dq));
    EXPECT_TRUE(test::same_bits(by_halo[rank].lse, by_whole[rank].lse));
    EXPECT_TRUE(test::same_bits(by_halo[rank].max_logit, by_whole[rank].max_logit));
    const size_t r = static_cast<size_t>(rank);
    EXPECT_EQ(gathers[3 * r], cp::KvGather::kHalo);
    EXPECT_EQ(gathers[3 * r + 1], cp::KvGather::kWhole);
    EXPECT_EQ(gathers[3 * r + 2], auto_halo ? cp::KvGather::kHalo : cp::KvGather::kWhole);
    EXPECT_TRUE(test::identical(by_auto[rank], auto_halo ? by_halo[rank] : by_whole[rank]))
        << "auto against the gather it takes";
  }
}

INSTANTIATE_TEST_SUITE_P(WindowCases, CudaCpHaloSharedGpu,
                         ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Values(3, 4, 5)),
                         [](const ::testing::TestParamInfo<HaloParam>& param_info) {
                           return "cp" + std::to_string(std::get<0>(param_info.param)) + "_" +
                                  edge_cases()[static_cast<size_t>(std::get<1>(param_info.param))].name;
                         });

std::string edge_name(const ::testing::TestParamInfo<EdgeParam>& info) {
  return test::layout_prefix(std::get<0>(info.param)) + "cp" + std::to_string(std::get<1>(info.param)) + "_" +
         edge_cases()[static_cast<size_t>(std::get<2>(info.param))].name;
}

// Both layouts: dual chunk (the default) and contiguous (no reorder of the gathered K/V).
INSTANTIATE_TEST_SUITE_P(EdgeCases, CudaCpSharedGpu,
                         ::testing::Combine(::testing::Values(CpLayout::kDualChunk, CpLayout::kContiguous),
                                            ::testing::Values(1, 2, 3, 4, 8), ::testing::Range(0, 6)),
                         edge_name);

INSTANTIATE_TEST_SUITE_P(EdgeCases, CudaCpAllToAllSharedGpu,
                         ::testing::Combine(::testing::Values(CpLayout::kDualChunk, CpLayout::kContiguous),
                                            ::testing::Values(1, 2, 3, 4), ::testing::Range(0, 6)),
                         edge_name);

std::string a2a_ag_name(const ::testing::TestParamInfo<A2aAgParam>& info) {
  return sized_case_name(info.param, "_a2a");
}

INSTANTIATE_TEST_SUITE_P(EdgeCases, CudaCpA2aAgSharedGpu,
                         ::testing::Combine(::testing::Values(CpLayout::kDualChunk, CpLayout::kContiguous),
                                            ::testing::Values(std::make_pair(2, 1), std::make_pair(2, 2),
                                                              std::make_pair(4, 2), std::make_pair(6, 3),
                                                              std::make_pair(8, 4)),
                                            ::testing::Range(0, 6)),
                         a2a_ag_name);

class CudaCpKeptKv : public test::CudaTest {};

// The backward on what the forward left in the workspace equals the one that moves it again,
// bit for bit: all_gather's K/V in sequence order (dual chunk: the reordered copy;
// contiguous: the gathered rows); all_to_all's and a2a+ag's head-sharded q, k, v, out and lse
// (a2a+ag: and its AllGather's K/V across the groups).
TEST_F(CudaCpKeptKv, BackwardOnForwardKvEqualsRegather) {
  struct Comm {
    cp::CpComm comm;
    int cp, a2a_size;
  };
  for (const CpLayout layout : {CpLayout::kDualChunk, CpLayout::kContiguous}) {
    for (const Comm m : {Comm{cp::CpComm::kAllGather, 2, 1}, Comm{cp::CpComm::kAllGather, 3, 1},
                         Comm{cp::CpComm::kAllToAll, 2, 1}, Comm{cp::CpComm::kAllToAll, 4, 1},
                         Comm{cp::CpComm::kA2aAg, 4, 2}}) {
      for (int index : {0, 3}) {
        const int cp = m.cp;
        const EdgeCase c = test::heads_for(edge_cases()[static_cast<size_t>(index)], cp, m.comm, m.a2a_size);
        const cp::Problem problem = problem_of(c, cp, layout, m.comm, m.a2a_size);
        const test::Batch b = make_case_batch(c, cp, problem.capacity, 300 + index + cp, false, layout);
        std::vector<test::Outputs> regathered(cp), kept(cp);
        run_shared_gpu(cp, [&](DeviceCommunicator& comm) {
          test::CudaCpRank state(comm, problem);
          regathered[comm.rank()] = state.run(b);
          kept[comm.rank()] = state.run(b, cp::KvSource::kFromForward);
        });
        for (int rank = 0; rank < cp; ++rank) {
          EXPECT_TRUE(test::identical(kept[rank], regathered[rank]))
              << cp_layout_name(layout) << " " << cp::cp_comm_name(m.comm) << " " << c.name << " cp " << cp
              << " rank " << rank;
        }
      }
    }
  }
}

// KvSource::kAuto takes the forward's K/V exactly when the plan's last forward was this
// step's: forward, then k overwritten in place (the same pointers), then the backward on
// kAuto gives the bits of kFromForward, and those differ from kGather's on the overwritten k
// (so the choice is seen, not assumed). With another forward on the same plan in between
// (another layer's tensors, as a stack's forwards run before its backwards) kAuto gathers
// again and gives the bits of a plain step.
class CudaCpKvAuto : public test::CudaTest {};

TEST_F(CudaCpKvAuto, ReusesTheForwardOnlyRightAfterIt) {
  for (const CpLayout layout : {CpLayout::kDualChunk, CpLayout::kContiguous}) {
    for (const cp::CpComm comm_kind : {cp::CpComm::kAllGather, cp::CpComm::kAllToAll}) {
      const int cp = 2;
      const EdgeCase c = test::heads_for(edge_cases()[3], cp, comm_kind, 1);
      const cp::Problem problem = problem_of(c, cp, layout, comm_kind, 1);
      const test::Batch b = make_case_batch(c, cp, problem.capacity, 410, false, layout);
      const test::Batch other = make_case_batch(c, cp, problem.capacity, 411, false, layout);
      std::vector<test::Outputs> plain(cp), kept(cp), automatic(cp), regathered(cp), interleaved(cp);
      run_shared_gpu(cp, [&](DeviceCommunicator& comm) {
        const int rank = comm.rank();
        test::CudaCpRank state(comm, problem);
        cp::CudaPlan& plan = state.plan();
        const cudaStream_t stream = state.stream();
        const size_t k_bytes = static_cast<size_t>(state.k().numel()) * dtype_size(problem.dtype);
        // Forward on b, k overwritten, backward with `kv`.
        const auto forward_then_overwritten_k = [&](cp::KvSource kv) {
          state.load(b);
          plan.forward(state.layout(), state.forward_tensors(), stream);
          THDCP_CHECK_CUDA(cudaMemsetAsync(state.k().data, 0x3c, k_bytes, stream));
          plan.backward(state.layout(), state.backward_tensors(), stream, kv);
          return state.download();
        };
        plain[rank] = state.run(b);
        kept[rank] = forward_then_overwritten_k(cp::KvSource::kFromForward);
        automatic[rank] = forward_then_overwritten_k(cp::KvSource::kAuto);
        regathered[rank] = forward_then_overwritten_k(cp::KvSource::kGather);
        // Another forward on the same plan (other tensors, other data) between b's forward and
        // its backward on kAuto.
        test::DeviceStep second(problem.dtype, problem.local_rows(), problem.local_rows(), problem.heads(),
                                problem.dtype);
        const LayoutView view = other.layout.view();
        second.upload_inputs(test::local_part(other.q, view, cp, rank, layout),
                             test::local_part(other.k, view, cp, rank, layout),
                             test::local_part(other.v, view, cp, rank, layout),
                             test::local_part(other.dout, view, cp, rank, layout));
        state.load(b);
        THDCP_CHECK_CUDA(cudaDeviceSynchronize());  // second's uploads ran on the legacy stream
        plan.forward(state.layout(), state.forward_tensors(), stream);
        plan.forward(state.layout(), second.forward_tensors(), stream);
        plan.backward(state.layout(), state.backward_tensors(), stream, cp::KvSource::kAuto);
        interleaved[rank] = state.download();
      });
      for (int rank = 0; rank < cp; ++rank) {
        const std::string what = std::string(cp_layout_name(layout)) + " " + cp::cp_comm_name(comm_kind) + " rank " +
                                 std::to_string(rank);
        EXPECT_TRUE(test::identical(automatic[rank], kept[rank])) << what << ": kAuto did not take the forward's";
        EXPECT_FALSE(test::identical(regathered[rank], kept[rank])) << what << ": the overwritten k changed nothing";
        // dk and dv of the interleaved step are b's own (the first forward's out and lse
        // are b's, the second forward wrote only its own outputs).
        EXPECT_TRUE(test::identical(interleaved[rank], plain[rank])) << what << ": kAuto reused another forward";
      }
    }
  }
}

// CudaPlan's timeline: one overlapped forward + backward recorded per stream gives spans in
// order on each stream (start <= end, none overlapping the next on its stream), the gather
// and the reduce-scatter on the collectives stream and the attention on the step's, within
// the step; and recording changes nothing: the outputs equal a step without it, bit for bit.
class CudaCpTimeline : public test::CudaTest {};

TEST_F(CudaCpTimeline, SpansPerStreamAndTheSameBits) {
  for (const CpLayout layout : {CpLayout::kDualChunk, CpLayout::kContiguous}) {
    const int cp = 2;
    const EdgeCase c = test::heads_for(edge_cases()[3], cp, cp::CpComm::kAllGather, 1);
    const cp::Problem problem = problem_of(c, cp, layout, cp::CpComm::kAllGather, 1);
    const test::Batch b = make_case_batch(c, cp, problem.capacity, 420, false, layout);
    std::vector<test::Outputs> plain(cp), recorded(cp);
    std::vector<std::vector<cp::TimelineSpan>> spans(cp);
    run_shared_gpu(cp, [&](DeviceCommunicator& comm) {
      const int rank = comm.rank();
      test::CudaCpRank state(comm, problem);
      plain[rank] = state.run(b);
      state.plan().enable_timeline();
      recorded[rank] = state.run(b);
      spans[rank] = state.plan().timeline();
      state.plan().disable_timeline();
      EXPECT_TRUE(state.plan().timeline().empty());
    });
    for (int rank = 0; rank < cp; ++rank) {
      const std::string what = std::string(cp_layout_name(layout)) + " rank " + std::to_string(rank);
      EXPECT_TRUE(test::identical(recorded[rank], plain[rank])) << what;
      ASSERT_FALSE(spans[rank].empty()) << what;
      bool gather = false, reduce = false, attention = false;
      double last_end[2] = {0, 0};
      for (const cp::TimelineSpan& s : spans[rank]) {
        EXPECT_LE(0.0, s.start_ms) << what;
        EXPECT_LE(s.start_ms, s.end_ms) << what;
        EXPECT_LE(last_end[s.collectives], s.start_ms + 1e-3) << what << ": spans overlap on one stream";
        last_end[s.collectives] = s.end_ms;
        gather |= s.collectives && s.phase == cp::Phase::kGather;
        reduce |= s.collectives && s.phase == cp::Phase::kReduce;
        attention |= !s.collectives && s.phase == cp::Phase::kAttention;
      }
      EXPECT_TRUE(gather && reduce && attention) << what << ": gather " << gather << ", reduce " << reduce
                                                 << ", attention " << attention;
    }
  }
}

// One step of this rank on strided views of its local tensors (q, k, v in one device buffer
// and dout in another, arranged as `in`; out in one and dq, dk, dv in another, as `out`),
// with a plan of its own: the outputs read back through the views, and in `kept` whether
// nothing was written between the output views or into the inputs.
test::Outputs strided_step(DeviceCommunicator& comm, const cp::Problem& problem, const test::Batch& b,
                           test::Arrangement in, test::Arrangement out, ::testing::AssertionResult& kept) {
  const LayoutView layout = b.layout.view();
  const int cp = comm.size(), rank = comm.rank();
  const HostTensor q = test::local_part(b.q, layout, cp, rank), k = test::local_part(b.k, layout, cp, rank),
                   v = test::local_part(b.v, layout, cp, rank), dout = test::local_part(b.dout, layout, cp, rank);
  const DType dtype = problem.dtype;
  const int64_t rows = problem.local_rows(), hq = problem.q_heads, hkv = problem.kv_heads, d = problem.head_dim;
  test::PlacedGroup qkv(in, dtype, rows, {hq, hkv, hkv}, d), dout_s(in, dtype, rows, {hq}, d);
  test::PlacedGroup out_s(out, dtype, rows, {hq}, d), grads(out, dtype, rows, {hq, hkv, hkv}, d);
  test::scatter_into(q, qkv.host(0));
  test::scatter_into(k, qkv.host(1));
  test::scatter_into(v, qkv.host(2));
  test::scatter_into(dout, dout_s.host(0));
  const std::vector<unsigned char> inputs_before = qkv.image;
  for (test::PlacedGroup* g : {&qkv, &dout_s, &out_s, &grads}) g->upload();
  test::DeviceBuffer cu(sizeof(int32_t) * b.layout.cu_seqlens.size()), cup(cu.bytes());
  cu.upload(b.layout.cu_seqlens.data(), cu.bytes());
  cup.upload(b.layout.cu_seqlens_padded.data(), cup.bytes());
  test::DeviceBuffer lse(sizeof(float) * hq * rows), max_logit(sizeof(float) * hq);
  lse.poison();
  max_logit.poison();
  test::DeviceBuffer workspace(cp::cuda_workspace_size(problem));
  cp::CudaPlan plan(comm, problem, AttentionOptions{}, workspace.data(), workspace.bytes());
  const DeviceLayout device_layout{cu.as<int32_t>(), cup.as<int32_t>(), problem.capacity};
  const ForwardTensors forward{qkv.on_device(0), qkv.on_device(1), qkv.on_device(2), out_s.on_device(0),
                               lse.as<float>(), max_logit.as<float>()};
  const BackwardTensors backward{qkv.on_device(0), qkv.on_device(1), qkv.on_device(2), out_s.on_device(0),
                                 dout_s.on_device(0), lse.as<float>(), grads.on_device(0), grads.on_device(1),
                                 grads.on_device(2)};
  plan.check_tensors(device_layout, &forward, &backward);
  THDCP_CHECK_CUDA(cudaDeviceSynchronize());  // the uploads and poison ran on the legacy stream
  test::Stream stream;
  plan.forward(device_layout, forward, stream.get());
  plan.backward(device_layout, backward, stream.get());
  comm.synchronize(stream.get(), 120);
  THDCP_CHECK_CUDA(cudaDeviceSynchronize());
  for (test::PlacedGroup* g : {&qkv, &out_s, &grads}) g->download();
  test::Outputs o;
  o.out = test::gather_from(out_s.host(0));
  o.dq = test::gather_from(grads.host(0));
  o.dk = test::gather_from(grads.host(1));
  o.dv = test::gather_from(grads.host(2));
  o.lse = test::download_vector<float>(lse, static_cast<size_t>(hq * rows));
  o.max_logit = test::download_vector<float>(max_logit, static_cast<size_t>(hq));
  kept = test::poison_kept_outside(out_s.image, out_s.host_views());
  if (kept) kept = test::poison_kept_outside(grads.image, grads.host_views());
  if (kept && qkv.image != inputs_before) kept = ::testing::AssertionFailure() << "a step wrote into q, k or v";
  return o;
}

using StrideParam = std::tuple<test::Arrangement /*inputs*/, test::Arrangement /*outputs*/>;

class CudaCpStrides : public test::CudaTest, public ::testing::WithParamInterface<StrideParam> {};

// Every rank's local tensors as strided views (head-major K/V gathered through the pack
// kernel, packed QKV through the 2-D copy, dk and dv cast through their strides, q, out,
// dout and dq straight to the kernels) give the bits of the same step on contiguous local
// tensors, at cp 1, 2 and 3 with ranks sharing the GPU: GQA 4 bf16 d64 causal, and MHA bf16
// d128 with a two-sided window.
TEST_P(CudaCpStrides, LocalViewsEqualContiguousLocalTensorsBitForBit) {
  const auto [in, out] = GetParam();
  for (int cp : {1, 2, 3}) {
    for (int index : {0, 4}) {
      const EdgeCase& c = edge_cases()[static_cast<size_t>(index)];
      SCOPED_TRACE(std::string(c.name) + " cp " + std::to_string(cp));
      const cp::Problem problem = problem_of(c, cp);
      const test::Batch b = make_case_batch(c, cp, problem.capacity, 700 + index + cp, false);
      std::vector<test::Outputs> contiguous(cp), strided(cp);
      std::vector<::testing::AssertionResult> kept(static_cast<size_t>(cp), ::testing::AssertionSuccess());
      run_shared_gpu(cp, [&](DeviceCommunicator& comm) {
        const int rank = comm.rank();
        test::CudaCpRank state(comm, problem);
        contiguous[rank] = state.run(b);
        strided[rank] = strided_step(comm, problem, b, in, out, kept[static_cast<size_t>(rank)]);
      });
      for (int rank = 0; rank < cp; ++rank) {
        EXPECT_TRUE(test::identical(strided[rank], contiguous[rank])) << "rank " << rank;
        EXPECT_TRUE(kept[static_cast<size_t>(rank)]) << "rank " << rank;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Arrangements, CudaCpStrides,
                         ::testing::Values(StrideParam{test::Arrangement::kHeadMajor, test::Arrangement::kContiguous},
                                           StrideParam{test::Arrangement::kHeadMajor, test::Arrangement::kHeadMajor},
                                           StrideParam{test::Arrangement::kPacked, test::Arrangement::kPadded},
                                           StrideParam{test::Arrangement::kInterleaved,
                                                       test::Arrangement::kInterleaved}),
                         [](const ::testing::TestParamInfo<StrideParam>& param_info) {
                           return std::string("inputs_") + test::arrangement_name(std::get<0>(param_info.param)) +
                                  "_outputs_" + test::arrangement_name(std::get<1>(param_info.param));
                         });

// Runs `body` on 2 ranks sharing the GPU and expects a thdcp::Error (run_shared_gpu rethrows
// a rank's); returns what each rank threw ("" where a rank threw nothing).
std::vector<std::string> errors_of_two_ranks(const std::function<void(DeviceCommunicator&)>& body) {
  std::vector<std::string> messages(2);
  EXPECT_THROW(run_shared_gpu(2,
                              [&](DeviceCommunicator& comm) {
                                try {
                                  body(comm);
                                } catch (const Error& e) {
                                  messages[comm.rank()] = e.what();
                                  throw;
                                }
                              }),
               Error);
  return messages;
}

// Two ranks plan `base` (cp = 2) with problems that `change` makes differ: both throw, and
// each message has `expected`.
void expect_disagreement_refused(const cp::Problem& base, const std::function<void(cp::Problem&, int)>& change,
                                 const std::string& expected) {
  const std::vector<std::string> messages = errors_of_two_ranks([&](DeviceCommunicator& comm) {
    cp::Problem mine = base;
    change(mine, comm.rank());
    test::CudaCpRank state(comm, mine);
  });
  for (int r = 0; r < 2; ++r) EXPECT_NE(messages[r].find(expected), std::string::npos) << messages[r];
}

// After an eager step of `state` on batch `b`: captures a step and replays it on the batch
// loaded again (outputs to `replayed`), then runs one in program order, which a plan with
// phase timing does on one stream (outputs to `timed`).
void replay_and_run_in_order(DeviceCommunicator& comm, test::CudaCpRank& state, const test::Batch& b,
                             test::Outputs& replayed, test::Outputs& timed) {
  comm.begin_capture(state.stream());
  state.step(state.stream());
  cudaGraph_t graph = comm.end_capture(state.stream());
  cudaGraphExec_t exec = nullptr;
  if (graph) THDCP_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  state.load(b);
  comm.launch(exec, state.stream());
  comm.synchronize(state.stream(), 60);
  replayed = state.download();
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  state.plan().enable_phase_timing();
  timed = state.run(b);
}

class CudaCpOrder : public test::CudaTest {};

// The overlapped step (collectives on the plan's second stream), the same step captured
// (each rank's stream into the group's graph) and replayed, and the step a plan with phase
// timing runs in program order on one stream all give the same bits.
TEST_F(CudaCpOrder, ReplayAndProgramOrderGiveTheOverlappedBits) {
  for (int cp : {1, 2, 4}) {
    for (int index : {0, 1, 4}) {
      const EdgeCase& c = edge_cases()[static_cast<size_t>(index)];
      SCOPED_TRACE(std::string(c.name) + " cp " + std::to_string(cp));
      const cp::Problem problem = problem_of(c, cp);
      const test::Batch b = make_case_batch(c, cp, problem.capacity, 500 + index + cp, false);
      std::vector<test::Outputs> overlapped(cp), timed(cp), replayed(cp);
      run_shared_gpu(cp, [&](DeviceCommunicator& comm) {
        const int rank = comm.rank();
        test::CudaCpRank state(comm, problem);
        overlapped[rank] = state.run(b);
        replay_and_run_in_order(comm, state, b, replayed[rank], timed[rank]);
      });
      for (int rank = 0; rank < cp; ++rank) {
        expect_matches_reference(overlapped[rank], b, c.mask, cp, rank);
        EXPECT_TRUE(test::identical(replayed[rank], overlapped[rank])) << "replayed, rank " << rank;
        EXPECT_TRUE(test::identical(timed[rank], overlapped[rank])) << "program order, rank " << rank;
      }
    }
  }
}

// The shared-GPU communicator's collectives, all_to_all included, give exact values at 3
// ranks (the rules of support/comm/collective_step.h, as the NCCL tests check them).
class SharedGpuCollectives : public test::CudaTest {};

TEST_F(SharedGpuCollectives, EveryCollectiveGivesExactValues) {
  // all_reduce_max reduces through the group's scratch: room for the largest size's floats.
  SharedGpuOptions options;
  for (const test::CollectiveSizes& sizes : test::collective_sizes()) {
    options.reduce_scratch_bytes = std::max(options.reduce_scratch_bytes, sizes.count * sizeof(float));
  }
  run_shared_gpu(
      3,
      [&](DeviceCommunicator& comm) {
        test::Stream stream;
        test::expect_exact_collectives(comm, stream.get());
        test::expect_reduce_scatter16(comm, stream.get(), /*rank_order=*/true);
      },
      options);
}

// Problem::reduce_dtype on the GPU (ranks sharing it): dK/dV partial sums crossing ranks in
// the problem's dtype. Against the reference, dk and dv within the tolerance thdcp/cp/cp.h
// derives; out, lse, max_logit and dq the bits of the fp32 reduce-scatter's run; dk or dv
// not those bits everywhere (the option acts); one graph of the step replayed equals eager.
using ReduceParam = std::tuple<CpLayout, int /*cp*/, int /*edge case index*/>;

class CudaCpReduceDtype : public test::CudaTest, public ::testing::WithParamInterface<ReduceParam> {};

TEST_P(CudaCpReduceDtype, GradientsWithinTheDerivedToleranceAndTheRestUnchanged) {
  const auto [layout, cp, index] = GetParam();
  const EdgeCase& c = edge_cases()[static_cast<size_t>(index)];
  cp::Problem exact = problem_of(c, cp, layout);
  exact.kv_gather = cp::KvGather::kWhole;
  cp::Problem rounded = exact;
  rounded.reduce_dtype = c.dtype;
  const test::Batch b = make_case_batch(c, cp, exact.capacity, 6000 + index * 10 + cp, false, layout);
  const test::Outputs reference = test::single_device(b, c.mask, AttentionOptions{});
  std::vector<test::Outputs> by_fp32(cp), by_dtype(cp), replayed(cp);
  run_shared_gpu(cp, [&](DeviceCommunicator& comm) {
    const size_t r = static_cast<size_t>(comm.rank());
    by_fp32[r] = test::CudaCpRank(comm, exact).run(b);
    by_dtype[r] = test::CudaCpRank(comm, rounded).run(b);
  });
  const bool differs = test::expect_reduced_gradients(by_dtype, by_fp32, reference, b, layout,
                                                      test::gpu_reduced_grad_tolerance(c.dtype, cp));
  EXPECT_TRUE(differs) << "reduce_dtype=" << dtype_name(c.dtype) << " gave the fp32 reduce-scatter's bits everywhere";
  // Two batches against the reference, and one graph of every rank's step replayed on the
  // second equal to its eager step, bit for bit.
  test::expect_group_case(layout, cp::CpComm::kAllGather, cp, index, cp::KvGather::kWhole, 1, {}, c.dtype);
}

INSTANTIATE_TEST_SUITE_P(EdgeCases, CudaCpReduceDtype,
                         ::testing::Combine(::testing::Values(CpLayout::kDualChunk, CpLayout::kContiguous),
                                            ::testing::Values(2, 4), ::testing::Values(0, 2, 3)),
                         edge_name);

class CudaCpFaults : public test::CudaTest {};

cp::Problem small_problem(int cp) {
  return test::cp_problem(cp, Capacity{4, 64 * cp}, test::Shape{DType::kBFloat16, 4, 2, 64, Mask::causal()});
}

// A rank that fails before a collective: the others are released with thdcp::Error well
// within the group's timeout, and run_shared_gpu rethrows the failing rank's own error.
TEST_F(CudaCpFaults, RankFailingBeforeACollectiveReleasesEveryRank) {
  const int cp = 4;
  std::vector<std::string> messages(cp);
  const auto start = std::chrono::steady_clock::now();
  SharedGpuOptions options;
  options.timeout_seconds = 60;
  EXPECT_THDCP_ERROR(run_shared_gpu(
                         cp,
                         [&](DeviceCommunicator& comm) {
                           test::CudaCpRank state(comm, small_problem(cp));
                           try {
                             if (comm.rank() == 2) throw Error("rank 2 lost its input");
                             state.step(state.stream());
                           } catch (const Error& e) {
                             messages[comm.rank()] = e.what();
                             throw;
                           }
                         },
                         options),
                     "rank 2 lost its input");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 30.0);
  for (int r = 0; r < cp; ++r) {
    if (r == 2) continue;
    EXPECT_NE(messages[r].find("rank 2 failed (rank 2 lost its input)"), std::string::npos) << messages[r];
  }
}

// A rank that never arrives and never fails: the timeout releases the others.
TEST_F(CudaCpFaults, SilentRankTimesOut) {
  SharedGpuOptions options;
  options.timeout_seconds = 2;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> messages(2);
  EXPECT_THROW(run_shared_gpu(
                   2,
                   [&](DeviceCommunicator& comm) {
                     test::DeviceBuffer send(256), recv(512);
                     cudaStream_t stream;
                     THDCP_CHECK_CUDA(cudaStreamCreate(&stream));
                     if (comm.rank() == 0) {
                       try {
                         comm.all_gather(send.data(), recv.data(), 256, stream);
                       } catch (const Error& e) {
                         messages[0] = e.what();
                       }
                     }
                     cudaStreamDestroy(stream);
                     if (comm.rank() == 0) throw Error(messages[0]);
                   },
                   options),
               Error);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 10.0);
  EXPECT_NE(messages[0].find("waited 2 s in all_gather for ranks that never called it: 1"), std::string::npos)
      << messages[0];
}

// Plans whose ranks disagree are refused on every rank, naming the disagreement.
TEST_F(CudaCpFaults, DisagreeingPlansAreRefusedOnEveryRank) {
  struct Variant {
    const char* expected;
    void (*change)(cp::Problem&);
  };
  const Variant variants[] = {
      {"rank 1 passed capacity (max_seqs=5, max_tokens=128) but rank 0 passed (4, 128)",
       [](cp::Problem& p) { p.capacity.max_seqs = 5; }},
      {"rank 1 passed mask (-1,-1) but rank 0 passed (-1,0)", [](cp::Problem& p) { p.mask = Mask::full(); }},
      {"rank 1 passed heads 8:2 head_dim 64 but rank 0 passed 4:2 head_dim 64", [](cp::Problem& p) { p.q_heads = 8; }},
      {"rank 1 passed dtype fp16 but rank 0 passed bf16", [](cp::Problem& p) { p.dtype = DType::kFloat16; }},
  };
  for (const Variant& variant : variants) {
    expect_disagreement_refused(
        small_problem(2), [&](cp::Problem& p, int rank) { if (rank == 1) variant.change(p); }, variant.expected);
  }
}

// Bad input is refused at plan time on every rank, before anything runs.
TEST_F(CudaCpFaults, BadPlanArgumentsAreRefusedOnEveryRank) {
  // A communicator of the wrong size.
  EXPECT_THDCP_ERROR(run_shared_gpu(2,
                                    [&](DeviceCommunicator& comm) {
                                      cp::Problem p = small_problem(4);
                                      test::CudaCpRank state(comm, p);
                                    }),
                     "problem.cp=4 but the communicator has 2 ranks");
  // A workspace in host memory, on one rank only: both ranks throw.
  const std::vector<std::string> messages = errors_of_two_ranks([&](DeviceCommunicator& comm) {
    const cp::Problem p = small_problem(2);
    const size_t bytes = cp::cuda_workspace_size(p);
    std::vector<unsigned char> host(bytes);
    test::DeviceBuffer device(bytes);
    cp::CudaPlan plan(comm, p, AttentionOptions{}, comm.rank() == 1 ? static_cast<void*>(host.data()) : device.data(),
                      bytes);
  });
  EXPECT_NE(messages[1].find("workspace"), std::string::npos) << messages[1];
  EXPECT_NE(messages[0].find("rank 1: "), std::string::npos) << messages[0];
  // a2a+ag whose all-to-all groups cannot share the K/V heads: refused by the plan on every
  // rank, naming the sizes that would do.
  const std::vector<std::string> refused = errors_of_two_ranks([&](DeviceCommunicator& comm) {
    cp::Problem p = small_problem(2);
    p.comm = cp::CpComm::kA2aAg;
    p.a2a_size = 2;
    const size_t bytes = cp::cuda_workspace_size(p);
    p.kv_heads = 1;
    test::DeviceBuffer device(bytes);
    cp::CudaPlan plan(comm, p, AttentionOptions{}, device.data(), bytes);
  });
  for (const std::string& message : refused) {
    EXPECT_NE(message.find("a2a+ag with kv_heads=1 and a2a_size=2: kv_heads must be a multiple of a2a_size"),
              std::string::npos)
        << message;
  }
}

// Head slices that do not divide a rank's heads, or with a communication other than
// all_to_all, are refused at plan time on every rank, naming the values that would do.
TEST_F(CudaCpFaults, BadHeadSlicesAreRefusedOnEveryRank) {
  struct Bad {
    cp::CpComm comm;
    int slices;
    const char* says;
  };
  for (const Bad& bad : {Bad{cp::CpComm::kAllToAll, 3,
                             "head_slices=3 with q_heads/cp=2 and kv_heads/cp=1 heads per rank: each slice takes as "
                             "many of both; use one of 1"},
                         Bad{cp::CpComm::kA2aAg, 2,
                             "head_slices=2 with comm=a2a+ag: slices are all_to_all's and all_gather's"}}) {
    const std::vector<std::string> messages = errors_of_two_ranks([&](DeviceCommunicator& comm) {
      cp::Problem p = small_problem(2);
      p.comm = bad.comm;
      p.head_slices = bad.slices;
      const size_t bytes = 1 << 20;  // never reached: the plan refuses first
      test::DeviceBuffer device(bytes);
      cp::CudaPlan plan(comm, p, AttentionOptions{}, device.data(), bytes);
    });
    for (const std::string& message : messages) EXPECT_NE(message.find(bad.says), std::string::npos) << message;
  }
}

// Tensors in host memory (or on another device) are refused at plan time, on every rank.
TEST_F(CudaCpFaults, HostTensorsAreRefusedAtPlanTimeOnEveryRank) {
  const std::vector<std::string> messages = errors_of_two_ranks([&](DeviceCommunicator& comm) {
    test::CudaCpRank state(comm, small_problem(2));
    ForwardTensors forward = state.forward_tensors();
    std::vector<unsigned char> host(static_cast<size_t>(forward.q.numel()) * 2);
    if (comm.rank() == 1) forward.q.data = host.data();
    state.plan().check_tensors(state.layout(), &forward, nullptr);
  });
  EXPECT_NE(messages[1].find("q points to unregistered host memory"), std::string::npos) << messages[1];
  EXPECT_NE(messages[0].find("rank 1: "), std::string::npos) << messages[0];
}

// An fp32 dq is refused before anything is enqueued where the CUDA plan writes dq in the
// problem's dtype (all_gather, a2a+ag), naming the dtype and the alternatives.
TEST_F(CudaCpFaults, Fp32DqIsRefusedOutsideAllToAll) {
  for (const cp::CpComm comm_kind : {cp::CpComm::kAllGather, cp::CpComm::kA2aAg}) {
    const std::vector<std::string> messages = errors_of_two_ranks([&](DeviceCommunicator& comm) {
      cp::Problem p = small_problem(2);
      p.comm = comm_kind;
      if (comm_kind == cp::CpComm::kA2aAg) p.a2a_size = 2;
      test::CudaCpRank state(comm, p);
      BackwardTensors backward = state.backward_tensors();
      test::DeviceBuffer dq(static_cast<size_t>(backward.dq.numel()) * sizeof(float));
      backward.dq = ThdTensor(dq.data(), DType::kFloat32, backward.dq.tokens, backward.dq.heads, backward.dq.head_dim);
      state.plan().check_tensors(state.layout(), nullptr, &backward);
    });
    for (const std::string& message : messages) {
      EXPECT_NE(message.find("dq has dtype fp32 but the CUDA " + std::string(cp::cp_comm_name(comm_kind)) +
                             " CP writes dq in bf16"),
                std::string::npos)
          << message;
    }
  }
}

}  // namespace
}  // namespace thdcp
