// thdcp::Error's kind: what the check macros say happened, which the C ABI turns into its
// statuses (tests/comm checks the communicators' kind).
#include <gtest/gtest.h>

#include <string>

#include "thdcp/core/error.h"

namespace thdcp {
namespace {

ErrorKind kind_of(void (*body)()) {
  try {
    body();
  } catch (const Error& e) {
    return e.kind();
  }
  ADD_FAILURE() << "no thdcp::Error thrown";
  return ErrorKind::kInternal;
}

TEST(ErrorKind, ChecksAreArgumentErrorsAndFailAsSetsTheKind) {
  EXPECT_EQ(kind_of([] { THDCP_CHECK(1 + 1 == 3, "arithmetic"); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(kind_of([] { THDCP_FAIL("always"); }), ErrorKind::kInvalidArgument);
  EXPECT_EQ(kind_of([] { THDCP_FAIL_AS(ErrorKind::kCommunication, "peer " << 3 << " died"); }),
            ErrorKind::kCommunication);
  EXPECT_EQ(kind_of([] { THDCP_FAIL_AS(ErrorKind::kUnsupported, "not built"); }), ErrorKind::kUnsupported);
  try {
    THDCP_FAIL_AS(ErrorKind::kCuda, "cudaMalloc failed: " << 7);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cudaMalloc failed: 7 [test_error.cpp:"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace thdcp
