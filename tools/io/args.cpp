#include "io/args.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <cctype>
#include <string>
#include <vector>

namespace thdcp::tools {

namespace {

// Edits (insert, delete, replace a character) between two option names: a typo is one or two.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// "unknown option '--gpu' (did you mean --gpus?); the options are --backend, ... (see --help)":
// every option the command accepts, from the lists it parses with, so the message (and the
// test that checks each of them appears in --help: tests/cli/check_help_flags.py) cannot
// miss one.
UsageError unknown_option(const std::string& name, const std::vector<std::string>& value_flags,
                          const std::vector<std::string>& switches) {
  std::string options, closest;
  size_t closest_distance = 3;  // suggest only a name one or two edits away
  for (const auto* list : {&value_flags, &switches}) {
    for (const std::string& option : *list) {
      options += (options.empty() ? "--" : ", --") + option;
      const size_t distance = edit_distance(name, option);
      if (distance < closest_distance && distance < option.size()) {
        closest_distance = distance;
        closest = option;
      }
    }
  }
  std::string message = "unknown option " + quote_excerpt("--" + name);
  if (!closest.empty()) message += " (did you mean --" + closest + "?)";
  return UsageError(message + "; the options are " + options + " (see --help)");
}

}  // namespace

Args::Args(const std::vector<std::string>& argv, const std::vector<std::string>& value_flags,
           const std::vector<std::string>& switches) {
  auto contains = [](const std::vector<std::string>& list, const std::string& s) {
    return std::find(list.begin(), list.end(), s) != list.end();
  };
  for (size_t i = 0; i < argv.size(); ++i) {
    std::string arg = argv[i];
    if (arg == "-h" && contains(switches, "help")) arg = "--help";
    if (arg.rfind("--", 0) != 0) {
      throw UsageError("unexpected argument " + quote_excerpt(arg) + ": options start with -- (see --help)");
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
    const bool is_switch = contains(switches, name);
    if (!is_switch && !contains(value_flags, name)) throw unknown_option(name, value_flags, switches);
    if (values_.count(name)) throw UsageError("--" + name + " is given twice: give it once");
    if (is_switch) {
      if (inline_value) throw UsageError("--" + name + " takes no value");
      values_[name] = "1";
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= argv.size()) throw UsageError("--" + name + " needs a value (see --help)");
      value = argv[++i];
      if (value.rfind("--", 0) == 0) {
        throw UsageError("--" + name + " needs a value, but the next argument is the option " + quote_excerpt(value) +
                         " (see --help)");
      }
    }
    if (value.empty()) throw UsageError("--" + name + " has an empty value: give one (see --help)");
    values_[name] = value;
  }
}

std::vector<std::string> without(const std::vector<std::string>& argv, const std::string& flag) {
  std::vector<std::string> rest;
  for (const std::string& a : argv) {
    if (a != flag) rest.push_back(a);
  }
  return rest;
}

bool Args::has(const std::string& flag) const { return values_.count(flag) != 0; }

std::string Args::get(const std::string& flag, const std::string& fallback) const {
  const auto it = values_.find(flag);
  return it == values_.end() ? fallback : it->second;
}

namespace {

// "--flag" from "flag" or "--flag".
std::string dashed(const std::string& flag) { return flag.rfind("--", 0) == 0 ? flag : "--" + flag; }

}  // namespace

void check_tokens_multiple(int64_t tokens, int64_t multiple, const std::string& what, const std::string& why) {
  if (multiple < 1 || (tokens >= multiple && tokens % multiple == 0)) return;
  const std::string given = "--tokens " + std::to_string(tokens);
  if (tokens < multiple) {
    throw UsageError(given + ": a batch needs at least " + what + " rows: give --tokens " + std::to_string(multiple));
  }
  const int64_t below = tokens / multiple * multiple;
  throw UsageError(given + " is not a multiple of " + what + " (" + why + "): give --tokens " +
                   std::to_string(below) + " or " + std::to_string(below + multiple));
}

int64_t parse_int(const std::string& flag, const std::string& text, int64_t min, int64_t max) {
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE) {
    throw UsageError(dashed(flag) + " " + quote_excerpt(text) + ": not an integer");
  }
  if (value < min || value > max) {
    throw UsageError(dashed(flag) + " " + quote_excerpt(text) + ": must be in [" + std::to_string(min) + ", " +
                     std::to_string(max) + "]");
  }
  return value;
}

