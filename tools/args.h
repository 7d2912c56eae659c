// A small command-line parser for the thdcp tool: --flag VALUE, --flag=VALUE and switches.
// Unknown flags and malformed values raise UsageError (exit code 2).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "thdcp/core/error.h"

namespace thdcp::tools {

class UsageError : public Error {
 public:
  using Error::Error;
};

class Args {
 public:
  // `value_flags` take a value; `switches` do not. Both without the leading "--".
  Args(const std::vector<std::string>& argv, const std::vector<std::string>& value_flags,
       const std::vector<std::string>& switches);

  bool has(const std::string& flag) const;
  std::string get(const std::string& flag, const std::string& fallback) const;
  int64_t get_int(const std::string& flag, int64_t fallback, int64_t min, int64_t max) const;
  uint64_t get_seed(const std::string& flag, uint64_t fallback) const;
  // "A,B" or "A:B" -> two integers (each may be -1).
  std::pair<int64_t, int64_t> get_pair(const std::string& flag, std::pair<int64_t, int64_t> fallback,
                                       char separator) const;

 private:
  std::map<std::string, std::string> values_;
};

int64_t parse_int(const std::string& flag, const std::string& text, int64_t min, int64_t max);

}  // namespace thdcp::tools
