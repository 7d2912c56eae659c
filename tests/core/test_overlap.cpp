// The overlap check of THD views (thdcp/core/overlap.h): its answers against brute force
// (every element's address listed) over every small shape and stride, its witnesses, and the
// messages of check_outputs_apart.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "support/expect_error.h"
#include "thdcp/core/overlap.h"
#include "thdcp/testing/workload.h"

namespace thdcp {
namespace {

int64_t offset_of(int64_t row, int64_t head, int64_t d, int64_t row_stride, int64_t head_stride) {
  return row * row_stride + head * head_stride + d;
}

// Whether two elements of the view share an address, by listing them all.
bool brute_self_overlap(int64_t rows, int64_t heads, int64_t head_dim, int64_t row_stride, int64_t head_stride) {
  std::set<int64_t> seen;
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t d = 0; d < head_dim; ++d) {
        if (!seen.insert(offset_of(t, h, d, row_stride, head_stride)).second) return true;
      }
    }
  }
  return false;
}

// The truth table: every shape up to 5 rows, 4 heads, head_dim 3 and every pair of strides up
// to 14 (0 included: coinciding rows or heads), against brute force; a collision's witness is
// two distinct in-range elements at one address.
TEST(SelfOverlap, ExactOnEverySmallShapeAndStride) {
  int injective = 0, overlapping = 0;
  for (int64_t rows = 0; rows <= 5; ++rows) {
    for (int64_t heads = 0; heads <= 4; ++heads) {
      for (int64_t head_dim = 1; head_dim <= 3; ++head_dim) {
        for (int64_t row_stride = 0; row_stride <= 14; ++row_stride) {
          for (int64_t head_stride = 0; head_stride <= 14; ++head_stride) {
            const bool expected = brute_self_overlap(rows, heads, head_dim, row_stride, head_stride);
            const std::optional<ElementCollision> hit = thd_self_overlap(rows, heads, head_dim, row_stride, head_stride);
            ASSERT_EQ(hit.has_value(), expected)
                << "rows " << rows << " heads " << heads << " head_dim " << head_dim << " row_stride " << row_stride
                << " head_stride " << head_stride;
            if (!hit) {
              ++injective;
              continue;
            }
            ++overlapping;
            for (int i = 0; i < 2; ++i) {
              ASSERT_TRUE(hit->row[i] >= 0 && hit->row[i] < rows && hit->head[i] >= 0 && hit->head[i] < heads &&
                          hit->d[i] >= 0 && hit->d[i] < head_dim);
            }
            ASSERT_TRUE(hit->row[0] != hit->row[1] || hit->head[0] != hit->head[1] || hit->d[0] != hit->d[1]);
            ASSERT_EQ(offset_of(hit->row[0], hit->head[0], hit->d[0], row_stride, head_stride),
                      offset_of(hit->row[1], hit->head[1], hit->d[1], row_stride, head_stride));
          }
        }
      }
    }
  }
  EXPECT_GT(injective, 1000);  // both answers occur often: the table can fail either way
  EXPECT_GT(overlapping, 1000);
}

// The layouts the library serves: row-major with padding, packed QKV, head-major (heads before
// rows: transformers' KV cache), rows interleaved with heads, and single rows and heads whose
// unused stride is anything.
TEST(SelfOverlap, NamedLayouts) {
  constexpr int64_t T = 1000, H = 8, D = 64;
  EXPECT_FALSE(thd_self_overlap(T, H, D, H * D, D));                // contiguous
  EXPECT_FALSE(thd_self_overlap(T, H, D, H * (D + 8) + 16, D + 8));  // padded heads and rows
  EXPECT_FALSE(thd_self_overlap(T, H, D, 3 * H * D, D));            // a view of packed QKV
  EXPECT_FALSE(thd_self_overlap(T, H, D, D, T * D));                // head-major [H, T, D]
  EXPECT_FALSE(thd_self_overlap(T, H, D, D, 4096 * D));             // head-major slice of a longer cache
  EXPECT_FALSE(thd_self_overlap(T, 2, 8, 16, 24));                  // head 1 of row t in row t+1's gap
  EXPECT_FALSE(thd_self_overlap(1, H, D, 0, D));                    // one row: its stride unused
  EXPECT_FALSE(thd_self_overlap(T, 1, D, D, 0));                    // one head: its stride unused
  EXPECT_TRUE(thd_self_overlap(T, H, D, D, T * D - 1));             // head-major, one element short
  EXPECT_TRUE(thd_self_overlap(T, H, D, H * D - 8, D));             // rows 8 elements short
  EXPECT_TRUE(thd_self_overlap(T, H, D, H * D, D - 1));             // heads overlap
  EXPECT_TRUE(thd_self_overlap(T, 2, 8, 16, 32));                   // head 1 of row t is row t+2's head 0
  // Large strides: the products do not wrap.
  EXPECT_FALSE(thd_self_overlap(3, 2, 8, int64_t{1} << 61, int64_t{1} << 40));
  EXPECT_TRUE(thd_self_overlap(3, 3, 8, int64_t{1} << 41, int64_t{1} << 40));
}

