// SVG plots: binning and ticks against direct counts, documents checked for well-formed XML,
// the expected elements, and bar heights proportional to the values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <regex>

#include "svg.h"
#include "xml_check.h"
#include "thdcp/core/error.h"

namespace thdcp::tools {
namespace {

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

std::vector<double> bar_heights(const std::string& svg) {
  static const std::regex bar(R"re(<rect class="bar"[^>]* height="([0-9.]+)")re");
  std::vector<double> heights;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), bar); it != std::sregex_iterator(); ++it) {
    heights.push_back(std::stod((*it)[1]));
  }
  return heights;
}

TEST(Svg, XmlCheckerCatchesProblems) {
  // The checker itself must be able to fail.
  EXPECT_EQ(xml_problem("<svg><g></g></svg>"), "");
  EXPECT_NE(xml_problem("<svg><g></svg>"), "");
  EXPECT_NE(xml_problem("<svg><text>a & b</text></svg>"), "");
  EXPECT_NE(xml_problem("<svg><rect x=1/></svg>"), "");
  EXPECT_NE(xml_problem("<svg>"), "");
}

TEST(Svg, IntegerHistogramMatchesDirectCounts) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<int64_t> values(1 + rng() % 300);
    const int64_t lo = rng() % 50, span = 1 + rng() % 200;
    for (auto& v : values) v = lo + static_cast<int64_t>(rng() % span);
    const int max_bins = 1 + static_cast<int>(rng() % 80);
    const std::vector<HistogramBin> bins = integer_histogram(values, max_bins);
    ASSERT_LE(static_cast<int>(bins.size()), max_bins);
    const int64_t mn = *std::min_element(values.begin(), values.end());
    const int64_t mx = *std::max_element(values.begin(), values.end());
    EXPECT_EQ(bins.front().lo, mn);
    EXPECT_GE(bins.back().hi, mx);
    for (size_t b = 0; b < bins.size(); ++b) {
      if (b > 0) {
        EXPECT_EQ(bins[b].lo, bins[b - 1].hi + 1);
      }
      EXPECT_EQ(bins[b].hi - bins[b].lo, bins[0].hi - bins[0].lo);
      int64_t direct = 0;
      for (int64_t v : values) direct += v >= bins[b].lo && v <= bins[b].hi;
      EXPECT_EQ(bins[b].count, direct);
    }
    if (mx - mn + 1 <= max_bins) {
      EXPECT_EQ(bins[0].hi, bins[0].lo) << "one bin per value when they fit";
    }
  }
  EXPECT_THROW(integer_histogram({}, 10), Error);
}

