// thdcp/comm_device/nccl.h in a build without NCCL: callers compile and link, and learn at run
// time how to get the real communicator.
#include "thdcp/comm_device/nccl.h"
#include "thdcp/core/error.h"

namespace thdcp::nccl {

namespace {
constexpr const char* kMissing = "thdcp was built without NCCL: install NCCL and rebuild with -DTHDCP_WITH_NCCL=ON";
}  // namespace

bool built_with_nccl() { return false; }

std::unique_ptr<DeviceCommunicator> create(Communicator&, int, const Options&) {
  throw Error(kMissing, ErrorKind::kUnsupported);
}

std::vector<char> unique_id() { throw Error(kMissing, ErrorKind::kUnsupported); }

std::unique_ptr<DeviceCommunicator> create_from_unique_id(const void*, size_t, int, int, int, const Options&) {
  throw Error(kMissing, ErrorKind::kUnsupported);
}

std::unique_ptr<DeviceCommunicator> borrow(void*, int, const Options&) {
  throw Error(kMissing, ErrorKind::kUnsupported);
}

std::shared_ptr<void> window_memory(size_t) { throw Error(kMissing, ErrorKind::kUnsupported); }

}  // namespace thdcp::nccl