// Brute force over bytes: whether any byte of a is a byte of b.
bool brute_views_overlap(const ConstThdTensor& a, const ConstThdTensor& b) {
  std::set<uintptr_t> bytes;
  auto each_byte = [](const ConstThdTensor& t, auto&& fn) {
    const size_t e = dtype_size(t.dtype);
    for (int64_t r = 0; r < t.tokens; ++r) {
      for (int64_t h = 0; h < t.heads; ++h) {
        for (int64_t d = 0; d < t.head_dim; ++d) {
          const uintptr_t start = reinterpret_cast<uintptr_t>(t.data) +
                                  static_cast<uintptr_t>(offset_of(r, h, d, t.row_step(), t.head_step())) * e;
          for (size_t i = 0; i < e; ++i) fn(start + i);
        }
      }
    }
  };
  each_byte(a, [&](uintptr_t p) { bytes.insert(p); });
  bool shared = false;
  each_byte(b, [&](uintptr_t p) { shared = shared || bytes.count(p) > 0; });
  return shared;
}

// Random pairs of small views in one buffer: views of one element size and strides are
// decided exactly (with a valid witness); others are proven apart when their ranges are, and
// otherwise reported unproven, never "apart" while they overlap.
TEST(ViewsOverlap, ExactForSameStridesAndNeverWrongOtherwise) {
  static unsigned char buffer[4096];
  Rng rng(29);
  int exact_overlap = 0, exact_apart = 0, unproven = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const bool same_strides = trial % 2 == 0;
    auto random_view = [&](int64_t row_stride, int64_t head_stride, DType dtype) {
      ConstThdTensor t;
      t.dtype = dtype;
      t.tokens = 1 + static_cast<int64_t>(rng.next() % 4);
      t.heads = 1 + static_cast<int64_t>(rng.next() % 3);
      t.head_dim = 1 + static_cast<int64_t>(rng.next() % 4);
      t.row_stride = row_stride;
      t.head_stride = head_stride;
      t.data = buffer + rng.next() % 200;
      return t;
    };
    const int64_t rs = 1 + static_cast<int64_t>(rng.next() % 16), hs = 1 + static_cast<int64_t>(rng.next() % 16);
    const DType dtype_a = rng.next() % 3 == 0 ? DType::kFloat32 : DType::kBFloat16;
    const ConstThdTensor a = random_view(rs, hs, dtype_a);
    const ConstThdTensor b =
        same_strides ? random_view(rs, hs, dtype_a)
                     : random_view(1 + static_cast<int64_t>(rng.next() % 16), 1 + static_cast<int64_t>(rng.next() % 16),
                                   rng.next() % 2 ? DType::kFloat32 : DType::kBFloat16);
    const bool expected = brute_views_overlap(a, b);
    const ViewOverlapResult r = views_overlap(a, b);
    if (same_strides) {
      ASSERT_NE(r.kind, ViewOverlap::kUnproven) << "trial " << trial;
    }
    if (r.kind == ViewOverlap::kUnproven) {
      ++unproven;
      continue;
    }
    ASSERT_EQ(r.kind == ViewOverlap::kOverlap, expected) << "trial " << trial;
    if (r.kind == ViewOverlap::kApart) {
      ++exact_apart;
      continue;
    }
    ++exact_overlap;
    ASSERT_TRUE(r.a_row < a.tokens && r.a_head < a.heads && r.a_d < a.head_dim && r.b_row < b.tokens &&
                r.b_head < b.heads && r.b_d < b.head_dim && r.a_row >= 0 && r.b_row >= 0 && r.a_head >= 0 &&
                r.b_head >= 0 && r.a_d >= 0 && r.b_d >= 0)
        << "trial " << trial;
    const size_t e = dtype_size(a.dtype);
    const uintptr_t pa = reinterpret_cast<uintptr_t>(a.data) +
                         static_cast<uintptr_t>(offset_of(r.a_row, r.a_head, r.a_d, a.row_step(), a.head_step())) * e;
    const uintptr_t pb = reinterpret_cast<uintptr_t>(b.data) +
                         static_cast<uintptr_t>(offset_of(r.b_row, r.b_head, r.b_d, b.row_step(), b.head_step())) * e;
    ASSERT_TRUE(pa < pb + e && pb < pa + e) << "trial " << trial << ": the witness elements do not overlap";
  }
  EXPECT_GT(exact_overlap, 1000);
  EXPECT_GT(exact_apart, 1000);
  EXPECT_GT(unproven, 100);
}

