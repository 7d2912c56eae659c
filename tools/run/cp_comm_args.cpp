#include "run/cp_comm_args.h"

#include <string>

namespace thdcp::tools {

CpCommArgs parse_cp_comm(const Args& args) {
  CpCommArgs c;
  const std::string comm = args.get("cp-comm", "all_gather");
  if (comm == "all_gather") {
    c.comm = cp::CpComm::kAllGather;
  } else if (comm == "all_to_all") {
    c.comm = cp::CpComm::kAllToAll;
  } else if (comm == "a2a+ag") {
    c.comm = cp::CpComm::kA2aAg;
  } else {
    throw UsageError("--cp-comm " + quote_excerpt(comm) + ": use all_gather, all_to_all or a2a+ag");
  }
  if (c.comm == cp::CpComm::kA2aAg && !args.has("cp-a2a-size")) {
    throw UsageError("--cp-comm a2a+ag needs --cp-a2a-size N: the ranks of an all-to-all group, a divisor of cp");
  }
  if (c.comm != cp::CpComm::kA2aAg && args.has("cp-a2a-size")) {
    throw UsageError("--cp-a2a-size is the all-to-all group of --cp-comm a2a+ag, not of " + comm +
                     ": add --cp-comm a2a+ag, or drop --cp-a2a-size");
  }
  c.a2a_size = static_cast<int>(args.get_int("cp-a2a-size", 1, 1, 64));
  return c;
}

void check_cp_comm(const CpCommArgs& c, int cp, int64_t q_heads, int64_t kv_heads) {
  if (c.comm == cp::CpComm::kA2aAg) {
    if (cp % c.a2a_size != 0) {
      throw UsageError("--cp-a2a-size " + std::to_string(c.a2a_size) + " does not divide cp=" + std::to_string(cp) +
                       ": a2a+ag runs cp = a2a_size x ag_size ranks; use an --cp-a2a-size that divides cp");
    }
    if (q_heads % c.a2a_size != 0 || kv_heads % c.a2a_size != 0) {
      throw UsageError("--cp-comm a2a+ag shards the heads over the " + std::to_string(c.a2a_size) +
                       " ranks of a group, but --heads " + std::to_string(q_heads) + ":" + std::to_string(kv_heads) +
                       " is not a multiple of --cp-a2a-size " + std::to_string(c.a2a_size) +
                       " for both: use an --cp-a2a-size that divides cp and both head counts, or --cp-comm "
                       "all_gather");
    }
    return;
  }
  if (c.comm != cp::CpComm::kAllToAll) return;
  if (q_heads % cp != 0 || kv_heads % cp != 0) {
    throw UsageError("--cp-comm all_to_all shards the heads over the ranks, but --heads " + std::to_string(q_heads) +
                     ":" + std::to_string(kv_heads) + " is not a multiple of cp=" + std::to_string(cp) +
                     " for both: use --cp-comm all_gather, or heads that cp divides");
  }
}

}  // namespace thdcp::tools
