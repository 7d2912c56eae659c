// The plan report: the SVG is well-formed and marks the plan's own numbers; the JSON holds them.
#include <gtest/gtest.h>

#include "plan_report.h"
#include "xml_check.h"

namespace thdcp::tools {
namespace {

CapacityPlan small_plan() {
  DocumentBatches input{"", {{3, 5}, {8}, {1, 1, 1, 2}, {4, 4}}, {}};
  PlanOptions options;
  options.cp_sizes = {1, 2};
  options.tokens = 16;
  return plan_capacity(input, options);
}

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

TEST(PlanReport, SvgMarksTheCandidates) {
  const CapacityPlan plan = small_plan();
  const std::string svg = plan_svg(plan);
  EXPECT_EQ(xml_problem(svg), "");
  // Documents per batch 2, 1, 4, 2: nearest-rank P90 = P99 = max = 4; T/(2*2) = 4 as well.
  EXPECT_EQ(plan.docs_per_batch.p90, 4);
  EXPECT_NE(svg.find("P90=4: max_seqs=5"), std::string::npos);
  EXPECT_NE(svg.find("T/(2cp), cp=2=4: max_seqs=5"), std::string::npos);
  EXPECT_EQ(count(svg, "class=\"marker\""), 4);
  EXPECT_EQ(count(svg, "<rect class=\"bar\""), 3 + 1 + 2);  // bins 1, 2, 4; cp=1: 1 rank, cp=2: 2 ranks
  EXPECT_NE(svg.find(">cp=2<"), std::string::npos);
}

TEST(PlanReport, JsonHoldsThePlan) {
  const CapacityPlan plan = small_plan();
  const std::string text = plan_json(plan).dump(0);
  EXPECT_NE(text.find("\"tokens\":16"), std::string::npos);
  EXPECT_NE(text.find("\"counts\":[2,1,4,2]"), std::string::npos);
  EXPECT_NE(text.find("\"percentile_method\":\"nearest-rank\""), std::string::npos);
  const CpPlan& p = plan.per_cp[1];
  std::string pairs = "\"rank_pairs\":[";
  for (size_t r = 0; r < p.balance.rank_pairs.size(); ++r) {
    pairs += (r ? "," : "") + std::to_string(p.balance.rank_pairs[r]);
  }
  EXPECT_NE(text.find(pairs + "]"), std::string::npos) << text;
  EXPECT_EQ(count(text, "\"recommended_max_seqs\":"), 2);
}

}  // namespace
}  // namespace thdcp::tools
