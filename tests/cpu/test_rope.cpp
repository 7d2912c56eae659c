// The CPU RoPE reference: hand-derived rotations of both layouts, partial rotary, backward
// undoing forward, the cos/sin table against theta, strided views (packed, head-major,
// interleaved), ranks against the split of the single-device result, untouched placeholder
// rows, and argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "support/expect_error.h"
#include "support/strided_views.h"
#include "thdcp/cpu/rope.h"
#include "thdcp/plan/rank_split.h"
#include "thdcp/testing/compare.h"
#include "thdcp/testing/workload.h"

namespace thdcp {
namespace {

bool same_bits(const HostTensor& a, const HostTensor& b) {
  return a.numel() == b.numel() && a.dtype() == b.dtype() &&
         std::memcmp(a.data(), b.data(), static_cast<size_t>(a.numel()) * dtype_size(a.dtype())) == 0;
}

HostTensor copy_of(const HostTensor& t) {
  HostTensor c(t.dtype(), t.tokens(), t.heads(), t.head_dim());
  std::memcpy(c.data(), t.data(), static_cast<size_t>(t.numel()) * dtype_size(t.dtype()));
  return c;
}

HostTensor random_tensor(DType dtype, int64_t rows, int64_t heads, int64_t head_dim, uint64_t seed) {
  HostTensor t(dtype, rows, heads, head_dim);
  fill_normal(t, seed);
  return t;
}

// One sequence of two tokens, head_dim 4, fp32: x = [1, 2, 3, 4] in both rows.
struct TwoRows {
  BatchLayout layout;
  HostTensor x;
  TwoRows() : x(DType::kFloat32, 2, 1, 4) {
    layout.cu_seqlens = {0, 2};
    layout.cu_seqlens_padded = {0, 2};
    for (int row = 0; row < 2; ++row) {
      for (int d = 0; d < 4; ++d) x.set(row * 4 + d, static_cast<float>(d + 1));
    }
  }
};

TEST(CpuRope, HandDerivedRotationFromTheta) {
  // rotary_dim 4, theta 10000: inv_freq = {1, 0.01}. Row 0 has position 0 (unchanged), row 1
  // position 1: pair 0 turns by 1 rad, pair 1 by 0.01 rad.
  const double c0 = std::cos(1.0), s0 = std::sin(1.0), c1 = std::cos(0.01), s1 = std::sin(0.01);
  struct Case {
    RopeLayout layout;
    double expected[4];
  };
  const Case cases[] = {
      // half-split: pairs (x0, x2) = (1, 3) and (x1, x3) = (2, 4)
      {RopeLayout::kHalfSplit, {1 * c0 - 3 * s0, 2 * c1 - 4 * s1, 3 * c0 + 1 * s0, 4 * c1 + 2 * s1}},
      // interleaved: pairs (x0, x1) = (1, 2) and (x2, x3) = (3, 4)
      {RopeLayout::kInterleaved, {1 * c0 - 2 * s0, 2 * c0 + 1 * s0, 3 * c1 - 4 * s1, 4 * c1 + 3 * s1}},
  };
  for (const Case& c : cases) {
    TwoRows t;
    cpu::rope_forward(t.layout.view(), 1, 0, RopeConfig{c.layout, 0, 10000.0f}, t.x.view());
    for (int d = 0; d < 4; ++d) {
      EXPECT_EQ(t.x.get(d), static_cast<float>(d + 1)) << "position 0 must not rotate";
      EXPECT_NEAR(t.x.get(4 + d), c.expected[d], 1e-6) << "layout " << static_cast<int>(c.layout) << " d " << d;
    }
  }
}

TEST(CpuRope, HandDerivedRotationFromTable) {
  // Exact binary values: at position 1, pair 0 turns by 90 degrees (cos 0, sin 1), pair 1
  // gets cos 0.5, sin -0.5 (not a rotation, but it checks the formula's signs exactly).
  const float cos[4] = {1.0f, 1.0f, 0.0f, 0.5f};
  const float sin[4] = {0.0f, 0.0f, 1.0f, -0.5f};
  const RopeTable table{cos, sin, 2};
  struct Case {
    RopeLayout layout;
    float expected[4];
  };
  const Case cases[] = {
      // (x0, x2) = (1, 3) -> (-3, 1); (x1, x3) = (2, 4) -> (1 + 2, 2 - 1) = (3, 1)
      {RopeLayout::kHalfSplit, {-3.0f, 3.0f, 1.0f, 1.0f}},
      // (x0, x1) = (1, 2) -> (-2, 1); (x2, x3) = (3, 4) -> (1.5 + 2, 2 - 1.5) = (3.5, 0.5)
      {RopeLayout::kInterleaved, {-2.0f, 1.0f, 3.5f, 0.5f}},
  };
  for (const Case& c : cases) {
    TwoRows t;
    cpu::rope_forward(t.layout.view(), 1, 0, RopeConfig{c.layout}, t.x.view(), nullptr, table);
    for (int d = 0; d < 4; ++d) {
      EXPECT_EQ(t.x.get(d), static_cast<float>(d + 1));
      EXPECT_EQ(t.x.get(4 + d), c.expected[d]) << "layout " << static_cast<int>(c.layout) << " d " << d;
    }
    // The backward turns the other way: back to [1, 2, 3, 4] for the true rotation (pair 0).
    cpu::rope_backward(t.layout.view(), 1, 0, RopeConfig{c.layout}, t.x.view(), nullptr, table);
    const int second = c.layout == RopeLayout::kHalfSplit ? 2 : 1;  // pair 0 is (0, second)
    EXPECT_EQ(t.x.get(4), 1.0f);
    EXPECT_EQ(t.x.get(4 + second), static_cast<float>(second + 1));
  }
}

// A batch in capacity form for cp, with placeholders and slack rows.
BatchLayout test_layout(int cp) {
  const std::vector<int64_t> lengths = {13, 0, 1, 40, 7};
  const BatchLayout dense = make_layout(lengths, cp);
  return make_layout(lengths, cp, Capacity{8, dense.total_rows() + 4 * cp});
}

std::vector<int32_t> test_offsets(int max_seqs) {
  std::vector<int32_t> offsets;
  for (int b = 0; b < max_seqs; ++b) offsets.push_back(37 * b + 5);
  return offsets;
}

TEST(CpuRope, PartialRotaryEqualsFullRotaryOfTheLeadingElementsAndKeepsTheTail) {
  const BatchLayout layout = test_layout(2);
  for (RopeLayout pairs : {RopeLayout::kInterleaved, RopeLayout::kHalfSplit}) {
    const int64_t rows = layout.total_rows() / 2, heads = 3, head_dim = 24, rotary_dim = 8;
    HostTensor x = random_tensor(DType::kBFloat16, rows, heads, head_dim, 11);
    const HostTensor before = copy_of(x);
    HostTensor lead(DType::kBFloat16, rows, heads, rotary_dim);
    for (int64_t r = 0; r < rows * heads; ++r) {
      for (int64_t d = 0; d < rotary_dim; ++d) lead.set(r * rotary_dim + d, x.get(r * head_dim + d));
    }
    cpu::rope_forward(layout.view(), 2, 1, RopeConfig{pairs, rotary_dim}, x.view());
    cpu::rope_forward(layout.view(), 2, 1, RopeConfig{pairs, 0}, lead.view());
    for (int64_t r = 0; r < rows * heads; ++r) {
      for (int64_t d = 0; d < rotary_dim; ++d) {
        ASSERT_EQ(x.get(r * head_dim + d), lead.get(r * rotary_dim + d)) << "row*head " << r << " d " << d;
      }
      for (int64_t d = rotary_dim; d < head_dim; ++d) {
        ASSERT_EQ(x.get(r * head_dim + d), before.get(r * head_dim + d)) << "tail changed: row*head " << r;
      }
    }
  }
}

TEST(CpuRope, BackwardUndoesForward) {
  const BatchLayout layout = test_layout(4);
  const std::vector<int32_t> offsets = test_offsets(layout.num_seqs());
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (RopeLayout pairs : {RopeLayout::kInterleaved, RopeLayout::kHalfSplit}) {
      HostTensor x = random_tensor(dtype, layout.total_rows() / 4, 2, 32, 5);
      const HostTensor before = copy_of(x);
      const RopeConfig config{pairs, 0, 500.0f};
      cpu::rope_forward(layout.view(), 4, 2, config, x.view(), offsets.data());
      EXPECT_FALSE(same_bits(x, before)) << "the forward must rotate something";
      cpu::rope_backward(layout.view(), 4, 2, config, x.view(), offsets.data());
      // Two roundings to storage (each u relative to a pair's norm) and a few fp32 ulp.
      const double u = dtype_unit_roundoff(dtype);
      const Comparison c = compare_values(x.data(), dtype, before.data(), dtype, x.numel(), Tolerance{2 * u, 4 * u});
      EXPECT_TRUE(c.passed()) << dtype_name(dtype) << ": " << c.summary();
    }
  }
}

TEST(CpuRope, TableBuiltFromThetaGivesTheSameBits) {
  const BatchLayout layout = test_layout(2);
  const std::vector<int32_t> offsets = test_offsets(layout.num_seqs());
  for (RopeLayout pairs : {RopeLayout::kInterleaved, RopeLayout::kHalfSplit}) {
    const RopeConfig config{pairs, 16, 10000.0f};
    const int64_t head_dim = 32, rows = 2000;
    std::vector<float> cos(static_cast<size_t>(rows * 8)), sin(cos.size());
    cpu::rope_table(config, head_dim, rows, cos.data(), sin.data());
    for (int rank = 0; rank < 2; ++rank) {
      HostTensor from_theta = random_tensor(DType::kFloat16, layout.total_rows() / 2, 4, head_dim, 3 + rank);
      HostTensor from_table = copy_of(from_theta);
      cpu::rope_forward(layout.view(), 2, rank, config, from_theta.view(), offsets.data());
      cpu::rope_forward(layout.view(), 2, rank, config, from_table.view(), offsets.data(),
                        RopeTable{cos.data(), sin.data(), rows});
      EXPECT_TRUE(same_bits(from_theta, from_table)) << "rank " << rank;
    }
  }
}

TEST(CpuRope, StridedViewsOfPackedQkvEqualContiguousTensors) {
  const BatchLayout layout = test_layout(2);
  const int64_t rows = layout.total_rows() / 2, q_heads = 4, kv_heads = 2, head_dim = 16;
  const int64_t all_heads = q_heads + 2 * kv_heads;
  HostTensor qkv = random_tensor(DType::kBFloat16, rows, all_heads, head_dim, 21);
  const HostTensor before = copy_of(qkv);
  // Contiguous copies of the q and k heads.
  HostTensor q(DType::kBFloat16, rows, q_heads, head_dim), k(DType::kBFloat16, rows, kv_heads, head_dim);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t d = 0; d < q_heads * head_dim; ++d) {
      q.set(r * q_heads * head_dim + d, qkv.get(r * all_heads * head_dim + d));
    }
    for (int64_t d = 0; d < kv_heads * head_dim; ++d) {
      k.set(r * kv_heads * head_dim + d, qkv.get(r * all_heads * head_dim + q_heads * head_dim + d));
    }
  }
  const RopeConfig config{RopeLayout::kHalfSplit, 12};
  const size_t element = dtype_size(DType::kBFloat16);
  ThdTensor q_view{qkv.data(), DType::kBFloat16, rows, q_heads, head_dim, all_heads * head_dim, head_dim};
  ThdTensor k_view{static_cast<unsigned char*>(qkv.data()) + q_heads * head_dim * element, DType::kBFloat16, rows,
                   kv_heads, head_dim, all_heads * head_dim, head_dim};
  cpu::rope_forward(layout.view(), 2, 0, config, q_view);
  cpu::rope_forward(layout.view(), 2, 0, config, k_view);
  cpu::rope_forward(layout.view(), 2, 0, config, q.view());
  cpu::rope_forward(layout.view(), 2, 0, config, k.view());
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = r * all_heads * head_dim;
    for (int64_t d = 0; d < q_heads * head_dim; ++d) ASSERT_EQ(qkv.get(base + d), q.get(r * q_heads * head_dim + d));
    for (int64_t d = 0; d < kv_heads * head_dim; ++d) {
      ASSERT_EQ(qkv.get(base + q_heads * head_dim + d), k.get(r * kv_heads * head_dim + d));
    }
    for (int64_t d = (q_heads + kv_heads) * head_dim; d < all_heads * head_dim; ++d) {
      ASSERT_EQ(qkv.get(base + d), before.get(base + d)) << "v changed at row " << r;
    }
  }
}