TEST(Svg, NiceTicks) {
  const std::vector<double> t = nice_ticks(0, 97, 5);
  EXPECT_EQ(t, (std::vector<double>{0, 20, 40, 60, 80}));
  EXPECT_EQ(nice_ticks(3, 9, 8, 1), (std::vector<double>{3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(nice_ticks(0, 1.2, 3), (std::vector<double>{0, 0.5, 1.0}));
  EXPECT_EQ(nice_ticks(5, 5, 5), (std::vector<double>{5}));
  for (double hi : {0.013, 7.0, 123.0, 45678.0}) {
    const std::vector<double> ticks = nice_ticks(0, hi, 5);
    EXPECT_GE(ticks.size(), 3u);
    EXPECT_LE(ticks.size(), 11u);
    const double step = ticks[1] - ticks[0];
    const double mantissa = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
    EXPECT_TRUE(std::fabs(mantissa - 1) < 1e-6 || std::fabs(mantissa - 2) < 1e-6 || std::fabs(mantissa - 5) < 1e-6)
        << step;
    EXPECT_LE(ticks.back(), hi * (1 + 1e-9));
  }
}

TEST(Svg, EscapesText) { EXPECT_EQ(xml_escape("a<b & \"c\" 'd'>"), "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;"); }

TEST(Svg, HistogramDocument) {
  HistogramSpec spec;
  spec.title = "documents per batch <all> & more";
  spec.x_label = "documents per batch";
  spec.y_label = "batches";
  spec.values = {3, 4, 4, 5, 5, 5, 6, 9};
  spec.markers = {{6.5, "P90: max_seqs=7"}, {9.5, "max: max_seqs=10"}, {4096.5, "T/(2cp): max_seqs=4097"}};
  const std::string svg = svg_document({histogram_panel(spec)});
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(svg.rfind("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_EQ(count(svg, "<rect class=\"bar\""), 5);  // values 3, 4, 5, 6, 9
  EXPECT_EQ(count(svg, "class=\"marker\""), 3);
  EXPECT_NE(svg.find("P90: max_seqs=7"), std::string::npos);
  EXPECT_NE(svg.find("documents per batch &lt;all&gt; &amp; more"), std::string::npos);
  EXPECT_NE(svg.find("off scale"), std::string::npos) << "the far marker is drawn at the edge";
  EXPECT_EQ(count(svg, "off scale"), 1);
  // Heights in proportion to the counts 1, 2, 3, 1, 1.
  const std::vector<double> h = bar_heights(svg);
  ASSERT_EQ(h.size(), 5u);
  EXPECT_NEAR(h[1] / h[0], 2.0, 0.02);
  EXPECT_NEAR(h[2] / h[0], 3.0, 0.03);
  EXPECT_NEAR(h[4], h[0], 0.01);
}

TEST(Svg, BarChartDocument) {
  BarChartSpec spec;
  spec.title = "per-rank (query, key) pairs / mean";
  spec.x_label = "CP size";
  spec.y_label = "pairs / mean";
  spec.groups = {{"cp=1", {1.0}, ""}, {"cp=2", {0.98, 1.02}, "max/mean 1.020"}, {"cp=4", {0.5, 1.5, 1.0, 1.0}, "x"}};
  spec.has_reference = true;
  spec.reference_label = "mean";
  const std::string svg = svg_document({bar_chart_panel(spec), bar_chart_panel(spec)});
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(count(svg, "<rect class=\"bar\""), 14);
  EXPECT_EQ(count(svg, "class=\"reference\""), 2);
  EXPECT_EQ(count(svg, "class=\"group-label\""), 6);
  EXPECT_EQ(count(svg, "max/mean 1.020"), 2);
  EXPECT_NE(svg.find("translate(0 340)"), std::string::npos) << "second panel below the first";
  const std::vector<double> h = bar_heights(svg);
  EXPECT_NEAR(h[4] / h[0], 1.5, 0.01);
  EXPECT_NEAR(h[3] / h[0], 0.5, 0.01);

  spec.groups[1].values[0] = -1;
  EXPECT_THROW(bar_chart_panel(spec), Error);
  spec.groups[1].values[0] = NAN;
  EXPECT_THROW(bar_chart_panel(spec), Error);
  spec.groups.clear();
  EXPECT_THROW(bar_chart_panel(spec), Error);
}

// A timeline: well-formed, a bar per span with widths proportional to the spans' lengths,
// every row labelled; bad bars refused naming the row.
TEST(Svg, GanttDocument) {
  GanttSpec spec;
  spec.title = "one step <cp 2>";
  spec.x_label = "ms";
  spec.categories = {"gather", "attention", "reduce"};
  spec.rows = {{"rank 0 compute", {{0.0, 1.0, "gather"}, {1.0, 9.0, "attention"}}},
               {"rank 0 collectives", {{9.0, 11.0, "reduce"}}},
               {"rank 1 compute", {}}};
  const std::string svg = svg_document({gantt_panel(spec)});
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(count(svg, "<rect class=\"bar\""), 3);
  EXPECT_EQ(count(svg, "class=\"row-label\""), 3);
  EXPECT_NE(svg.find("one step &lt;cp 2&gt;"), std::string::npos);
  static const std::regex bar(R"re(<rect class="bar"[^>]* width="([0-9.]+)")re");
  std::vector<double> widths;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), bar); it != std::sregex_iterator(); ++it) {
    widths.push_back(std::stod((*it)[1]));
  }
  ASSERT_EQ(widths.size(), 3u);
  EXPECT_NEAR(widths[1] / widths[0], 8.0, 0.05);  // 8 ms against 1 ms
  EXPECT_NEAR(widths[2] / widths[0], 2.0, 0.05);

  GanttSpec bad = spec;
  bad.rows[1].bars[0].end = 8.0;  // before its start
  EXPECT_THROW(
      {
        try {
          gantt_panel(bad);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("row 'rank 0 collectives' has a bar over [9, 8)"), std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
  bad = spec;
  bad.rows[0].bars[0].category = "table";
  EXPECT_THROW(gantt_panel(bad), Error);
  bad = spec;
  bad.rows[0].bars[0].start = std::nan("");
  EXPECT_THROW(gantt_panel(bad), Error);
  bad.rows.clear();
  EXPECT_THROW(gantt_panel(bad), Error);
}

}  // namespace
}  // namespace thdcp::tools
