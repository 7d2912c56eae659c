// thdcp/comm/nccl.h in a build without NCCL: callers compile and link, and learn at run
// time how to get the real communicator.
#include "thdcp/comm/nccl.h"
#include "thdcp/core/error.h"

namespace thdcp::nccl {

bool built_with_nccl() { return false; }

std::unique_ptr<DeviceCommunicator> create(Communicator&, int, const Options&) {
  throw Error("thdcp was built without NCCL: install NCCL and rebuild with -DTHDCP_WITH_NCCL=ON");
}

}  // namespace thdcp::nccl