// Head-major views ([H, T, D] memory: row stride D, head stride of a longer cache's rows) and
// rows interleaved with heads rotate like contiguous tensors, bit for bit, and leave the
// memory between their elements alone.
TEST(CpuRope, HeadMajorAndInterleavedViewsEqualContiguousTensors) {
  const BatchLayout layout = test_layout(2);
  const int64_t rows = layout.total_rows() / 2, heads = 2, head_dim = 16;
  for (test::Arrangement arrangement : test::all_arrangements()) {
    SCOPED_TRACE(test::arrangement_name(arrangement));
    for (RopeLayout pairs : {RopeLayout::kHalfSplit, RopeLayout::kInterleaved}) {
      const RopeConfig config{pairs, 12};
      const HostTensor x = random_tensor(DType::kBFloat16, rows, heads, head_dim, 31);
      HostTensor expected = copy_of(x);
      cpu::rope_forward(layout.view(), 2, 1, config, expected.view());
      const test::GroupLayout g = test::arrange(arrangement, rows, {heads}, head_dim);
      std::vector<unsigned char> image = test::poisoned_image(DType::kBFloat16, g.elements);
      const ThdTensor view = test::placed_view(image.data(), DType::kBFloat16, rows, heads, head_dim, g.placements[0]);
      test::scatter_into(x, view);
      cpu::rope_forward(layout.view(), 2, 1, config, view);
      EXPECT_TRUE(same_bits(test::gather_from(view), expected));
      EXPECT_TRUE(test::poison_kept_outside(image, {view}));
      cpu::rope_backward(layout.view(), 2, 1, config, view);
      HostTensor undone = copy_of(expected);
      cpu::rope_backward(layout.view(), 2, 1, config, undone.view());
      EXPECT_TRUE(same_bits(test::gather_from(view), undone));
    }
  }
}

