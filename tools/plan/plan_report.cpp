#include "plan/plan_report.h"

#include <algorithm>
#include <cstdio>

namespace thdcp::tools {

namespace {

std::string fixed(double v, int digits) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.*f", digits, v);
  return text;
}

Json balance_json(const RankBalance& b) {
  Json balance = Json::object();
  balance.set("rank_pairs", Json::array_of(b.rank_pairs)).set("total_pairs", b.total_pairs);
  balance.set("total_max_over_mean", b.total_max_over_mean).set("step_max_over_mean", b.step_max_over_mean);
  balance.set("worst_batch_max_over_mean", b.worst_batch_max_over_mean).set("worst_batch", b.worst_batch);
  return balance;
}

// Both layouts under every mask, and the layout recommended for each.
Json layouts_json(const LayoutComparison& comparison, const std::vector<Mask>& masks) {
  Json layouts = Json::array();
  for (const LayoutPlan& l : comparison.layouts) {
    Json balance = Json::array();
    for (size_t m = 0; m < l.balance.size() && m < masks.size(); ++m) {
      balance.push(balance_json(l.balance[m]).set("mask", layout_mask_label(masks[m])));
    }
    layouts.push(Json::object()
                     .set("layout", cp_layout_name(l.layout))
                     .set("padding_rows", l.padding_rows)
                     .set("padding_fraction_of_tokens", l.padding_fraction)
                     .set("balance", balance));
  }
  Json choices = Json::array();
  for (size_t m = 0; m < comparison.choices.size() && m < masks.size(); ++m) {
    choices.push(Json::object()
                     .set("mask", layout_mask_label(masks[m]))
                     .set("layout", cp_layout_name(comparison.choices[m].layout))
                     .set("reason", comparison.choices[m].reason));
  }
  return Json::object().set("layouts", layouts).set("recommended", choices);
}

}  // namespace

std::string layout_mask_label(const Mask& mask) {
  if (mask.window_left < 0 && mask.window_right < 0) return "full";
  if (mask.window_left < 0 && mask.window_right == 0) return "causal";
  if (mask.window_right == 0) return "window " + std::to_string(mask.window_left);
  return "window(" + std::to_string(mask.window_left) + "," + std::to_string(mask.window_right) + ")";
}

std::string plan_svg(const CapacityPlan& plan) {
  const DocsPerBatch& d = plan.docs_per_batch;
  HistogramSpec histogram;
  histogram.title = "Documents per batch (" + std::to_string(d.batches) + " batches of T=" +
                    std::to_string(plan.tokens) + " rows)";
  histogram.x_label = "documents per batch";
  histogram.y_label = "batches";
  histogram.values = d.counts;
  const auto marker = [](int64_t documents, const std::string& label) {
    // Between the bar of `documents` and the next: batches left of the line fit max_seqs = documents + 1.
    return PlotMarker{static_cast<double>(documents) + 0.5,
                      label + "=" + std::to_string(documents) + ": max_seqs=" + std::to_string(documents + 1)};
  };
  histogram.markers = {marker(d.p90, "P90"), marker(d.p99, "P99"), marker(d.max, "max")};
  if (!plan.per_cp.empty()) {
    const auto largest = std::max_element(plan.per_cp.begin(), plan.per_cp.end(),
                                          [](const CpPlan& a, const CpPlan& b) { return a.cp < b.cp; });
    const int64_t never = largest->candidates.back().max_seqs - 1;
    histogram.markers.push_back(marker(never, "T/(2cp), cp=" + std::to_string(largest->cp)));
  }

  BarChartSpec bars;
  bars.title = "Causal (query, key) pairs per rank / mean over ranks, dual-chunk split, all batches";
  bars.x_label = "CP size (one bar per rank)";
  bars.y_label = "pairs / mean";
  bars.has_reference = true;
  bars.reference_value = 1.0;
  bars.reference_label = "mean";
  for (const CpPlan& p : plan.per_cp) {
    BarGroup group;
    group.label = "cp=" + std::to_string(p.cp);
    const double mean = static_cast<double>(p.balance.total_pairs) / p.cp;
    for (int64_t pairs : p.balance.rank_pairs) group.values.push_back(mean > 0 ? pairs / mean : 0.0);
    group.note = "max/mean " + fixed(p.balance.step_max_over_mean, 3);
    bars.groups.push_back(group);
  }
  std::vector<SvgPanel> panels{histogram_panel(histogram)};
  if (!bars.groups.empty()) panels.push_back(bar_chart_panel(bars));
  return svg_document(panels);
}

Json plan_json(const CapacityPlan& plan) {
  const DocsPerBatch& d = plan.docs_per_batch;
  Json docs = Json::object();
  docs.set("batches", d.batches).set("mean", d.mean).set("p50", d.p50).set("p90", d.p90).set("p99", d.p99);
  docs.set("max", d.max).set("percentile_method", "nearest-rank").set("counts", Json::array_of(d.counts));
  Json per_cp = Json::array();
  for (const CpPlan& p : plan.per_cp) {
    Json candidates = Json::array();
    for (const CapacityCandidate& c : p.candidates) {
      candidates.push(Json::object()
                          .set("label", c.label)
                          .set("max_seqs", c.max_seqs)
                          .set("fallback_batches", c.fallback_batches)
                          .set("fallback_fraction", c.fallback_fraction)
                          .set("metadata_bytes_per_rank", c.metadata_bytes));
    }
    const Json balance = balance_json(p.balance);
    Json entry = Json::object();
    entry.set("cp", p.cp).set("valid_tokens", p.valid_tokens).set("padded_rows", p.padded_rows);
    entry.set("padding_fraction", p.padding_fraction).set("slack_fraction", p.slack_fraction);
    entry.set("longest_document", p.longest_document).set("longest_rows_per_rank", p.longest_rows_per_rank);
    entry.set("candidates", candidates).set("pair_balance", balance);
    entry.set("recommended_max_seqs", p.candidates.empty() ? 0 : p.candidates[p.recommended].max_seqs);
    entry.set("recommended", p.candidates.empty() ? "" : p.candidates[p.recommended].label).set("reason", p.reason);
    entry.set("cp_layouts", layouts_json(p.layouts, plan.layout_masks));
    per_cp.push(entry);
  }
  Json out = Json::object();
  out.set("tokens", plan.tokens).set("packing_alignment", plan.packing_alignment);
  out.set("docs_per_batch", docs).set("per_cp", per_cp);
  return out;
}

}  // namespace thdcp::tools
