// SVG plots for `thdcp plan --plot FILE.svg`, written directly (no dependencies): a histogram
// of documents per batch with the candidate capacities marked, and a grouped bar chart of the
// per-rank (query, key) pair balance. The inputs are plain numbers and labels, so the plots are
// testable without the planner; the planner's caller turns a CapacityPlan into them.
//
//   SvgPanel h = histogram_panel(spec);      // one chart
//   SvgPanel b = bar_chart_panel(bars);
//   write_text_file("plan.svg", svg_document({h, b}));  // charts stacked top to bottom
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace thdcp::tools {

// A vertical line across a histogram. For integer data, x = n + 0.5 draws the line between
// the bars of n and n + 1 (e.g. "batches left of the line fit a capacity of n sequences").
struct PlotMarker {
  double x = 0;       // in data units of the x axis
  std::string label;  // e.g. "P90: max_seqs=14"
};

struct HistogramSpec {
  std::string title;
  std::string x_label;           // e.g. "documents per batch"
  std::string y_label;           // e.g. "batches"
  std::vector<int64_t> values;   // the observations, binned by integer value (at least one)
  std::vector<PlotMarker> markers;
  int max_bins = 60;             // more distinct values than this share bins of equal width
};

// A group of bars (e.g. one CP size, one bar per rank).
struct BarGroup {
  std::string label;           // under the group, e.g. "cp=4"
  std::vector<double> values;  // bar heights, each >= 0 and finite
  std::string note;            // above the group, e.g. "max/mean 1.004"; may be empty
};

struct BarChartSpec {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<BarGroup> groups;  // at least one, each with at least one bar
  bool has_reference = false;    // draw a dashed horizontal line at reference_value
  double reference_value = 1.0;  // e.g. 1.0 = perfectly balanced (pairs / mean)
  std::string reference_label;   // e.g. "mean"
};

// A drawn chart: SVG elements in a width x height box with its origin at the top left.
struct SvgPanel {
  std::string body;
  double width = 0;
  double height = 0;
};

// Counts of integer values in bins [lo, hi] (inclusive) of equal width, covering min..max of
// the values; width 1 when there are at most max_bins distinct integers in that range.
struct HistogramBin {
  int64_t lo = 0;
  int64_t hi = 0;
  int64_t count = 0;
};
std::vector<HistogramBin> integer_histogram(const std::vector<int64_t>& values, int max_bins);

// Tick positions on [lo, hi]: multiples of a step of 1, 2 or 5 times a power of ten (and at
// least min_step), about `target` of them. Returns at least one tick when lo <= hi.
std::vector<double> nice_ticks(double lo, double hi, int target, double min_step = 0);

// Markers whose x lies far to the right of the data (more than half the data range past the
// largest value) are drawn dotted at the right edge, their label marked "(off scale)".
// Throws thdcp::Error when values is empty or max_bins < 1.
SvgPanel histogram_panel(const HistogramSpec& spec, double width = 760, double height = 380);

// Throws thdcp::Error when there is no group, a group has no bars, or a value is negative or
// not finite.
SvgPanel bar_chart_panel(const BarChartSpec& spec, double width = 760, double height = 340);

// A timeline (Gantt chart): one row per lane (e.g. "rank 0 compute"), each with bars over
// [start, end) on a shared x axis (e.g. ms from the step's start), coloured by category with
// a legend in `categories` order.
struct GanttBar {
  double start = 0;
  double end = 0;
  std::string category;  // one of GanttSpec::categories
};

struct GanttRow {
  std::string label;
  std::vector<GanttBar> bars;
};

struct GanttSpec {
  std::string title;
  std::string x_label;                  // e.g. "ms from the forward's start"
  std::vector<std::string> categories;  // legend order; a bar's colour is its category's
  std::vector<GanttRow> rows;           // top to bottom
};

// Throws thdcp::Error when there is no row, a bar's start or end is not finite, its end is
// before its start, or its category is not among `categories`.
SvgPanel gantt_panel(const GanttSpec& spec, double width = 900, double row_height = 24);

// A complete SVG document (XML declaration, white background) with `panels` stacked top to
// bottom; as wide as the widest panel.
std::string svg_document(const std::vector<SvgPanel>& panels);

// `text` with &, <, >, " and ' escaped for XML text and attribute values.
std::string xml_escape(const std::string& text);

}  // namespace thdcp::tools
