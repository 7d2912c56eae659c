// The agreement rule of Communicator::all_to_all_v, shared by its implementations: rank f's
// send_bytes[t] must equal rank t's recv_bytes[f] for every pair. Each implementation sees
// every rank's sizes before moving a byte, so every rank finds the same first mismatch and
// throws the same error instead of truncating a block or waiting for bytes that never come.
#pragma once

#include <cstddef>
#include <string>

namespace thdcp::detail {

// `sent(f, t)`: the bytes rank f sends to rank t; `expected(t, f)`: the bytes rank t expects
// from rank f. The first disagreeing pair as a message, "" when none.
template <typename Sent, typename Expected>
std::string block_size_mismatch(int size, Sent sent, Expected expected) {
  for (int from = 0; from < size; ++from) {
    for (int to = 0; to < size; ++to) {
      const size_t out = sent(from, to), in = expected(to, from);
      if (out == in) continue;
      return "all_to_all_v: rank " + std::to_string(from) + " sends " + std::to_string(out) + " bytes to rank " +
             std::to_string(to) + " but rank " + std::to_string(to) + " expects " + std::to_string(in) +
             " from it: every rank's send_bytes[r] must equal rank r's recv_bytes[sender]";
    }
  }
  return {};
}

}  // namespace thdcp::detail
