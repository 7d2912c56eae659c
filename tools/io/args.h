// A small command-line parser for the thdcp tool: --flag VALUE, --flag=VALUE and switches.
// Unknown flags and malformed values raise UsageError (exit code 2).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "thdcp/core/error.h"
#include "thdcp/plan/mask.h"

namespace thdcp::tools {

class UsageError : public Error {
 public:
  using Error::Error;
};

class Args {
 public:
  // `value_flags` take a value; `switches` do not. Both without the leading "--". Refused
  // with UsageError: unknown options (the message names every option of both lists, and the
  // nearest one to a typo), a flag given twice, an empty value, a value that is itself an
  // option ("--cp --tokens 64"). "-h" means "--help" where "help" is a switch.
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

// `argv` without any `flag` (a mode's switch, "--graph", before its own Args).
std::vector<std::string> without(const std::vector<std::string>& argv, const std::string& flag);

// The mask of --mask causal|full and --window L,R, as FlashAttention users write them
// (causal=True with window_size=(L, 0)): --window alone is that window; with --mask causal
// the right side must be 0 (or left out as -1 would contradict it: refused, saying why); with
// --mask full the window applies as given. Without either: `fallback`.
Mask parse_mask_flags(const Args& args, const Mask& fallback);

// --tokens T of a batch split over CP ranks: under the dual-chunk layout each rank holds two
// chunks of T/(2*cp) rows, so T must be a positive multiple of `multiple` (2*cp, or 2*lcm
// over several CP sizes; cp for the contiguous layout), which `what` names ("2*cp=128") and
// `why` explains. Throws UsageError naming the nearest valid values below and above: a count
// of rows is never rounded in silence.
void check_tokens_multiple(int64_t tokens, int64_t multiple, const std::string& what,
                           const std::string& why = "every rank holds two chunks of T/(2*cp) rows");

// `flag` with or without its leading "--". Values are quoted in messages (quote_excerpt).
int64_t parse_int(const std::string& flag, const std::string& text, int64_t min, int64_t max);
// "8G", "512M", "64K", "1073741824": bytes (K, M, G, T are powers of 1024), > 0.
double parse_bytes(const std::string& flag, const std::string& text);
// "1,2,4": every item an integer in [min, max]; an empty item (",", "1,,2", "1,2,") is refused.
std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& text, int64_t min, int64_t max);
// parse_int_list in [1, max] whose every item divides `whole` (named `whole_flag` in the error).
std::vector<int> parse_divisor_list(const std::string& flag, const std::string& text, int64_t max, int64_t whole,
                                   const std::string& whole_flag);

}  // namespace thdcp::tools
