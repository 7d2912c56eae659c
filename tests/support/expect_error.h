// Expecting thdcp::Error with a message that says what is wrong.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "thdcp/core/error.h"

namespace thdcp::test {

// Expects `fn` to throw thdcp::Error whose message contains every one of `parts`.
template <typename Fn>
void expect_error(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no thdcp::Error thrown";
  } catch (const Error& e) {
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "message: " << e.what() << "\nmissing: " << part;
    }
  }
}

// The message of the thdcp::Error `call` throws ("" if none).
std::string error_of(const std::function<void()>& call);

// Expects `message` to contain `expected`.
void expect_contains(const std::string& message, const std::string& expected);

}  // namespace thdcp::test

// Expects `statement` to throw thdcp::Error whose message contains `substring`.
#define EXPECT_THDCP_ERROR(statement, substring) ::thdcp::test::expect_error([&] { statement; }, {substring})
