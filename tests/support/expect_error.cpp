#include "support/expect_error.h"

namespace thdcp::test {

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_contains(const std::string& message, const std::string& expected) {
  EXPECT_NE(message.find(expected), std::string::npos) << "expected \"" << expected << "\" in: \"" << message << "\"";
}

}  // namespace thdcp::test
