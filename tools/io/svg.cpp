#include "io/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "thdcp/core/error.h"

namespace thdcp::tools {

namespace {

// Plot area inside a panel: room on the left for tick labels and the y label, at the top
// for the title and marker labels, at the bottom for tick labels and the x label.
struct Frame {
  double left, top, right, bottom;  // pixel edges of the plot area
  double x_lo, x_hi, y_lo, y_hi;    // data range
  double px(double x) const { return left + (x - x_lo) / (x_hi - x_lo) * (right - left); }
  double py(double y) const { return bottom - (y - y_lo) / (y_hi - y_lo) * (bottom - top); }
};

const char* kPalette[] = {"#d62728", "#9467bd", "#2ca02c", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
constexpr int kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);

std::string num(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", v);
  std::string s = text;
  // Trim "12.50" -> "12.5", "12.00" -> "12": smaller files, same picture.
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s == "-0" ? "0" : s;
}

std::string tick_text(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", std::fabs(v) < 1e-12 ? 0.0 : v);
  return text;
}

std::string text_element(double x, double y, const std::string& text, const std::string& attributes) {
  return "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" " + attributes + ">" + xml_escape(text) + "</text>\n";
}

std::string line_element(double x1, double y1, double x2, double y2, const std::string& attributes) {
  return "<line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" + num(x2) + "\" y2=\"" + num(y2) + "\" " +
         attributes + "/>\n";
}

// Title, axes, ticks, grid lines and axis labels of a frame.
std::string draw_axes(const Frame& f, const std::string& title, const std::string& x_label,
                      const std::string& y_label, const std::vector<double>& x_ticks,
                      const std::vector<double>& y_ticks, double width) {
  std::string s;
  s += text_element(width / 2, 22, title, "text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\"");
  for (double t : y_ticks) {
    const double y = f.py(t);
    s += line_element(f.left, y, f.right, y, "stroke=\"#e0e0e0\"");
    s += line_element(f.left - 5, y, f.left, y, "stroke=\"black\"");
    s += text_element(f.left - 8, y + 4, tick_text(t), "text-anchor=\"end\"");
  }
  for (double t : x_ticks) {
    const double x = f.px(t);
    s += line_element(x, f.bottom, x, f.bottom + 5, "stroke=\"black\"");
    s += text_element(x, f.bottom + 18, tick_text(t), "text-anchor=\"middle\"");
  }
  s += line_element(f.left, f.bottom, f.right, f.bottom, "stroke=\"black\"");
  s += line_element(f.left, f.top, f.left, f.bottom, "stroke=\"black\"");
  s += text_element((f.left + f.right) / 2, f.bottom + 40, x_label, "text-anchor=\"middle\"");
  const double y_mid = (f.top + f.bottom) / 2;
  s += text_element(18, y_mid, y_label,
                    "text-anchor=\"middle\" transform=\"rotate(-90 18 " + num(y_mid) + ")\"");
  return s;
}

// Appends ticks until the last one reaches `value`, so the axis holds the tallest bar.
void extend_to(std::vector<double>& ticks, double value) {
  const double step = ticks.size() > 1 ? ticks[1] - ticks[0] : 1.0;
  while (ticks.back() < value) ticks.push_back(ticks.back() + step);
}

}  // namespace

std::string xml_escape(const std::string& text) {
  // The five predefined entities. Control characters other than tab and newline are not
  // allowed in XML 1.0 at all: they become spaces.
  static const std::string kSpecial = "&<>\"'";
  static const char* const kEntity[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const size_t special = kSpecial.find(c);
    if (special != std::string::npos) {
      out += kEntity[special];
    } else {
      out.push_back(static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' ? ' ' : c);
    }
  }
  return out;
}

std::vector<HistogramBin> integer_histogram(const std::vector<int64_t>& values, int max_bins) {
  THDCP_CHECK(!values.empty(), "histogram of no values: there is nothing to plot");
  THDCP_CHECK(max_bins >= 1, "max_bins=" << max_bins << " must be >= 1");
  const auto [min_it, max_it] = std::minmax_element(values.begin(), values.end());
  const int64_t lo = *min_it;
  const int64_t span = *max_it - lo + 1;
  const int64_t bin_width = (span + max_bins - 1) / max_bins;
  const int64_t bins = (span + bin_width - 1) / bin_width;
  std::vector<HistogramBin> out(static_cast<size_t>(bins));
  for (int64_t i = 0; i < bins; ++i) {
    out[static_cast<size_t>(i)].lo = lo + i * bin_width;
    out[static_cast<size_t>(i)].hi = lo + (i + 1) * bin_width - 1;
  }
  for (int64_t v : values) ++out[static_cast<size_t>((v - lo) / bin_width)].count;
  return out;
}

std::vector<double> nice_ticks(double lo, double hi, int target, double min_step) {
  THDCP_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, "tick range [" << lo << ", " << hi << "] is empty");
  target = std::max(target, 1);
  const double raw = (hi - lo) / target;
  double step = min_step > 0 ? min_step : 1.0;
  if (raw > 0) {
    const double power = std::pow(10.0, std::floor(std::log10(raw)));
    const double fraction = raw / power;
    step = (fraction <= 1 ? 1 : fraction <= 2 ? 2 : fraction <= 5 ? 5 : 10) * power;
  }
  step = std::max(step, min_step);
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step - 1e-9) * step; t <= hi + step * 1e-9; t += step) ticks.push_back(t);
  if (ticks.empty()) ticks.push_back(lo);
  return ticks;
}

