#include "thdcp/plan/layout_balance.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "thdcp/core/error.h"
#include "thdcp/plan/layout.h"
#include "thdcp/plan/segment.h"

namespace thdcp {

namespace {

// Checks the arguments and returns the batch's rows under `layout`.
int64_t checked_rows(const std::vector<int64_t>& lengths, int cp, CpLayout layout) {
  THDCP_CHECK(cp >= 1, "cp=" << cp << " must be >= 1 (1 means no context parallelism)");
  THDCP_CHECK(layout == CpLayout::kDualChunk || layout == CpLayout::kContiguous,
              "CP layout " << static_cast<int>(layout) << " is neither dual_chunk (0) nor contiguous (1)");
  int64_t tokens = 0, dual_rows = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    THDCP_CHECK(lengths[i] >= 0 && lengths[i] <= kMaxBatchRows,
                "document " << i << " has length " << lengths[i] << ": lengths must be in [0, 2^31-1]");
    tokens += lengths[i];
    dual_rows += cp_padded_length(lengths[i], cp);
    THDCP_CHECK(dual_rows <= kMaxBatchRows, "the documents need more than 2^31-1 rows with each padded to a multiple "
                                            "of 2*cp=" << 2 * static_cast<int64_t>(cp)
                                                       << " (layouts' offsets are int32): split the batch");
  }
  if (layout == CpLayout::kDualChunk) return dual_rows;
  return (tokens + cp - 1) / cp * cp;  // <= dual_rows: no overflow
}

// Positions [first, first + rows) of a document of `length` tokens as a segment over all of
// its keys (the mask picks the visible ones).
Segment piece(int64_t first, int64_t rows, int64_t length) {
  Segment s{};
  s.q_pos = static_cast<int32_t>(first);
  s.q_len = static_cast<int32_t>(rows);
  s.q_span = s.q_len;
  s.k_len = static_cast<int32_t>(length);
  return s;
}

// a + b for sums of (query, key) pair counts. One batch's fit in int64 (at most (2^31)^2);
// sums over batches of documents near 2^31 tokens may not, and are refused, not wrapped.
int64_t add_pairs(int64_t a, int64_t b) {
  int64_t sum = 0;
  THDCP_CHECK(!__builtin_add_overflow(a, b, &sum),
              "the batches' (query, key) pairs add up past 2^63-1 (" << a << " + " << b
                                                                     << "): plan fewer batches of documents this long "
                                                                        "at a time");
  return sum;
}

double max_over_mean(const std::vector<int64_t>& pairs, int64_t total) {
  const double mean = static_cast<double>(total) / static_cast<double>(pairs.size());
  return mean > 0 ? static_cast<double>(*std::max_element(pairs.begin(), pairs.end())) / mean : 1.0;
}

std::string fixed(double value, int digits) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.*f", digits, value);
  return text;
}

}  // namespace

int64_t cp_layout_padding(const std::vector<int64_t>& lengths, int cp, CpLayout layout) {
  int64_t tokens = 0;
  for (int64_t length : lengths) tokens += length;
  return checked_rows(lengths, cp, layout) - tokens;
}

std::vector<int64_t> cp_layout_rank_pairs(const std::vector<int64_t>& lengths, int cp, CpLayout layout,
                                          const Mask& mask) {
  check_mask(mask);
  const int64_t rows = checked_rows(lengths, cp, layout);
  std::vector<int64_t> pairs(static_cast<size_t>(cp), 0);
  if (layout == CpLayout::kDualChunk) {
    for (int64_t length : lengths) {
      const int64_t padded = cp_padded_length(length, cp);
      for (int rank = 0; rank < cp; ++rank) {
        for (int slot = 0; slot < 2; ++slot) {
          // Row offsets do not change the count: the document is placed at row 0.
          pairs[static_cast<size_t>(rank)] = add_pairs(
              pairs[static_cast<size_t>(rank)], segment_pairs(cp_segment(0, padded, length, cp, rank, slot, mask), mask));
        }
      }
    }
    return pairs;
  }
  const int64_t per_rank = rows / cp;
  int64_t start = 0;  // the document's first row
  for (int64_t length : lengths) {
    // The document's rows cut at the rank boundaries: one piece per rank it spans.
    for (int64_t row = start; row < start + length;) {
      const int64_t rank = row / per_rank;
      const int64_t end = std::min(start + length, (rank + 1) * per_rank);
      pairs[static_cast<size_t>(rank)] =
          add_pairs(pairs[static_cast<size_t>(rank)], segment_pairs(piece(row - start, end - row, length), mask));
      row = end;
    }
    start += length;
  }
  return pairs;
}

