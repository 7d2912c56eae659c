// Test support of the graph tests: a rank's static tensors, CP plans per capacity and the
// step a GraphBank captures (BankRank), batches of a capacity, and 20 packings of one.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "support/cp/cuda_cp_cases.h"
#include "support/cp/cuda_cp_rank.h"
#include "support/cuda/device_step.h"
#include "support/shape.h"
#include "thdcp/comm_device/nccl.h"
#include "thdcp/graph/cp_groups.h"
#include "thdcp/graph/graph_bank.h"

namespace thdcp::test {

using graph::GraphBank;
using graph::StaticBatch;
using How = GraphBank::How;

// One rank's static tensors (sized for the largest capacity, viewed per capacity), its CP
// plans per capacity (workspaces from the bank), and the step the bank captures.
// The CP communication of a bank's plans.
struct CpMode {
  cp::CpComm comm = cp::CpComm::kAllGather;
  int a2a_size = 1;  // a2a+ag's all-to-all group
};

class BankRank {
 public:
  // `arena`: the plans' workspaces from it (reserved here for the bank's capacities and their
  // fallback capacities: add them first), else one per capacity from the bank.
  BankRank(DeviceCommunicator& comm, GraphBank& bank, int64_t max_tokens, const Shape& s, const CpMode& mode = {},
           graph::WorkspaceArena* arena = nullptr);
  ~BankRank();

  cudaStream_t stream() const { return stream_; }

  // The communicator's warm-up on this rank's stream (before the first capture).
  void warm_up() { comm_.warm_up(stream_); }

  // The step the bank runs, captures and replays: this rank's CP forward and backward on the
  // static tensors, at the capacity of the batch the bank gives.
  graph::Work work();

  // This rank's part of `b` (documents `lengths`) through `bank`: its outputs, of the rows of
  // the capacity the step ran at; `outcome` (if given) says how it ran.
  Outputs banked(GraphBank& bank, const Batch& b, const std::vector<int64_t>& lengths,
                 GraphBank::Outcome* outcome = nullptr);

  // The same step eagerly at `capacity`, on metadata of its own (not the bank's), for
  // comparison.
  Outputs eager(const Batch& b, const std::vector<int64_t>& lengths, const Capacity& capacity);

  // The problem of this rank's plan at capacity `c`.
  cp::Problem problem_at(const Capacity& c) const;

 private:
  // This rank's part of a batch into the static tensors; outputs poisoned.
  void load(const Batch& b);
  void run_eager(const std::vector<int64_t>& lengths, const Capacity& capacity);
  Outputs download(int64_t rows);
  cp::CudaPlan& plan(const Capacity& c);

  DeviceCommunicator& comm_;
  GraphBank& bank_;
  Shape s_;
  CpMode mode_;
  graph::WorkspaceArena* arena_;
  DeviceStep tensors_;
  cudaStream_t stream_ = nullptr;
  std::map<Capacity, std::unique_ptr<cp::CudaPlan>> plans_;
  std::map<Capacity, std::unique_ptr<StaticBatch>> eager_;
};

// One rank of dynamic CP over `world`: its group of every size in `sizes` (graph::CpGroups,
// whose banks capture side by side, thread-locally), each group's bank with the default
// capacity of `max_tokens` rows, and this rank's BankRank in each group.
class DynamicCpRank {
 public:
  DynamicCpRank(DeviceCommunicator& world, const std::vector<int>& sizes, int64_t max_tokens, const Shape& s);
  ~DynamicCpRank();

  // Whether this rank has a group of size `c` (not when c does not divide the world and the
  // rank is past its last group), which one, and its rank there.
  bool has_group(int c) { return groups_->has_group(c); }
  int group_index(int c) { return groups_->group_index(c); }
  int group_rank(int c) { return groups_->group(c).rank(); }

  // BankRank::banked and BankRank::eager in this rank's group of size `c`.
  Outputs banked(int c, const Batch& b, const std::vector<int64_t>& lengths, GraphBank::Outcome* outcome);
  Outputs eager(int c, const Batch& b, const std::vector<int64_t>& lengths);

  // The workspace arena every size's plans share, and the workspace one plan of size c needs.
  const graph::WorkspaceArena& arena() const { return groups_->arena(); }
  size_t workspace_bytes(int c) const;

 private:
  int64_t max_tokens_;
  cudaStream_t setup_ = nullptr;
  std::unique_ptr<graph::CpGroups> groups_;
  std::map<int, std::unique_ptr<BankRank>> ranks_;
};

// A batch of `lengths` in the capacity form of `layout`.
Batch batch_of(const std::vector<int64_t>& lengths, int cp, const Capacity& capacity, const Shape& s, uint64_t seed,
               CpLayout layout = CpLayout::kDualChunk);

// 20 packings of one capacity: one document filling it, max_seqs - 1 documents filling it
// exactly, zero-length documents, a single token, and random ones (half of them using
// exactly max_tokens rows). (A rank whose every query sees one key has dQ exactly 0 in the
// reference and ~1e-6 on the GPU, the fp32 rounding of dP - D, which no tolerance relative
// to max|ref| = 0 admits; so the max_seqs - 1 documents have 2*cp tokens, not 1, and the
// one-token document comes with another.)
std::vector<std::vector<int64_t>> packings(int cp, const Capacity& c, uint64_t seed,
                                           CpLayout layout = CpLayout::kDualChunk);

// Every packing of `capacity` through `bank`, each compared with the eager step and the
// reference (under the bank's CP layout, the plans' communication `mode`); returns how each
// ran.
std::vector<graph::GraphBank::How> run_packings(DeviceCommunicator& comm, graph::GraphBank& bank,
                                                const Capacity& capacity,
                                                const std::vector<std::vector<int64_t>>& lengths,
                                                const std::vector<Batch>& batches, const Shape& s,
                                                const CpMode& mode = {});

// GPU tests of the bank over NCCL: skipped with the reason without NCCL; gpus_ GPUs visible.
class GraphNcclTest : public CudaTest {
 protected:
  void SetUp() override;
  int gpus_ = 0;
};

struct Packings {
  std::vector<std::vector<int64_t>> lengths;
  std::vector<Batch> batches;
};

Packings make_packings(int cp, const Capacity& capacity, const Shape& s, size_t count);

}  // namespace thdcp::test
