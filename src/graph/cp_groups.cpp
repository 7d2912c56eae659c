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
    THDCP_CHECK(c >= 1 && world_size_ % c == 0, "CP size " << c << " must be >= 1 and divide the world size "
                                                           << world_size_ << ": use divisors of " << world_size_);
    THDCP_CHECK(i == 0 || sizes_[i - 1] != c, "CP size " << c << " is given twice");
  }
  // Every rank splits for every size in the same (sorted) order.
  for (int c : sizes_) {
    Group g;
    g.comm = world.split(world_rank_ / c, world_rank_ % c);
    THDCP_CHECK(g.comm && g.comm->size() == c, "internal: split for CP size " << c << " gave a group of "
                                                                           << (g.comm ? g.comm->size() : 0));
    g.comm->warm_up(stream);
    g.bank = std::make_unique<GraphBank>(*g.comm, options);
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

DeviceCommunicator& CpGroups::group(int cp) const { return *find(cp).comm; }
GraphBank& CpGroups::bank(int cp) const { return *find(cp).bank; }
int CpGroups::group_index(int cp) const {
  find(cp);
  return world_rank_ / cp;
}

}  // namespace thdcp::graph
