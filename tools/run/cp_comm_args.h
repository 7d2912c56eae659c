// --cp-comm and --cp-a2a-size, shared by `thdcp run` and `thdcp run --graph`.
#pragma once

#include <cstdint>

#include "io/args.h"
#include "thdcp/cp/cp.h"

namespace thdcp::tools {

struct CpCommArgs {
  cp::CpComm comm = cp::CpComm::kAllGather;  // --cp-comm
  int a2a_size = 1;                          // --cp-a2a-size (--cp-comm a2a+ag)
};

// The communication and its group size; throws UsageError naming the flag.
CpCommArgs parse_cp_comm(const Args& args);

// Once cp is known: all_to_all shards the heads over cp, a2a+ag over the a2a_size ranks of a
// group (which must divide cp). Throws UsageError naming the flags.
void check_cp_comm(const CpCommArgs& comm, int cp, int64_t q_heads, int64_t kv_heads);

}  // namespace thdcp::tools
