// Dynamic CP (DESIGN.md section 7): the world is split once into groups for every supported
// CP size; each batch is given a size (thdcp::choose_cp_size, or the caller's choice), and
// with world W and size c the W/c groups of c consecutive ranks run W/c micro-batches side
// by side. Each size has its own communicator, GraphBank, static buffers and graphs, so one
// size's replay never touches another's buffers.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "thdcp/comm_device/device_communicator.h"
#include "thdcp/graph/graph_bank.h"

namespace thdcp::graph {

class CpGroups {
 public:
  // Collective over `world` (every rank, same sizes): for each size c (>= 1, dividing
  // world.size()), world rank w joins group w / c as rank w % c, with a GraphBank over it.
  // Not capture-safe (split may allocate and connect; each group is warmed up on `stream`).
  CpGroups(DeviceCommunicator& world, const std::vector<int>& sizes, cudaStream_t stream,
           const BankOptions& options = {});
  ~CpGroups();

  const std::vector<int>& sizes() const { return sizes_; }
  int world_size() const { return world_size_; }
  DeviceCommunicator& group(int cp) const;  // this rank's group of size cp
  GraphBank& bank(int cp) const;            // its bank
  int group_index(int cp) const;            // which micro-batch this rank's group takes
  int groups(int cp) const { return world_size_ / cp; }

 private:
  struct Group {
    std::unique_ptr<DeviceCommunicator> comm;
    std::unique_ptr<GraphBank> bank;
  };
  const Group& find(int cp) const;

  std::vector<int> sizes_;
  int world_size_ = 0;
  int world_rank_ = 0;
  std::map<int, Group> groups_;
};

}  // namespace thdcp::graph
