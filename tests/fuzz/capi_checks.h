// What every C ABI call of fuzz_capi is checked for (its status and message), and the
// means to check that a refused call wrote none of its outputs.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "thdcp/thdcp.h"

namespace thdcp::fuzz {

// Handles the harness writes into an output before a call: a refused call must leave them.
template <typename H>
H sentinel() {
  return reinterpret_cast<H>(uintptr_t{0x5e471e1});
}

// Every status is one of the enum, never INTERNAL ("a bug in thdcp"), and a failure leaves a
// message on this thread that starts with "<function>: ".
inline thdcp_status_t checked(thdcp_status_t status, const char* function) {
  const int raw = static_cast<int>(status);
  if (tracing()) {
    trace(std::string(function) + " -> " + thdcp_status_name(status) + (raw != 0 ? ": " : "") +
          (raw != 0 ? thdcp_last_error() : ""));
  }
  FUZZ_CHECK(raw >= THDCP_SUCCESS && raw <= THDCP_ERROR_INVALID_HANDLE,
             std::string(function) + " returned " + std::to_string(raw));
  if (status != THDCP_SUCCESS) {
    const char* message = thdcp_last_error();
    const size_t n = std::strlen(function);
    FUZZ_CHECK(message != nullptr && std::strncmp(message, function, n) == 0 && message[n] == ':',
               std::string(function) + " failed with the message '" + (message ? message : "(null)") + "'");
    FUZZ_CHECK(status != THDCP_ERROR_INTERNAL, message);
  }
  return status;
}

inline void expect(thdcp_status_t status, thdcp_status_t expected, const char* what) {
  FUZZ_CHECK(status == expected, std::string(what) + ": got " + thdcp_status_name(status) + ", expected " +
                                     thdcp_status_name(expected) + " (" + thdcp_last_error() + ")");
}

// A live handle's destroy succeeds; a destroyed one is INVALID_HANDLE; NULL is a no-op.
inline thdcp_status_t expected_for(const void* handle, bool live) {
  return handle == nullptr || live ? THDCP_SUCCESS : THDCP_ERROR_INVALID_HANDLE;
}

// An output buffer's bytes before a call, to check that a refused call left them.
struct Before {
  std::vector<std::vector<unsigned char>> copies;
  template <typename Buffer>
  void keep(const Buffer& b) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(b.data());
    copies.emplace_back(bytes, bytes + b.size() * sizeof(*b.data()));
  }
  template <typename Buffer>
  bool same(size_t i, const Buffer& b) const {
    // An empty buffer may have a null data(): memcmp must not see it.
    return copies[i].size() == b.size() * sizeof(*b.data()) &&
           (copies[i].empty() || std::memcmp(copies[i].data(), b.data(), copies[i].size()) == 0);
  }
};

}  // namespace thdcp::fuzz

// Calls a C ABI function and checks its status (checked).
#define CALL(function, ...) ::thdcp::fuzz::checked(function(__VA_ARGS__), #function)