SvgPanel histogram_panel(const HistogramSpec& spec, double width, double height) {
  const std::vector<HistogramBin> bins = integer_histogram(spec.values, spec.max_bins);
  int64_t tallest = 0;
  for (const HistogramBin& b : bins) tallest = std::max(tallest, b.count);

  const double data_lo = static_cast<double>(bins.front().lo) - 0.5;
  const double data_hi = static_cast<double>(bins.back().hi) + 0.5;
  // Markers near the data widen the axis; those far to the right would squash the bars.
  const double reach = data_hi + 0.5 * std::max(data_hi - data_lo, 2.0);
  double x_lo = data_lo, x_hi = data_hi;
  for (const PlotMarker& m : spec.markers) {
    if (m.x <= reach) {
      x_lo = std::min(x_lo, m.x - 0.5);
      x_hi = std::max(x_hi, m.x + 0.5);
    }
  }
  std::vector<double> y_ticks = nice_ticks(0, static_cast<double>(tallest), 5, 1);
  extend_to(y_ticks, static_cast<double>(tallest));
  const int64_t label_rows = std::min<int64_t>(static_cast<int64_t>(spec.markers.size()), 4);
  Frame f{70, 40.0 + 16.0 * static_cast<double>(label_rows), width - 30, height - 55, x_lo, x_hi, 0, y_ticks.back()};
  const std::vector<double> x_ticks = nice_ticks(std::ceil(x_lo), std::floor(x_hi), 8, 1);

  SvgPanel panel;
  panel.width = width;
  panel.height = height;
  std::string& s = panel.body;
  s += draw_axes(f, spec.title, spec.x_label, spec.y_label, x_ticks, y_ticks, width);
  for (const HistogramBin& b : bins) {
    if (b.count == 0) continue;
    const double x0 = f.px(static_cast<double>(b.lo) - 0.5);
    const double x1 = f.px(static_cast<double>(b.hi) + 0.5);
    const double y = f.py(static_cast<double>(b.count));
    const std::string range = b.lo == b.hi ? std::to_string(b.lo) : std::to_string(b.lo) + "-" + std::to_string(b.hi);
    s += "<rect class=\"bar\" x=\"" + num(x0) + "\" y=\"" + num(y) + "\" width=\"" + num(std::max(x1 - x0 - 1, 0.5)) +
         "\" height=\"" + num(f.bottom - y) + "\" fill=\"#4c78a8\"><title>" + xml_escape(range) + ": " +
         std::to_string(b.count) + "</title></rect>\n";
  }
  for (size_t i = 0; i < spec.markers.size(); ++i) {
    const PlotMarker& m = spec.markers[i];
    const std::string color = kPalette[i % kPaletteSize];
    const bool off_scale = m.x > reach;
    const double x = off_scale ? f.right : f.px(m.x);
    const double label_y = 36.0 + 16.0 * static_cast<double>(i % 4);
    s += line_element(x, label_y + 4, x, f.bottom,
                      "class=\"marker\" stroke=\"" + color + "\" stroke-width=\"2\"" +
                          (off_scale ? " stroke-dasharray=\"2,3\"" : " stroke-dasharray=\"6,3\""));
    // Labels right of the line, or left of it near the right edge, so they stay inside.
    const bool left_side = x > f.left + 0.6 * (f.right - f.left);
    const std::string label = off_scale ? m.label + " (off scale) \u2192" : m.label;
    s += text_element(left_side ? x - 4 : x + 4, label_y + 2, label,
                      std::string("class=\"marker-label\" fill=\"") + color + "\" text-anchor=\"" +
                          (left_side ? "end" : "start") + "\"");
  }
  return panel;
}

