#include "args.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace thdcp::tools {

Args::Args(const std::vector<std::string>& argv, const std::vector<std::string>& value_flags,
           const std::vector<std::string>& switches) {
  auto contains = [](const std::vector<std::string>& list, const std::string& s) {
    return std::find(list.begin(), list.end(), s) != list.end();
  };
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg.rfind("--", 0) != 0) {
      throw UsageError("unexpected argument '" + arg + "': options start with -- (see --help)");
    }
    std::string name = arg.substr(2);
    std::string value;
    bool inline_value = false;
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    if (contains(switches, name)) {
      if (inline_value) throw UsageError("--" + name + " takes no value");
      values_[name] = "1";
    } else if (contains(value_flags, name)) {
      if (!inline_value) {
        if (i + 1 >= argv.size()) throw UsageError("--" + name + " needs a value (see --help)");
        value = argv[++i];
      }
      values_[name] = value;
    } else {
      throw UsageError("unknown option '--" + name + "' (see --help)");
    }
  }
}

bool Args::has(const std::string& flag) const { return values_.count(flag) != 0; }

std::string Args::get(const std::string& flag, const std::string& fallback) const {
  const auto it = values_.find(flag);
  return it == values_.end() ? fallback : it->second;
}

int64_t parse_int(const std::string& flag, const std::string& text, int64_t min, int64_t max) {
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE) {
    throw UsageError("--" + flag + " " + text + ": not an integer");
  }
  if (value < min || value > max) {
    throw UsageError("--" + flag + " " + text + ": must be in [" + std::to_string(min) + ", " + std::to_string(max) +
                     "]");
  }
  return value;
}

int64_t Args::get_int(const std::string& flag, int64_t fallback, int64_t min, int64_t max) const {
  return has(flag) ? parse_int(flag, get(flag, ""), min, max) : fallback;
}

uint64_t Args::get_seed(const std::string& flag, uint64_t fallback) const {
  if (!has(flag)) return fallback;
  const std::string text = get(flag, "");
  errno = 0;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || text[0] == '-' || end != text.c_str() + text.size() || errno == ERANGE) {
    throw UsageError("--" + flag + " " + text + ": not a non-negative integer");
  }
  return value;
}

std::pair<int64_t, int64_t> Args::get_pair(const std::string& flag, std::pair<int64_t, int64_t> fallback,
                                           char separator) const {
  if (!has(flag)) return fallback;
  const std::string text = get(flag, "");
  const size_t at = text.find(separator);
  if (at == std::string::npos) {
    throw UsageError("--" + flag + " " + text + ": expected two integers separated by '" + separator + "'");
  }
  return {parse_int(flag, text.substr(0, at), -1, INT32_MAX), parse_int(flag, text.substr(at + 1), -1, INT32_MAX)};
}

}  // namespace thdcp::tools
