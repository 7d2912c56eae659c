// Dynamic CP (DESIGN.md section 7): the world is split once into groups for every supported
// CP size; each batch is given a size (thdcp::choose_cp_size, or the caller's choice), and
// with world W and size c the floor(W/c) groups of c consecutive ranks run as many
// micro-batches side by side. A size need not divide W (3 in a world of 4, 2 in a world of 3):
// the last W mod c ranks then have no group of that size and sit its steps out. Each size has
// its own communicator, GraphBank, static buffers and graphs, so one size's replay never
// touches another's buffers. The plans' workspaces are the exception, by design: one arena
// (arena()) serves every size and capacity of this rank, since only one of its steps runs
// at a time, so the rank holds the largest workspace, not the sum.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "thdcp/comm_device/device_communicator.h"
#include "thdcp/graph/graph_bank.h"
#include "thdcp/graph/workspace_arena.h"

namespace thdcp::graph {

class CpGroups {
 public:
  // Collective over `world` (every rank, same sizes): for each size c (1 <= c <= world.size()),
  // world rank w < floor(W/c) c joins group w / c as rank w % c, with a GraphBank over it; the
  // other ranks join none. Not capture-safe (split may allocate and connect; each group is
  // warmed up on `stream`).
  CpGroups(DeviceCommunicator& world, const std::vector<int>& sizes, cudaStream_t stream,
           const BankOptions& options = {});
  ~CpGroups();

  const std::vector<int>& sizes() const { return sizes_; }
  int world_size() const { return world_size_; }
  bool has_group(int cp) const;             // this rank takes part in steps of size cp
  DeviceCommunicator& group(int cp) const;  // this rank's group of size cp (throws without one)
  GraphBank& bank(int cp) const;            // its bank
  int group_index(int cp) const;            // which micro-batch this rank's group takes
  int groups(int cp) const { return world_size_ / cp; }
  // The workspace arena of this rank's plans of every size (reserve each plan's workspace,
  // then take it); bytes() against separate_bytes() is what sharing saves.
  WorkspaceArena& arena() { return arena_; }
  const WorkspaceArena& arena() const { return arena_; }

 private:
  struct Group {
    std::unique_ptr<DeviceCommunicator> comm;
    std::unique_ptr<GraphBank> bank;
  };
  const Group& find(int cp) const;
  const Group& member_of(int cp) const;  // find(cp), which must have this rank in it

  WorkspaceArena arena_;  // declared first: freed last, after the banks whose graphs used it
  std::vector<int> sizes_;
  int world_size_ = 0;
  int world_rank_ = 0;
  std::map<int, Group> groups_;
};

}  // namespace thdcp::graph
