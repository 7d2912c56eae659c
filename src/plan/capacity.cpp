#include "thdcp/plan/capacity.h"

#include <algorithm>
#include <limits>
#include <sstream>

#include "thdcp/core/error.h"

namespace thdcp {

namespace {

void check_cp_and_tokens(int64_t max_tokens, int cp, CpLayout layout) {
  THDCP_CHECK(cp >= 1, "cp=" << cp << " must be >= 1");
  THDCP_CHECK(layout == CpLayout::kDualChunk || layout == CpLayout::kContiguous,
              "CP layout " << static_cast<int>(layout) << " is not a layout: use kDualChunk or kContiguous");
  if (layout == CpLayout::kContiguous) {
    THDCP_CHECK(max_tokens > 0 && max_tokens % cp == 0,
                "max_tokens=" << max_tokens << " must be a positive multiple of cp=" << cp
                              << " (layout=contiguous): round it up to "
                              << (std::max<int64_t>(max_tokens, 1) + cp - 1) / cp * cp);
    return;
  }
  const int64_t align = 2 * static_cast<int64_t>(cp);
  THDCP_CHECK(max_tokens > 0 && max_tokens % align == 0,
              "max_tokens=" << max_tokens << " must be a positive multiple of 2*cp=" << align
                            << ": round it up to " << cp_padded_length(std::max<int64_t>(max_tokens, 1), cp));
}

std::vector<int64_t> nonempty(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> kept;
  kept.reserve(lengths.size());
  for (size_t b = 0; b < lengths.size(); ++b) {
    THDCP_CHECK(lengths[b] >= 0, "lengths[" << b << "]=" << lengths[b] << " is negative: lengths count tokens");
    if (lengths[b] > 0) kept.push_back(lengths[b]);
  }
  return kept;
}

}  // namespace

int default_max_seqs(int64_t max_tokens, int cp, CpLayout layout) {
  check_cp_and_tokens(max_tokens, cp, layout);
  const int64_t rows_per_document = layout == CpLayout::kContiguous ? 1 : 2 * static_cast<int64_t>(cp);
  const int64_t seqs = max_tokens / rows_per_document + 1;
  THDCP_CHECK(seqs <= (int64_t{1} << 30), "max_tokens=" << max_tokens << " gives max_seqs=" << seqs
                                                        << ", too many metadata entries: lower max_tokens");
  return static_cast<int>(seqs);
}

Capacity default_capacity(int64_t max_tokens, int cp, CpLayout layout) {
  return Capacity{default_max_seqs(max_tokens, cp, layout), max_tokens};
}

const char* fit_name(Fit fit) {
  switch (fit) {
    case Fit::kFits: return "fits";
    case Fit::kTooManySequences: return "too many sequences";
    case Fit::kTooManyTokens: return "too many tokens";
  }
  return "?";
}

int64_t padded_rows(const std::vector<int64_t>& lengths, int cp, CpLayout layout) {
  int64_t rows = 0;
  for (int64_t length : nonempty(lengths)) {
    const int64_t taken = layout == CpLayout::kContiguous ? length : cp_padded_length(length, cp);
    THDCP_CHECK(rows <= std::numeric_limits<int64_t>::max() - taken, "the batch's rows overflow int64");
    rows += taken;
  }
  return rows;
}

Fit check_fit(const std::vector<int64_t>& lengths, int cp, const Capacity& capacity, CpLayout layout) {
  check_cp_and_tokens(capacity.max_tokens, cp, layout);
  THDCP_CHECK(capacity.max_seqs >= 1, "capacity.max_seqs=" << capacity.max_seqs
                                                           << " must be >= 1 (one placeholder is reserved)");
  const std::vector<int64_t> kept = nonempty(lengths);
  if (padded_rows(kept, cp, layout) > capacity.max_tokens) return Fit::kTooManyTokens;
  if (static_cast<int64_t>(kept.size()) > capacity.max_seqs - 1) return Fit::kTooManySequences;
  return Fit::kFits;
}

BatchLayout capacity_layout(const std::vector<int64_t>& lengths, int cp, const Capacity& capacity, CpLayout layout) {
  return layout == CpLayout::kContiguous ? make_contiguous_layout(nonempty(lengths), cp, capacity)
                                         : make_layout(nonempty(lengths), cp, capacity);
}

int smallest_fitting(const std::vector<Capacity>& buckets, const std::vector<int64_t>& lengths, int cp,
                     CpLayout layout) {
  int best = -1;
  for (size_t i = 0; i < buckets.size(); ++i) {
    if (check_fit(lengths, cp, buckets[i], layout) != Fit::kFits) continue;
    if (best < 0 || buckets[i] < buckets[static_cast<size_t>(best)]) best = static_cast<int>(i);
  }
  return best;
}

CapacityChoice choose_capacity(const std::vector<Capacity>& buckets, const std::vector<int64_t>& lengths, int cp,
                               CpLayout layout) {
  THDCP_CHECK(!buckets.empty(), "no capacity to run the batch at: add one (add_capacity)");
  CapacityChoice choice;
  const int index = smallest_fitting(buckets, lengths, cp, layout);
  if (index >= 0) {
    choice.bucket = choice.run = buckets[static_cast<size_t>(index)];
    return choice;
  }
  const Capacity* bucket = nullptr;
  for (const Capacity& c : buckets) {
    if (check_fit(lengths, cp, c, layout) == Fit::kTooManyTokens) continue;
    if (!bucket || c < *bucket) bucket = &c;
  }
  if (!bucket) {
    const Capacity largest = *std::max_element(buckets.begin(), buckets.end());
    THDCP_FAIL("a batch of " << padded_rows(lengths, cp, layout) << " rows at cp=" << cp
                             << (layout == CpLayout::kContiguous ? " (layout=contiguous: documents unpadded)"
                                                                 : " (documents padded to multiples of 2*cp)")
                             << " fits no capacity: the largest is "
                             << capacity_key_name(cp, largest)
                             << "; add a larger capacity (add_capacity) or split the batch");
  }
  choice.bucket = *bucket;
  choice.run = default_capacity(bucket->max_tokens, cp, layout);
  choice.fallback = true;
  return choice;
}

int choose_cp_size(const std::vector<int64_t>& lengths, const std::vector<int>& sizes, int64_t rows_per_rank,
                   CpLayout layout) {
  THDCP_CHECK(!sizes.empty(), "choose_cp_size: no CP sizes given");
  THDCP_CHECK(rows_per_rank > 0, "rows_per_rank=" << rows_per_rank << " must be > 0");
  std::vector<int> sorted = sizes;
  std::sort(sorted.begin(), sorted.end());
  for (int c : sorted) {
    THDCP_CHECK(c >= 1, "CP size " << c << " must be >= 1");
    if (padded_rows(lengths, c, layout) <= rows_per_rank * c) return c;
  }
  const int largest = sorted.back();
  THDCP_FAIL("the batch needs " << padded_rows(lengths, largest, layout) << " rows at the largest CP size " << largest
                                << ", more than " << rows_per_rank << " rows per rank * " << largest
                                << ": raise the row budget, add a larger CP size, or split the batch");
}

std::string capacity_key_name(int cp, const Capacity& capacity) {
  std::ostringstream s;
  s << "cp=" << cp << " max_seqs=" << capacity.max_seqs << " max_tokens=" << capacity.max_tokens;
  return s.str();
}

}  // namespace thdcp