SvgPanel bar_chart_panel(const BarChartSpec& spec, double width, double height) {
  THDCP_CHECK(!spec.groups.empty(), "bar chart '" << spec.title << "' has no groups");
  double tallest = spec.has_reference ? spec.reference_value : 0;
  size_t bars = 0;
  for (const BarGroup& g : spec.groups) {
    THDCP_CHECK(!g.values.empty(), "bar chart '" << spec.title << "': group '" << g.label << "' has no bars");
    for (double v : g.values) {
      THDCP_CHECK(std::isfinite(v) && v >= 0,
                  "bar chart '" << spec.title << "': group '" << g.label << "' has bar value " << v
                                << "; bars need finite values >= 0");
      tallest = std::max(tallest, v);
    }
    bars += g.values.size();
  }
  std::vector<double> y_ticks = nice_ticks(0, tallest > 0 ? tallest * 1.08 : 1, 5);
  extend_to(y_ticks, tallest * 1.08);
  Frame f{70, 58, width - 30, height - 55, 0, 1, 0, y_ticks.back()};

  SvgPanel panel;
  panel.width = width;
  panel.height = height;
  std::string& s = panel.body;
  s += draw_axes(f, spec.title, spec.x_label, spec.y_label, {}, y_ticks, width);
  // Every bar gets the same width; groups are separated by a gap of two bars.
  const double gap = 2;
  const double slots = static_cast<double>(bars) + gap * static_cast<double>(spec.groups.size() + 1);
  const double bar_width = (f.right - f.left) / slots;
  double x = f.left + gap * bar_width;
  for (size_t gi = 0; gi < spec.groups.size(); ++gi) {
    const BarGroup& g = spec.groups[gi];
    const double group_left = x;
    const std::string color = kPalette[(gi + 2) % kPaletteSize];
    for (size_t i = 0; i < g.values.size(); ++i) {
      const double y = f.py(g.values[i]);
      s += "<rect class=\"bar\" x=\"" + num(x + 0.1 * bar_width) + "\" y=\"" + num(y) + "\" width=\"" +
           num(0.8 * bar_width) + "\" height=\"" + num(f.bottom - y) + "\" fill=\"" + color + "\"><title>" +
           xml_escape(g.label) + " #" + std::to_string(i) + ": " + tick_text(g.values[i]) + "</title></rect>\n";
      x += bar_width;
    }
    const double center = (group_left + x) / 2;
    s += text_element(center, f.bottom + 18, g.label, "class=\"group-label\" text-anchor=\"middle\"");
    if (!g.note.empty()) {
      // Alternate rows so the notes of narrow neighbouring groups do not overlap.
      s += text_element(center, f.top - 6 - 14 * static_cast<double>(gi % 2), g.note,
                        "class=\"group-note\" text-anchor=\"middle\" font-size=\"11\"");
    }
    x += gap * bar_width;
  }
  if (spec.has_reference) {
    const double y = f.py(spec.reference_value);
    s += line_element(f.left, y, f.right, y, "class=\"reference\" stroke=\"black\" stroke-dasharray=\"5,4\"");
    if (!spec.reference_label.empty()) {
      s += text_element(f.right, y - 4, spec.reference_label, "text-anchor=\"end\" font-size=\"11\"");
    }
  }
  return panel;
}