void expect_ranks_equal_the_split(const BatchLayout& layout, int cp, CpLayout cp_layout) {
  const std::vector<int32_t> offsets = test_offsets(layout.num_seqs());
  for (RopeLayout pairs : {RopeLayout::kInterleaved, RopeLayout::kHalfSplit}) {
    const RopeConfig config{pairs, 0, 10000.0f};
    const HostTensor input = random_tensor(DType::kBFloat16, layout.total_rows(), 2, 16, 100 + cp);
    HostTensor global = copy_of(input);
    cpu::rope_forward(layout.view(), 1, 0, config, global.view(), offsets.data());
    for (int rank = 0; rank < cp; ++rank) {
      HostTensor local(DType::kBFloat16, layout.total_rows() / cp, 2, 16), expected = copy_of(local);
      split_for_rank(input.data(), local.data(), input.row_bytes(), layout.view(), cp, rank, cp_layout);
      split_for_rank(global.data(), expected.data(), global.row_bytes(), layout.view(), cp, rank, cp_layout);
      cpu::rope_forward(layout.view(), cp, rank, config, local.view(), offsets.data(), {}, cp_layout);
      EXPECT_TRUE(same_bits(local, expected)) << "rank " << rank;
    }
    // Rows of empty sequences (placeholders and the slack at the end) keep their values.
    for (int b = 0; b < layout.num_seqs(); ++b) {
      if (layout.cu_seqlens[b + 1] != layout.cu_seqlens[b]) continue;
      for (int64_t row = layout.cu_seqlens_padded[b]; row < layout.cu_seqlens_padded[b + 1]; ++row) {
        for (int64_t e = 0; e < 32; ++e) ASSERT_EQ(global.get(row * 32 + e), input.get(row * 32 + e)) << row;
      }
    }
  }
}

