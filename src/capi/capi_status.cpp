#include "capi_status.h"

#include <cstring>

#include "capi_convert.h"

#include "thdcp/comm/mpi.h"
#include "thdcp/thdcp.h"

namespace thdcp::capi {

namespace {

thread_local std::string last_message;
// What thdcp_last_error gives when even the message could not be stored.
thread_local const char* fallback_message = nullptr;

bool contains(const char* text, const char* part) { return std::strstr(text, part) != nullptr; }

}  // namespace

thdcp_status_t status_of(const Error& error) {
  switch (error.kind()) {
    case ErrorKind::kUnsupported: return THDCP_ERROR_UNSUPPORTED;
    case ErrorKind::kCuda: return THDCP_ERROR_CUDA;
    case ErrorKind::kOutOfMemory: return THDCP_ERROR_OUT_OF_MEMORY;
    case ErrorKind::kCommunication: return THDCP_ERROR_COMMUNICATION;
    case ErrorKind::kInternal: return THDCP_ERROR_INTERNAL;
    case ErrorKind::kInvalidArgument: break;
  }
  const char* message = error.what();
  if (contains(message, "another rank failed") || contains(message, "shared-GPU rank")) {
    return THDCP_ERROR_COMMUNICATION;
  }
  return THDCP_ERROR_INVALID_ARGUMENT;
}

thdcp_status_t record(const char* function, thdcp_status_t status, const char* message, const char* detail) noexcept {
  try {
    last_message.assign(function);
    last_message.append(": ");
    last_message.append(message);
    last_message.append(detail);
    fallback_message = nullptr;
  } catch (...) {
    fallback_message = "out of host memory while recording the error message";
  }
  return status;
}

const char* last_error() noexcept { return fallback_message ? fallback_message : last_message.c_str(); }

}  // namespace thdcp::capi

extern "C" {

const char* thdcp_last_error(void) { return thdcp::capi::last_error(); }

const char* thdcp_status_name(thdcp_status_t status) {
  switch (thdcp::capi::raw_enum(status)) {
    case THDCP_SUCCESS: return "THDCP_SUCCESS";
    case THDCP_ERROR_INVALID_ARGUMENT: return "THDCP_ERROR_INVALID_ARGUMENT";
    case THDCP_ERROR_UNSUPPORTED: return "THDCP_ERROR_UNSUPPORTED";
    case THDCP_ERROR_CUDA: return "THDCP_ERROR_CUDA";
    case THDCP_ERROR_COMMUNICATION: return "THDCP_ERROR_COMMUNICATION";
    case THDCP_ERROR_OUT_OF_MEMORY: return "THDCP_ERROR_OUT_OF_MEMORY";
    case THDCP_ERROR_INTERNAL: return "THDCP_ERROR_INTERNAL";
    case THDCP_ERROR_INVALID_HANDLE: return "THDCP_ERROR_INVALID_HANDLE";
  }
  return "THDCP_STATUS_UNKNOWN";
}

const char* thdcp_version_string(void) { return THDCP_VERSION_STRING; }

int thdcp_abi_version(void) { return THDCP_ABI_VERSION; }

thdcp_status_t thdcp_built_with(thdcp_feature_t feature, int* out) {
  return thdcp::capi::guarded(__func__, [&] {
    THDCP_CAPI_NOT_NULL(out, "an int to receive 0 or 1");
    const int raw = thdcp::capi::raw_enum(feature);
    switch (raw) {
      case THDCP_FEATURE_CUDA:
#if defined(THDCP_HAVE_CUDA)
        *out = 1;
#else
        *out = 0;
#endif
        return;
      case THDCP_FEATURE_NCCL:
#if defined(THDCP_HAVE_NCCL)
        *out = 1;
#else
        *out = 0;
#endif
        return;
      case THDCP_FEATURE_MPI:
        *out = thdcp::mpi::built_with_mpi() ? 1 : 0;
        return;
    }
    THDCP_CAPI_REQUIRE(false, "feature=" << raw
                                         << " is not a thdcp_feature_t: use THDCP_FEATURE_CUDA (0), "
                                            "THDCP_FEATURE_NCCL (1) or THDCP_FEATURE_MPI (2)");
  });
}

}  // extern "C"