std::vector<CpLayoutReport> cp_layout_report(const std::vector<int64_t>& lengths, int cp, const Mask& mask) {
  std::vector<CpLayoutReport> reports;
  for (CpLayout layout : kCpLayouts) {
    CpLayoutReport r;
    r.layout = layout;
    r.rank_pairs = cp_layout_rank_pairs(lengths, cp, layout, mask);
    r.padding_tokens = cp_layout_padding(lengths, cp, layout);
    for (int64_t length : lengths) r.valid_tokens += length;
    r.total_rows = r.valid_tokens + r.padding_tokens;
    for (int64_t p : r.rank_pairs) r.total_pairs = add_pairs(r.total_pairs, p);
    r.balance = max_over_mean(r.rank_pairs, r.total_pairs);
    reports.push_back(std::move(r));
  }
  return reports;
}

RankBalance rank_balance(const std::vector<std::vector<int64_t>>& batches, int cp, CpLayout layout,
                         const Mask& mask) {
  THDCP_CHECK(cp >= 1, "cp=" << cp << " must be >= 1 (1 means no context parallelism)");
  RankBalance balance;
  balance.rank_pairs.assign(static_cast<size_t>(cp), 0);
  double busiest_sum = 0;
  double mean_sum = 0;
  for (size_t b = 0; b < batches.size(); ++b) {
    const std::vector<int64_t> pairs = cp_layout_rank_pairs(batches[b], cp, layout, mask);
    int64_t batch_total = 0;
    for (int rank = 0; rank < cp; ++rank) {
      balance.rank_pairs[static_cast<size_t>(rank)] =
          add_pairs(balance.rank_pairs[static_cast<size_t>(rank)], pairs[static_cast<size_t>(rank)]);
      batch_total = add_pairs(batch_total, pairs[static_cast<size_t>(rank)]);
    }
    balance.total_pairs = add_pairs(balance.total_pairs, batch_total);
    const double mean = static_cast<double>(batch_total) / cp;
    busiest_sum += static_cast<double>(*std::max_element(pairs.begin(), pairs.end()));
    mean_sum += mean;
    const double ratio = max_over_mean(pairs, batch_total);
    if (ratio > balance.worst_batch_max_over_mean) {
      balance.worst_batch_max_over_mean = ratio;
      balance.worst_batch = static_cast<int64_t>(b);
    }
  }
  balance.total_max_over_mean = max_over_mean(balance.rank_pairs, balance.total_pairs);
  balance.step_max_over_mean = mean_sum > 0 ? busiest_sum / mean_sum : 1.0;
  return balance;
}

LayoutComparison compare_layouts(const std::vector<std::vector<int64_t>>& batches, int cp,
                                 const std::vector<Mask>& masks) {
  LayoutComparison out;
  int64_t tokens = 0;
  for (const auto& batch : batches) {
    for (int64_t length : batch) tokens += length;
  }
  for (CpLayout layout : kCpLayouts) {
    LayoutPlan plan;
    plan.layout = layout;
    for (const auto& batch : batches) plan.padding_rows += cp_layout_padding(batch, cp, layout);
    plan.padding_fraction = tokens > 0 ? static_cast<double>(plan.padding_rows) / static_cast<double>(tokens) : 0.0;
    for (const Mask& mask : masks) plan.balance.push_back(rank_balance(batches, cp, layout, mask));
    out.layouts.push_back(std::move(plan));
  }
  const LayoutPlan& dual = out.layouts[0];
  const LayoutPlan& contiguous = out.layouts[1];
  for (size_t m = 0; m < masks.size(); ++m) {
    const double dual_step = dual.balance[m].step_max_over_mean;
    const double contiguous_step = contiguous.balance[m].step_max_over_mean;
    const auto step = [&](const LayoutPlan& p) { return fixed(p.balance[m].step_max_over_mean, 4) + "x"; };
    const auto padding = [](const LayoutPlan& p) {
      return std::to_string(p.padding_rows) + " rows (" + fixed(100.0 * p.padding_fraction, 2) + "%)";
    };
    const bool tied = std::abs(dual_step - contiguous_step) <= kLayoutTie * std::min(dual_step, contiguous_step);
    const bool contiguous_wins = tied ? contiguous.padding_rows < dual.padding_rows : contiguous_step < dual_step;
    const LayoutPlan& pick = contiguous_wins ? contiguous : dual;
    const LayoutPlan& other = contiguous_wins ? dual : contiguous;
    const std::string pick_name = cp_layout_name(pick.layout), other_name = cp_layout_name(other.layout);
    LayoutChoice choice;
    choice.layout = pick.layout;
    if (tied) {
      choice.reason = "busiest rank within " + fixed(100 * kLayoutTie, 0) + "% (" + pick_name + " " + step(pick) +
                      ", " + other_name + " " + step(other) + " the mean per step); " + pick_name + " pads " +
                      padding(pick) + " against " + padding(other);
    } else {
      choice.reason = pick_name + "'s busiest rank does " + step(pick) + " the mean per step, " + other_name + "'s " +
                      step(other) + "; padding " + padding(pick) + " against " + padding(other);
    }
    out.choices.push_back(std::move(choice));
  }
  return out;
}

}  // namespace thdcp
