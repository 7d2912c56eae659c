// The overlap check of THD views (thdcp/core/overlap.h).
//
// Self-overlap, exactly. Take a view of T rows, H heads, D elements per head, element
// strides r (rows) and h (heads), d contiguous. Two index triples (t, g, d) != (t', g', d')
// collide iff t r + g h + d = t' r + g' h + d'. Their difference (a, b, c) is nonzero, has
// |a| <= T - 1, |b| <= H - 1, |c| <= D - 1 and a r + b h + c = 0; conversely every such
// (a, b, c) is the difference of two valid triples (t = max(a, 0), t' = max(-a, 0), and
// likewise for b and c). So the view overlaps itself iff such a nonzero (a, b, c) exists.
// Negating all three, the first nonzero of (a, b) may be taken positive (a = b = 0 forces
// c = 0). Hence a collision exists iff
//   (1) H >= 2 and h <= D - 1 (a = 0, b >= 1: b h + c = 0 with |c| <= D - 1 needs
//       b h <= D - 1, and then b = 1, c = -h is one), or
//   (2) some a in [1, T - 1] and b in [-(H - 1), H - 1] have |a r + b h| <= D - 1.
// (2) is decided by walking the shorter of the two ranges and, for each value, asking whether
// the other range holds a value in the interval that remains (solve() below): exact, in
// O(min(T, H)) steps. One row (T = 1) or one head (H = 1) falls out: its range is empty or
// {0}, and its stride is never applied.
//
// The familiar rule "the smaller stride's span fits within the larger" (with r >= h:
// h >= D and r >= (H - 1) h + D; head-major, h > r: r >= D and h >= (T - 1) r + D) is
// sufficient but not necessary: with H = 2, D = 8, h = 24, r = 16 head 1 of row t sits in
// the gap of row t + 1 and no two elements collide; this check accepts that view too.
//
// Two views a and b share a byte iff some element of a and some element of b do. With one
// element size e and the same strides r, h (of a dimension that both use), element offsets
// o_a of a and o_b of b (from their own bases, delta bytes apart) share a byte iff
// |e o_a - (delta + e o_b)| <= e - 1, i.e. o_a - o_b lies in [L, U] =
// [ceil((delta - e + 1) / e), floor((delta + e - 1) / e)], and o_a - o_b ranges over
// a r + b h + c with a in [-(T_b - 1), T_a - 1], b in [-(H_b - 1), H_a - 1],
// c in [-(D_b - 1), D_a - 1], each pair of index ranges independent: the same solve().
#include "thdcp/core/overlap.h"

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>

#include "thdcp/core/error.h"