// Views of one buffer that the calls take: q, k, v of a packed QKV are apart, as are the
// heads of a head-major buffer split between two views, and each of them overlaps a view of
// the whole buffer.
TEST(ViewsOverlap, PackedAndHeadMajorViewsOfOneBuffer) {
  static uint16_t qkv[40 * 12 * 16];
  const int64_t T = 40, D = 16;
  const ConstThdTensor q(qkv, DType::kBFloat16, T, 8, D, 12 * D, D), k(qkv + 8 * D, DType::kBFloat16, T, 2, D, 12 * D, D),
      v(qkv + 10 * D, DType::kBFloat16, T, 2, D, 12 * D, D), whole(qkv, DType::kBFloat16, T, 12, D);
  EXPECT_EQ(views_overlap(q, k).kind, ViewOverlap::kApart);
  EXPECT_EQ(views_overlap(k, v).kind, ViewOverlap::kApart);
  EXPECT_EQ(views_overlap(v, q).kind, ViewOverlap::kApart);
  const ViewOverlapResult hit = views_overlap(whole, v);
  EXPECT_EQ(hit.kind, ViewOverlap::kOverlap);
  // Head-major [12, T, D]: heads 0-7 and 8-11 as two views.
  const ConstThdTensor first(qkv, DType::kBFloat16, T, 8, D, D, T * D), rest(qkv + 8 * T * D, DType::kBFloat16, T, 4, D,
                                                                            D, T * D);
  EXPECT_EQ(views_overlap(first, rest).kind, ViewOverlap::kApart);
  // The same memory read row-major (other strides): not provable, reported as such.
  EXPECT_EQ(views_overlap(first, whole).kind, ViewOverlap::kUnproven);
}

// check_outputs_apart names the output, the colliding elements and what to change.
TEST(CheckOutputsApart, MessagesNameTheTensorsAndTheFix) {
  static uint16_t memory[8192];
  const ConstThdTensor q(memory, DType::kBFloat16, 64, 2, 16);
  const ConstThdTensor head_major(memory, DType::kBFloat16, 64, 4, 16, 16, 64 * 16);
  const ConstThdTensor short_heads(memory, DType::kBFloat16, 64, 4, 16, 16, 63 * 16);
  EXPECT_NO_THROW(check_outputs_apart({{"out", head_major}}, {}));
  test::expect_error([&] { check_outputs_apart({{"out", short_heads}}, {}); },
                     {"out is [64, 4, 16] with row_stride=16 and head_stride=1008: its elements (row ",
                      "share an address, and an output must not overlap itself",
                      "head_stride >= (rows - 1) * row_stride + head_dim = 1024 (heads after rows, head-major)"});
  test::expect_error([&] { check_outputs_apart({{"dq", q}}, {{"q", q}}); },
                     {"dq and q share memory: element (row 0, head 0, d 0) of dq overlaps element (row 0, head 0, d 0) "
                      "of q",
                      "give dq memory of its own"});
  const ConstThdTensor dk(memory + 4096, DType::kBFloat16, 8, 2, 16), dv(memory + 4096 + 8, DType::kBFloat16, 8, 2, 16);
  test::expect_error([&] { check_outputs_apart({{"dk", dk}, {"dv", dv}}, {}); }, {"dk and dv share memory"});
  const ConstThdTensor fp32(memory, DType::kFloat32, 8, 2, 16);
  test::expect_error([&] { check_outputs_apart({{"dq", fp32}}, {{"q", q}}); },
                     {"span intersecting address ranges with different strides or element sizes"});
  const ConstThdTensor negative(memory, DType::kBFloat16, 64, 2, 16, -32, 0);
  test::expect_error([&] { check_outputs_apart({}, {{"k", negative}}); },
                     {"k has row_stride=-32 and head_stride=0: strides are in elements, >= 0 (0 means contiguous)"});
  // Inputs may overlap each other and themselves.
  EXPECT_NO_THROW(check_outputs_apart({{"out", ConstThdTensor(memory + 2048, DType::kBFloat16, 8, 2, 16)}},
                                      {{"q", q}, {"k", q}, {"v", q}}));
}

}  // namespace
}  // namespace thdcp
