// Dynamic CP (DESIGN.md section 7): the world is split once into groups for every supported
// CP size; each batch is given a size (thdcp::choose_cp_size, or the caller's choice), and
// with world W and size c the floor(W/c) groups of c consecutive ranks run as many
// micro-batches side by side. A size need not divide W (3 in a world of 4, 2 in a world of 3):
// the last W mod c ranks then have no group of that size and sit its steps out. Each size has
// its own communicator, GraphBank, static buffers and graphs, so one size's replay never
// touches another's buffers.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "thdcp/comm_device/device_communicator.h"
#include "thdcp/graph/graph_bank.h"

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

 private:
  struct Group {
    std::unique_ptr<DeviceCommunicator> comm;
    std::unique_ptr<GraphBank> bank;
  };
  const Group& find(int cp) const;
  const Group& member_of(int cp) const;  // find(cp), which must have this rank in it

  std::vector<int> sizes_;
  int world_size_ = 0;
  int world_rank_ = 0;
  std::map<int, Group> groups_;
};

}  // namespace thdcp::graph
