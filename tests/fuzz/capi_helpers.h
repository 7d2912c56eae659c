// The C ABI's calls that hold no handle, as fuzz_capi drives them: the capacity and layout
// helpers (thdcp/capi/capacity.h), the dual-chunk split (thdcp_cp_local_rows, _split,
// _merge) and the library's own queries. Each reads its operands from the program and checks
// the call (capi_checks.h) and, where the header defines the result, its values.
#pragma once

#include "capi_program.h"

namespace thdcp::fuzz {

void capacity_helpers(Program& p);
void split_merge(Program& p);
void library_calls(Program& p);

}  // namespace thdcp::fuzz
