#include "thdcp/graph/cp_groups.h"

#include <algorithm>

#include "thdcp/core/error.h"

namespace thdcp::graph {

CpGroups::CpGroups(DeviceCommunicator& world, const std::vector<int>& sizes, cudaStream_t stream,
                   const BankOptions& options)
    : sizes_(sizes), world_size_(world.size()), world_rank_(world.rank()) {
  THDCP_CHECK(!sizes.empty(), "CpGroups: no CP sizes given");
  std::sort(sizes_.begin(), sizes_.end());
  for (size_t i = 0; i < sizes_.size(); ++i) {
    const int c = sizes_[i];
    THDCP_CHECK(c >= 1 && c <= world_size_,
                "CP size " << c << " must be in [1, " << world_size_ << "] (the world size): use sizes up to it");
    THDCP_CHECK(i == 0 || sizes_[i - 1] != c, "CP size " << c << " is given twice");
  }
  // Every rank splits for every size in the same (sorted) order; a rank past the last whole
  // group takes part in the split with no color and gets no group.
  for (int c : sizes_) {
    Group g;
    const bool member = world_rank_ < groups(c) * c;
    g.comm = world.split(member ? world_rank_ / c : -1, world_rank_ % c);
    if (member) {
      THDCP_CHECK(g.comm && g.comm->size() == c, "internal: split for CP size " << c << " gave a group of "
                                                                             << (g.comm ? g.comm->size() : 0));
      g.comm->warm_up(stream);
      g.bank = std::make_unique<GraphBank>(*g.comm, options);
    }
    groups_.emplace(c, std::move(g));
  }
}

CpGroups::~CpGroups() {
  // Banks (their graphs and buffers) go before the communicators they use.
  for (auto& g : groups_) g.second.bank.reset();
}

const CpGroups::Group& CpGroups::find(int cp) const {
  auto it = groups_.find(cp);
  THDCP_CHECK(it != groups_.end(), "CP size " << cp << " is not one of the sizes these groups were made for");
  return it->second;
}

const CpGroups::Group& CpGroups::member_of(int cp) const {
  const Group& g = find(cp);
  THDCP_CHECK(g.comm != nullptr, "world rank " << world_rank_ << " has no group of CP size " << cp << ": the world's "
                                               << world_size_ << " ranks make " << groups(cp) << " group(s) of " << cp
                                               << ", so the last " << world_size_ % cp
                                               << " sit steps of this size out (ask has_group first)");
  return g;
}

bool CpGroups::has_group(int cp) const { return find(cp).comm != nullptr; }
DeviceCommunicator& CpGroups::group(int cp) const { return *member_of(cp).comm; }
GraphBank& CpGroups::bank(int cp) const { return *member_of(cp).bank; }
int CpGroups::group_index(int cp) const {
  member_of(cp);
  return world_rank_ / cp;
}

}  // namespace thdcp::graph
