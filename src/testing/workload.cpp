#include "thdcp/testing/workload.h"

#include <algorithm>
#include <cmath>

#include "thdcp/core/error.h"
#include "thdcp/plan/layout.h"

namespace thdcp {

uint64_t Rng::next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

double Rng::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u1 = uniform();
  while (u1 <= 0.0) u1 = uniform();
  const double u2 = uniform();
  const double radius = std::sqrt(-2.0 * std::log(u1));
  const double angle = 2.0 * M_PI * u2;
  spare_ = radius * std::sin(angle);
  has_spare_ = true;
  return radius * std::cos(angle);
}

int64_t Rng::uniform_int(int64_t lo, int64_t hi) {
  const uint64_t range = static_cast<uint64_t>(hi - lo) + 1;
  return lo + static_cast<int64_t>(next() % range);
}

std::vector<int64_t> sample_lengths(int64_t token_budget, int cp, const LengthDistribution& dist, uint64_t seed) {
  THDCP_CHECK(token_budget >= 0, "token budget " << token_budget << " must be >= 0");
  THDCP_CHECK(dist.median >= 1.0 && dist.sigma >= 0.0 && dist.max_length >= 1,
              "length distribution (median " << dist.median << ", sigma " << dist.sigma << ", max "
                                             << dist.max_length << ") needs median >= 1, sigma >= 0, max >= 1");
  Rng rng(seed);
  std::vector<int64_t> lengths;
  int64_t used = 0;
  while (true) {
    const double x = dist.median * std::exp(dist.sigma * rng.normal());
    int64_t length = std::clamp<int64_t>(static_cast<int64_t>(std::llround(x)), 1, dist.max_length);
    const int64_t room = token_budget - used;
    if (cp_padded_length(length, cp) > room) {
      // The last document takes what is left, so the batch is as full as the budget.
      const int64_t align = 2 * static_cast<int64_t>(cp);
      length = std::min(room / align * align, dist.max_length);
      if (length <= 0) break;
    }
    lengths.push_back(length);
    used += cp_padded_length(length, cp);
    if (used >= token_budget) break;
  }
  return lengths;
}

void fill_normal(HostTensor& t, uint64_t seed, float stddev) {
  Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, static_cast<float>(stddev * rng.normal()));
}

}  // namespace thdcp