namespace thdcp {

namespace {

using Wide = __int128;  // every product of a count and a stride fits

struct Range {
  Wide lo, hi;  // inclusive; empty when lo > hi
  bool empty() const { return lo > hi; }
};

Wide floor_div(Wide a, Wide b) {  // b > 0
  const Wide q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

Wide ceil_div(Wide a, Wide b) { return -floor_div(-a, b); }

// Some (x, y) in X x Y with lo <= x sx + y sy <= hi (sx, sy >= 0), walking the shorter range:
// for each x the y that qualify form the interval [ceil((lo - x sx) / sy), floor((hi - x sx) / sy)].
std::optional<std::pair<Wide, Wide>> solve(Range x_range, Wide sx, Range y_range, Wide sy, Wide lo, Wide hi) {
  if (x_range.empty() || y_range.empty() || lo > hi) return std::nullopt;
  const bool swapped = x_range.hi - x_range.lo > y_range.hi - y_range.lo;
  if (swapped) {
    std::swap(x_range, y_range);
    std::swap(sx, sy);
  }
  for (Wide x = x_range.lo; x <= x_range.hi; ++x) {
    const Wide low = lo - x * sx, high = hi - x * sx;  // y sy must lie in [low, high]
    Wide y_lo = y_range.lo, y_hi = y_range.hi;
    if (sy == 0) {
      if (low > 0 || high < 0) continue;
    } else {
      y_lo = std::max(y_lo, ceil_div(low, sy));
      y_hi = std::min(y_hi, floor_div(high, sy));
    }
    if (y_lo <= y_hi) return swapped ? std::make_pair(y_lo, x) : std::make_pair(x, y_lo);
  }
  return std::nullopt;
}

int64_t narrow(Wide x) { return static_cast<int64_t>(x); }

// The element offset of a view's last element: (T - 1) r + (H - 1) h + D - 1.
Wide last_offset(const ConstThdTensor& t) {
  return Wide{t.tokens - 1} * t.row_step() + Wide{t.heads - 1} * t.head_step() + t.head_dim - 1;
}

bool is_empty(const ConstThdTensor& t) {
  return t.tokens <= 0 || t.heads <= 0 || t.head_dim <= 0 || t.data == nullptr;
}

// The stride both views apply along a dimension, when they agree on it: the one of each
// view that has more than one index there (a dimension of one index never applies it).
std::optional<int64_t> common_stride(int64_t count_a, int64_t stride_a, int64_t count_b, int64_t stride_b) {
  if (count_a > 1 && count_b > 1) {
    if (stride_a != stride_b) return std::nullopt;
    return stride_a;
  }
  return count_a > 1 ? stride_a : count_b > 1 ? stride_b : 0;
}

std::string shape_text(const ConstThdTensor& t) {
  std::ostringstream s;
  s << "[" << t.tokens << ", " << t.heads << ", " << t.head_dim << "] with row_stride=" << t.row_step()
    << " and head_stride=" << t.head_step();
  return s.str();
}

}  // namespace

std::optional<ElementCollision> thd_self_overlap(int64_t rows, int64_t heads, int64_t head_dim, int64_t row_stride,
                                                 int64_t head_stride) {
  if (rows <= 0 || heads <= 0 || head_dim <= 0) return std::nullopt;
  THDCP_CHECK(row_stride >= 0 && head_stride >= 0,
              "thd_self_overlap: strides " << row_stride << ", " << head_stride << " must be >= 0");
  // (1): two heads of one row.
  if (heads >= 2 && head_stride <= head_dim - 1) return ElementCollision{{0, 0}, {0, 1}, {head_stride, 0}};
  // (2): some a >= 1 rows and b heads apart come within head_dim - 1 elements.
  const auto ab = solve(Range{1, Wide{rows} - 1}, row_stride, Range{-(Wide{heads} - 1), Wide{heads} - 1}, head_stride,
                        -(Wide{head_dim} - 1), Wide{head_dim} - 1);
  if (!ab) return std::nullopt;
  const Wide a = ab->first, b = ab->second;
  const Wide c = -(a * row_stride + b * head_stride);
  return ElementCollision{{narrow(a), 0},
                          {narrow(std::max<Wide>(b, 0)), narrow(std::max<Wide>(-b, 0))},
                          {narrow(std::max<Wide>(c, 0)), narrow(std::max<Wide>(-c, 0))}};
}

std::optional<ElementCollision> thd_self_overlap(const ConstThdTensor& t) {
  return thd_self_overlap(t.tokens, t.heads, t.head_dim, t.row_step(), t.head_step());
}

ViewOverlapResult views_overlap(const ConstThdTensor& a, const ConstThdTensor& b) {
  ViewOverlapResult result;
  if (is_empty(a) || is_empty(b)) return result;
  const Wide ea = dtype_size(a.dtype), eb = dtype_size(b.dtype);
  const Wide begin_a = static_cast<Wide>(reinterpret_cast<uintptr_t>(a.data));
  const Wide begin_b = static_cast<Wide>(reinterpret_cast<uintptr_t>(b.data));
  const Wide end_a = begin_a + ea * (last_offset(a) + 1), end_b = begin_b + eb * (last_offset(b) + 1);
  if (end_a <= begin_b || end_b <= begin_a) return result;

  const std::optional<int64_t> r = common_stride(a.tokens, a.row_step(), b.tokens, b.row_step());
  const std::optional<int64_t> h = common_stride(a.heads, a.head_step(), b.heads, b.head_step());
  if (ea != eb || !r || !h) {
    result.kind = ViewOverlap::kUnproven;
    return result;
  }
  const Wide e = ea, delta = begin_b - begin_a;
  const Wide lower = ceil_div(delta - e + 1, e), upper = floor_div(delta + e - 1, e);  // [L, U]
  const Wide c_lo = -(Wide{b.head_dim} - 1), c_hi = Wide{a.head_dim} - 1;
  const auto ab = solve(Range{-(Wide{b.tokens} - 1), Wide{a.tokens} - 1}, *r,
                        Range{-(Wide{b.heads} - 1), Wide{a.heads} - 1}, *h, lower - c_hi, upper - c_lo);
  if (!ab) return result;
  const Wide rows = ab->first, heads = ab->second;
  const Wide c = std::max(lower - (rows * *r + heads * *h), c_lo);
  result.kind = ViewOverlap::kOverlap;
  result.a_row = narrow(std::max<Wide>(rows, 0));
  result.b_row = narrow(std::max<Wide>(-rows, 0));
  result.a_head = narrow(std::max<Wide>(heads, 0));
  result.b_head = narrow(std::max<Wide>(-heads, 0));
  result.a_d = narrow(std::max<Wide>(c, 0));
  result.b_d = narrow(std::max<Wide>(-c, 0));
  return result;
}

void check_thd_strides(const char* name, const ConstThdTensor& t) {
  THDCP_CHECK(t.row_stride >= 0 && t.head_stride >= 0,
              name << " has row_stride=" << t.row_stride << " and head_stride=" << t.head_stride
                   << ": strides are in elements, >= 0 (0 means contiguous)");
}

namespace {

void check_self(const NamedView& output) {
  const ConstThdTensor& t = output.view;
  const std::optional<ElementCollision> hit = thd_self_overlap(t);
  if (!hit) return;
  THDCP_FAIL(output.name << " is " << shape_text(t) << ": its elements (row " << hit->row[0] << ", head "
                         << hit->head[0] << ", d " << hit->d[0] << ") and (row " << hit->row[1] << ", head "
                         << hit->head[1] << ", d " << hit->d[1]
                         << ") share an address, and an output must not overlap itself; pass strides that keep "
                            "its elements apart, e.g. row_stride >= (heads - 1) * head_stride + head_dim = "
                         << (t.heads - 1) * t.head_step() + t.head_dim
                         << " (rows after heads) or head_stride >= (rows - 1) * row_stride + head_dim = "
                         << (t.tokens - 1) * t.row_step() + t.head_dim << " (heads after rows, head-major)");
}

void check_pair(const NamedView& output, const NamedView& other) {
  const ViewOverlapResult r = views_overlap(output.view, other.view);
  if (r.kind == ViewOverlap::kApart) return;
  if (r.kind == ViewOverlap::kOverlap) {
    THDCP_FAIL(output.name << " and " << other.name << " share memory: element (row " << r.a_row << ", head "
                           << r.a_head << ", d " << r.a_d << ") of " << output.name << " overlaps element (row "
                           << r.b_row << ", head " << r.b_head << ", d " << r.b_d << ") of " << other.name
                           << ", and an output must not overlap another tensor of the call; give " << output.name
                           << " memory of its own");
  }
  const ConstThdTensor& a = output.view;
  const ConstThdTensor& b = other.view;
  THDCP_FAIL(output.name << " (" << a.data << ", " << dtype_name(a.dtype) << " " << shape_text(a) << ") and "
                         << other.name << " (" << b.data << ", " << dtype_name(b.dtype) << " " << shape_text(b)
                         << ") span intersecting address ranges with different strides or element sizes, so thdcp "
                            "cannot show that they do not overlap, and an output must not overlap another tensor "
                            "of the call; give "
                         << output.name << " memory of its own");
}

}  // namespace

void check_outputs_apart(std::initializer_list<NamedView> outputs, std::initializer_list<NamedView> inputs) {
  for (const NamedView& v : outputs) check_thd_strides(v.name, v.view);
  for (const NamedView& v : inputs) check_thd_strides(v.name, v.view);
  for (const NamedView& output : outputs) check_self(output);
  for (auto i = outputs.begin(); i != outputs.end(); ++i) {
    for (auto j = i + 1; j != outputs.end(); ++j) check_pair(*i, *j);
    for (const NamedView& input : inputs) check_pair(*i, input);
  }
}

}  // namespace thdcp
