// The boundary of the C ABI: statuses, the thread-local last error, and the guard that
// turns whatever a call throws into a status, so that no exception leaves libthdcp.
#pragma once

#include <exception>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>

#include "thdcp/core/error.h"
#include "thdcp/thdcp.h"

namespace thdcp::capi {

// The largest value of thdcp_status_t (a status a callback returns is checked against it).
constexpr int kLastStatus = THDCP_ERROR_INVALID_HANDLE;

// An error the C layer raises itself, with the status it stands for (its own argument
// checks, parts missing from the build). Library errors (thdcp::Error) get theirs from
// status_of().
class ApiError : public std::runtime_error {
 public:
  ApiError(thdcp_status_t status, const std::string& message) : std::runtime_error(message), status_(status) {}
  thdcp_status_t status() const { return status_; }

 private:
  thdcp_status_t status_;
};

// The status of a thdcp::Error: from its ErrorKind (THDCP_CHECK_CUDA's failures are
// THDCP_ERROR_CUDA, or THDCP_ERROR_OUT_OF_MEMORY for cudaErrorMemoryAllocation; a part
// missing from the build THDCP_ERROR_UNSUPPORTED; an aborted group, a failed peer and NCCL
// or MPI failures THDCP_ERROR_COMMUNICATION). An error of the default kind is an argument
// check, THDCP_ERROR_INVALID_ARGUMENT, unless its message says it came from a peer (the
// cross-rank checks forward another rank's error as text).
thdcp_status_t status_of(const Error& error);

// Stores "<function>: <message><detail>" as this thread's last error and returns status.
// Never throws: without memory for the message, a fixed one stands in.
thdcp_status_t record(const char* function, thdcp_status_t status, const char* message,
                      const char* detail = "") noexcept;

// Runs body() and returns THDCP_SUCCESS, or the status of what it threw, recorded.
template <typename Body>
thdcp_status_t guarded(const char* function, Body&& body) noexcept {
  try {
    body();
    return THDCP_SUCCESS;
  } catch (const ApiError& e) {
    return record(function, e.status(), e.what());
  } catch (const Error& e) {
    return record(function, status_of(e), e.what());
  } catch (const std::bad_alloc&) {
    return record(function, THDCP_ERROR_OUT_OF_MEMORY, "out of host memory (std::bad_alloc)");
  } catch (const std::length_error& e) {
    return record(function, THDCP_ERROR_OUT_OF_MEMORY, "a host buffer too large to allocate: ", e.what());
  } catch (const std::exception& e) {
    return record(function, THDCP_ERROR_INTERNAL, "unexpected exception: ", e.what());
  } catch (...) {
    return record(function, THDCP_ERROR_INTERNAL, "unexpected exception of an unknown type");
  }
}

// The message of this thread's last failure ("" if none).
const char* last_error() noexcept;

}  // namespace thdcp::capi

// THDCP_CAPI_REQUIRE(cond, stream-expression): an argument check of the C layer
// (THDCP_ERROR_INVALID_ARGUMENT). The message names the argument, its value and the fix.
#define THDCP_CAPI_REQUIRE(cond, message)                                                      \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::ostringstream thdcp_capi_stream_;                                                   \
      thdcp_capi_stream_ << message;                                                           \
      throw ::thdcp::capi::ApiError(THDCP_ERROR_INVALID_ARGUMENT, thdcp_capi_stream_.str());   \
    }                                                                                          \
  } while (0)

// A pointer argument that may not be NULL: "q is NULL: pass <what>".
#define THDCP_CAPI_NOT_NULL(pointer, what) THDCP_CAPI_REQUIRE((pointer) != nullptr, #pointer " is NULL: pass " << what)