Mask parse_mask_flags(const Args& args, const Mask& fallback) {
  const std::string mask = args.get("mask", "");
  if (!mask.empty() && mask != "causal" && mask != "full") {
    throw UsageError("--mask " + quote_excerpt(mask) + ": use causal or full (or --window L,R)");
  }
  if (!args.has("window")) {
    if (mask.empty()) return fallback;
    return mask == "causal" ? Mask::causal() : Mask::full();
  }
  const auto [left, right] = args.get_pair("window", {-1, -1}, ',');
  if (mask == "causal" && right != 0) {
    throw UsageError("--mask causal sees no key after the query, but --window " + std::to_string(left) + "," +
                     std::to_string(right) + (right < 0 ? " allows every key after it" : " allows keys after it") +
                     ": give --window " + std::to_string(left) + ",0 (or drop --mask causal)");
  }
  return Mask::window(static_cast<int32_t>(left), static_cast<int32_t>(right));
}

double parse_bytes(const std::string& flag, const std::string& text) {
  double scale = 1;
  std::string digits = text;
  if (!digits.empty()) {
    const char unit = static_cast<char>(std::toupper(static_cast<unsigned char>(digits.back())));
    const char* units = "KMGT";
    if (const char* at = std::strchr(units, unit); at && unit != '\0') {
      scale = static_cast<double>(int64_t{1} << (10 * (at - units + 1)));
      digits.pop_back();
    }
  }
  const int64_t value = parse_int(flag, digits, 1, int64_t{1} << 50);
  return static_cast<double>(value) * scale;
}

std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& text, int64_t min, int64_t max) {
  std::vector<int64_t> values;
  size_t at = 0;
  while (true) {
    const size_t comma = text.find(',', at);
    const std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (item.empty()) {
      throw UsageError(dashed(flag) + " " + quote_excerpt(text) +
                       ": an empty item; give integers separated by single commas, e.g. 1,2,4");
    }
    values.push_back(parse_int(flag, item, min, max));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return values;
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
    throw UsageError("--" + flag + " " + quote_excerpt(text) + ": not an integer in [0, 2^64-1]");
  }
  return value;
}

std::pair<int64_t, int64_t> Args::get_pair(const std::string& flag, std::pair<int64_t, int64_t> fallback,
                                           char separator) const {
  if (!has(flag)) return fallback;
  const std::string text = get(flag, "");
  const size_t at = text.find(separator);
  if (at == std::string::npos || text.find(separator, at + 1) != std::string::npos) {
    throw UsageError("--" + flag + " " + quote_excerpt(text) + ": expected two integers separated by one '" +
                     separator + "'");
  }
  return {parse_int(flag, text.substr(0, at), -1, INT32_MAX), parse_int(flag, text.substr(at + 1), -1, INT32_MAX)};
}

std::vector<int> parse_divisor_list(const std::string& flag, const std::string& text, int64_t max, int64_t whole,
                                   const std::string& whole_flag) {
  std::vector<int> values;
  for (int64_t n : parse_int_list(flag, text, 1, max)) {
    if (whole % n != 0) {
      throw UsageError("--" + flag + " " + std::to_string(n) + ": use a divisor of --" + whole_flag + " " +
                       std::to_string(whole));
    }
    values.push_back(static_cast<int>(n));
  }
  return values;
}

}  // namespace thdcp::tools
