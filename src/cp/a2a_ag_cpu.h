// a2a+ag CP on the CPU backend (Problem::comm == CpComm::kA2aAg): an all-to-all inside groups
// of a2a_size consecutive ranks, AllGather CP across the groups (TransformerEngine's
// "a2a+p2p" with an AllGather in place of the ring).
//
// Ranks: cp = a2a_size * ag_size. Rank r is member m = r % a2a_size of group g = r / a2a_size;
// group g holds the ranks [g a2a_size, (g+1) a2a_size). The all-to-all group of r is its
// group; its AllGather group is the ag_size ranks of the same member index m (ranked by g).
//
// Rows: every rank holds the layout's rows at cp (dual_chunk or contiguous, like the other
// modes). A group's ranks together hold exactly the rows of rank g of the same layout at
// ag_size: dual_chunk at cp gives rank r the chunks r and 2cp-1-r of P_b/(2cp) rows, so group
// g holds the fine chunks [g a, (g+1) a) and [2cp-(g+1) a, 2cp-g a), which are the chunks g and
// 2 ag_size-1-g of P_b/(2 ag_size) rows; contiguous pieces r of T/cp rows join into piece g of
// T/ag_size rows the same way.
//
// Forward on rank (g, m): the group's all-to-all turns its rows of every head into the
// group's rows (rank g's at ag_size, in that rank's local order) of the heads
// [m H/a2a_size, (m+1) H/a2a_size) (q, k and v: so q_heads and kv_heads are multiples of
// a2a_size); an AllGather CP plan of ag_size ranks over the AllGather group (the problem's
// layout, mask, capacity and kv_gather, with those heads) gives out, lse and max_logit of
// them; the reverse all-to-all returns out and lse to the rank's rows, and an all-gather over
// the group assembles max_logit in head order. Backward: q, k, v, out, dout and lse go the
// same way, the AllGather plan gives dq and the reduce-scattered dk, dv in fp32, and the
// reverse all-to-all returns them, rounded once; d(sink) of each head comes from its member's
// AllGather plan (summed over the groups in rank order), all-gathered over the group.
//
// a2a_size 1 is the AllGather CP of cp ranks and a2a_size cp the all-to-all CP, with the same
// arithmetic in the same order: each gives the bits of that mode (tests/cp/test_cp_a2a_ag.cpp).
#pragma once

#include <memory>
#include <vector>

#include "alltoall_cpu.h"
#include "thdcp/comm/communicator.h"
#include "thdcp/cp/cp.h"

namespace thdcp::cp::detail {

// One rank's a2a+ag: its two groups and the AllGather plan across the groups. Made by the
// CpuPlan once the problem is agreed (collective over `comm`).
class A2aAgCpu {
 public:
  A2aAgCpu(Communicator& comm, const Problem& problem, const AttentionOptions& options);

  // One step on this rank; the plan has checked the problem, the layout and the tensors.
  void forward(const LayoutView& layout, const ForwardTensors& tensors, Timings* timings);
  void backward(const LayoutView& layout, const BackwardTensors& tensors, Timings* timings);

  // The K/V bytes the AllGather across the groups moves, by rank (cp entries).
  KvTraffic kv_traffic(const LayoutView& layout) const;

 private:
  // The exchange of this rank's group for `layout`.
  HeadExchange exchange(const LayoutView& layout);

  Problem problem_;
  int group_ = 0, member_ = 0;
  std::unique_ptr<Communicator> a2a_, ag_;
  std::unique_ptr<CpuPlan> across_;  // AllGather CP of ag_size ranks, heads / a2a_size
  AllToAllBuffers buffers_;
};

}  // namespace thdcp::cp::detail