SvgPanel gantt_panel(const GanttSpec& spec, double width, double row_height) {
  THDCP_CHECK(!spec.rows.empty(), "timeline '" << spec.title << "' has no rows");
  double latest = 0;
  for (const GanttRow& row : spec.rows) {
    for (const GanttBar& bar : row.bars) {
      THDCP_CHECK(std::isfinite(bar.start) && std::isfinite(bar.end) && bar.start <= bar.end,
                  "timeline '" << spec.title << "': row '" << row.label << "' has a bar over [" << bar.start << ", "
                               << bar.end << "); bars need finite start <= end");
      THDCP_CHECK(std::find(spec.categories.begin(), spec.categories.end(), bar.category) != spec.categories.end(),
                  "timeline '" << spec.title << "': row '" << row.label << "' has a bar of category '" << bar.category
                               << "', which is not in its categories");
      latest = std::max(latest, bar.end);
    }
  }
  const double label_width = 150, legend_height = 24;
  const double top = 40 + legend_height;
  const double plot_height = row_height * static_cast<double>(spec.rows.size());
  std::vector<double> ticks = nice_ticks(0, latest > 0 ? latest : 1, 8);
  extend_to(ticks, latest);
  Frame f{label_width, top, width - 30, top + plot_height, 0, ticks.back(), 0, 1};

  SvgPanel panel;
  panel.width = width;
  panel.height = f.bottom + 50;
  std::string& s = panel.body;
  s += text_element(width / 2, 22, spec.title, "class=\"title\" text-anchor=\"middle\" font-size=\"14\"");
  // The legend: a swatch and a name per category, left to right.
  double x = label_width;
  for (size_t c = 0; c < spec.categories.size(); ++c) {
    s += "<rect x=\"" + num(x) + "\" y=\"" + num(34) + "\" width=\"12\" height=\"12\" fill=\"" +
         kPalette[c % kPaletteSize] + "\"/>\n";
    s += text_element(x + 16, 44, spec.categories[c], "class=\"legend\"");
    x += 24 + 7.5 * static_cast<double>(spec.categories[c].size());
  }
  for (double t : ticks) {
    s += line_element(f.px(t), f.top, f.px(t), f.bottom, "stroke=\"#dddddd\"");
    s += text_element(f.px(t), f.bottom + 16, tick_text(t), "text-anchor=\"middle\"");
  }
  s += text_element((f.left + f.right) / 2, f.bottom + 38, spec.x_label, "class=\"x-label\" text-anchor=\"middle\"");
  for (size_t r = 0; r < spec.rows.size(); ++r) {
    const GanttRow& row = spec.rows[r];
    const double y = f.top + row_height * static_cast<double>(r);
    s += text_element(f.left - 8, y + row_height * 0.65, row.label, "class=\"row-label\" text-anchor=\"end\"");
    s += line_element(f.left, y + row_height, f.right, y + row_height, "stroke=\"#eeeeee\"");
    for (const GanttBar& bar : row.bars) {
      const size_t c = static_cast<size_t>(
          std::find(spec.categories.begin(), spec.categories.end(), bar.category) - spec.categories.begin());
      char range[96];
      std::snprintf(range, sizeof(range), ": %.3f-%.3f (%.3f)", bar.start, bar.end, bar.end - bar.start);
      s += "<rect class=\"bar\" x=\"" + num(f.px(bar.start)) + "\" y=\"" + num(y + 3) + "\" width=\"" +
           num(std::max(f.px(bar.end) - f.px(bar.start), 0.5)) + "\" height=\"" + num(row_height - 6) + "\" fill=\"" +
           kPalette[c % kPaletteSize] + "\"><title>" + xml_escape(row.label + " " + bar.category + range) +
           "</title></rect>\n";
    }
  }
  s += line_element(f.left, f.top, f.left, f.bottom, "stroke=\"black\"");
  return panel;
}

std::string svg_document(const std::vector<SvgPanel>& panels) {
  double width = 0, height = 0;
  for (const SvgPanel& p : panels) {
    width = std::max(width, p.width);
    height += p.height;
  }
  std::string s = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(width) + "\" height=\"" + num(height) +
       "\" viewBox=\"0 0 " + num(width) + " " + num(height) +
       "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n";
  s += "<rect x=\"0\" y=\"0\" width=\"" + num(width) + "\" height=\"" + num(height) + "\" fill=\"white\"/>\n";
  double y = 0;
  for (const SvgPanel& p : panels) {
    s += "<g transform=\"translate(0 " + num(y) + ")\">\n" + p.body + "</g>\n";
    y += p.height;
  }
  return s + "</svg>\n";
}

}  // namespace thdcp::tools