// Every rank's rotation of its local rows equals its rows of the single-device rotation of
// the whole batch, bit for bit, under either CP layout (a contiguous piece may start inside a
// document); rows of empty sequences stay as they were.
TEST(CpuRope, RanksEqualTheSplitOfTheSingleDeviceResult) {
  for (int cp : {1, 2, 3, 4}) {
    for (CpLayout cp_layout : {CpLayout::kDualChunk, CpLayout::kContiguous}) {
      SCOPED_TRACE("cp " + std::to_string(cp) + " " + cp_layout_name(cp_layout));
      const BatchLayout layout =
          cp_layout == CpLayout::kDualChunk ? test_layout(cp) : make_contiguous_layout({13, 0, 1, 40, 7, 0}, cp);
      expect_ranks_equal_the_split(layout, cp, cp_layout);
    }
  }
}

TEST(CpuRope, BadArgumentsThrowBeforeWriting) {
  const BatchLayout layout = test_layout(2);
  HostTensor x = random_tensor(DType::kBFloat16, layout.total_rows() / 2, 2, 16, 1);
  const HostTensor before = copy_of(x);
  const LayoutView view = layout.view();
  const RopeConfig config;
  EXPECT_THDCP_ERROR(cpu::rope_forward(view, 0, 0, config, x.view()), "cp=0 must be >= 1");
  EXPECT_THDCP_ERROR(cpu::rope_forward(view, 2, 2, config, x.view()), "rank=2 must be in [0, cp=2)");
  EXPECT_THDCP_ERROR(cpu::rope_forward(view, 2, 0, RopeConfig{RopeLayout::kHalfSplit, 5}, x.view()),
                     "RopeConfig::rotary_dim=5");
  EXPECT_THDCP_ERROR(cpu::rope_forward(view, 2, 0, RopeConfig{RopeLayout::kHalfSplit, 0, -1.0f}, x.view()),
                     "RopeConfig::theta=-1");
  EXPECT_THDCP_ERROR(cpu::rope_forward(view, 1, 0, config, x.view()), "pass the rank's local tensor");
  ThdTensor overlapping = x.view();
  overlapping.head_stride = 8;
  test::expect_error([&] { cpu::rope_forward(view, 2, 0, config, overlapping); },
                     {"x is [", ", 2, 16] with row_stride=32 and head_stride=8: its elements (row 0, head 0, d 8) and "
                                "(row 0, head 1, d 0) share an address, and an output must not overlap itself"});
  ThdTensor no_data = x.view();
  no_data.data = nullptr;
  EXPECT_THDCP_ERROR(cpu::rope_forward(view, 2, 0, config, no_data), "x has no data");
  // A layout that cp = 2 cannot split (a padded length of 6 is not a multiple of 4).
  BatchLayout odd;
  odd.cu_seqlens = {0, 5, 8};
  odd.cu_seqlens_padded = {0, 6, 8};
  HostTensor small(DType::kBFloat16, 4, 2, 16);
  EXPECT_THDCP_ERROR(cpu::rope_forward(odd.view(), 2, 0, config, small.view()), "is not a multiple of 2*cp=4");
  // A table too short for the offsets: nothing is written.
  const int64_t table_rows = 64;
  std::vector<float> cos(static_cast<size_t>(table_rows * 8)), sin(cos.size());
  cpu::rope_table(config, 16, table_rows, cos.data(), sin.data());
  const std::vector<int32_t> offsets = test_offsets(layout.num_seqs());
  EXPECT_THDCP_ERROR(cpu::rope_forward(view, 2, 0, config, x.view(), offsets.data(),
                                       RopeTable{cos.data(), sin.data(), table_rows}),
                     "outside the cos/sin table of 64 rows");
  EXPECT_THDCP_ERROR(cpu::rope_forward(view, 2, 0, config, x.view(), nullptr, RopeTable{cos.data(), nullptr, 4}),
                     "give both (a table) or neither");
  EXPECT_TRUE(same_bits(x, before)) << "a failed call wrote into x";
  EXPECT_THDCP_ERROR(cpu::rope_table(config, 16, -1, cos.data(), sin.data()), "rows=-1 must be >= 0");
}

}  // namespace
}  // namespace thdcp
