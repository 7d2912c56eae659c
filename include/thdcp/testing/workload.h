// Synthetic packed batches: document lengths and tensor contents, reproducible from a seed
// on every platform (the generators are written out here, not taken from <random>'s
// distributions, whose output differs between standard libraries).
#pragma once

#include <cstdint>
#include <vector>

#include "thdcp/core/tensor.h"

namespace thdcp {

// splitmix64: a small, well-mixed 64-bit generator.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  double uniform();  // [0, 1)
  double normal();   // standard normal (Box-Muller)
  int64_t uniform_int(int64_t lo, int64_t hi);  // inclusive

 private:
  uint64_t state_;
  double spare_ = 0;
  bool has_spare_ = false;
};

// Document-length distribution of packed SFT data: lognormal, clipped to [1, max_length].
struct LengthDistribution {
  double median = 1500.0;  // exp(mu)
  double sigma = 1.0;      // of log(length)
  int64_t max_length = 16384;
};

// Draws documents until their padded lengths (multiples of 2*cp) fill `token_budget`; the
// last document is shortened to fit exactly where possible. Never empty for a budget >= 2*cp.
std::vector<int64_t> sample_lengths(int64_t token_budget, int cp, const LengthDistribution& dist, uint64_t seed);

// Fills every element of `t` with independent N(0, stddev^2) values rounded to its dtype.
void fill_normal(HostTensor& t, uint64_t seed, float stddev = 1.0f);

}  // namespace thdcp
