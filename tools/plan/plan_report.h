// A CapacityPlan (thdcp/planner.h) as the plot and the JSON summary of `thdcp plan`.
#pragma once

#include <string>

#include "io/json.h"
#include "io/svg.h"
#include "thdcp/plan/planner.h"

namespace thdcp::tools {

// Histogram of documents per batch with markers at P90, P99 and max (the largest document
// count each candidate capacity holds; a line at n + 0.5 separates batches that fit from those
// that fall back) and at T/(2cp) of the largest CP size; then the per-rank (query, key) pairs
// of every CP size divided by their mean (1.0 = perfect balance), each group noted with
// RankBalance::step_max_over_mean. Both panels in one document.
std::string plan_svg(const CapacityPlan& plan);

// A mask of the layout comparison as the report names it: "causal", "full", "window W" (a left
// window W with causal), or "window(L,R)".
std::string layout_mask_label(const Mask& mask);

// Everything in the plan, keyed by what it means (tokens, docs_per_batch, per_cp[...]).
Json plan_json(const CapacityPlan& plan);

}  // namespace thdcp::tools
