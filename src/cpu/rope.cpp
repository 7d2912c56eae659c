// The CPU reference of RoPE: positions, frequencies and rotation from thdcp/plan/rope.h.
#include "thdcp/cpu/rope.h"

#include <cmath>
#include <vector>

#include "thdcp/core/error.h"
#include "thdcp/core/overlap.h"
#include "thdcp/plan/rank_split.h"

namespace thdcp::cpu {

namespace {

// inv_freq of every pair, computed once per call by the formula the CUDA plan uses too.
std::vector<float> inverse_frequencies(int64_t rotary_dim, float theta) {
  std::vector<float> inv_freq(static_cast<size_t>(rotary_dim / 2));
  for (int64_t i = 0; i < rotary_dim / 2; ++i) inv_freq[static_cast<size_t>(i)] = rope_inv_freq(i, rotary_dim, theta);
  return inv_freq;
}

// cos/sin of the theta path (fp32 cosf/sinf), shared by the rotation and rope_table so a
// table built from theta gives the same bits.
void theta_cos_sin(int64_t position, const std::vector<float>& inv_freq, float* cos, float* sin) {
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const float angle = rope_angle(position, inv_freq[i]);
    cos[i] = std::cos(angle);
    sin[i] = std::sin(angle);
  }
}

void check_view(const ThdTensor& x) {
  THDCP_CHECK(x.dtype == DType::kBFloat16 || x.dtype == DType::kFloat16 || x.dtype == DType::kFloat32,
              "x has dtype " << static_cast<int>(x.dtype) << ": use bf16, fp16 or fp32");
  THDCP_CHECK(x.tokens >= 0 && x.heads >= 0, "x has " << x.tokens << " rows and " << x.heads
                                                      << " heads: both must be >= 0");
  THDCP_CHECK(x.data != nullptr || x.numel() == 0, "x has no data (null pointer)");
  // x is rotated in place: an output, so no two of its elements may share an address.
  check_outputs_apart({{"x", x}}, {});
}

void rotate(const LayoutView& layout, int cp, int rank, const RopeConfig& config, ThdTensor x,
            const int32_t* start_offsets, const RopeTable& table, CpLayout cp_layout, float sin_sign) {
  THDCP_CHECK(cp >= 1, "cp=" << cp << " must be >= 1 (1 means no context parallelism)");
  THDCP_CHECK(rank >= 0 && rank < cp, "rank=" << rank << " must be in [0, cp=" << cp << ")");
  THDCP_CHECK(layout.num_seqs >= 1 && layout.cu_seqlens != nullptr && layout.cu_seqlens_padded != nullptr,
              "layout: cu_seqlens and cu_seqlens_padded must be non-null with num_seqs >= 1 (got num_seqs="
                  << layout.num_seqs << ")");
  validate_rope_config(config, x.head_dim);
  check_view(x);
  THDCP_CHECK(x.tokens * cp == layout.total_rows(),
              "x has " << x.tokens << " rows but rank " << rank << " of cp=" << cp << " holds "
                       << layout.total_rows() << "/" << cp << " rows of the layout (cu_seqlens_padded["
                       << layout.num_seqs << "]=" << layout.total_rows() << "): pass the rank's local tensor");
  if (cp == 1) {
    validate_layout(layout, layout.total_rows(), 0);  // one rank holds the rows as they are, any padding
  } else {
    validate_cp_layout(layout, layout.total_rows(), cp, cp_layout);
  }
  validate_rope_table(table);

  const int64_t rotary_dim = rope_rotary_dim(config, x.head_dim);
  const int64_t pairs = rotary_dim / 2;
  std::vector<int64_t> positions(static_cast<size_t>(x.tokens));
  for (int64_t row = 0; row < x.tokens; ++row) {
    const int64_t position = rope_position(layout.cu_seqlens, layout.cu_seqlens_padded, layout.num_seqs, cp, rank,
                                           row, start_offsets, cp_layout);
    if (table.present()) {
      const int b = cp_layout_row(cp_layout, layout.cu_seqlens_padded, layout.num_seqs, cp, rank, row).sequence;
      THDCP_CHECK(position >= 0 && position < table.rows,
                  "local row " << row << " of rank " << rank << " (sequence " << b << ", start_offsets[" << b
                               << "]=" << (start_offsets ? start_offsets[b] : 0) << ") has position " << position
                               << ", outside the cos/sin table of " << table.rows
                               << " rows: pass a table of at least " << position + 1
                               << " rows or smaller start_offsets");
    }
    positions[static_cast<size_t>(row)] = position;
  }

  const std::vector<float> inv_freq =
      table.present() ? std::vector<float>() : inverse_frequencies(rotary_dim, config.theta);
  std::vector<float> cos(static_cast<size_t>(pairs)), sin(static_cast<size_t>(pairs));
  const int64_t row_step = x.row_step(), head_step = x.head_step();
  for (int64_t row = 0; row < x.tokens; ++row) {
    const int64_t position = positions[static_cast<size_t>(row)];
    if (table.present()) {
      for (int64_t i = 0; i < pairs; ++i) {
        cos[static_cast<size_t>(i)] = table.cos[position * pairs + i];
        sin[static_cast<size_t>(i)] = table.sin[position * pairs + i];
      }
    } else {
      theta_cos_sin(position, inv_freq, cos.data(), sin.data());
    }
    for (int64_t head = 0; head < x.heads; ++head) {
      const int64_t base = row * row_step + head * head_step;
      for (int64_t i = 0; i < pairs; ++i) {
        const RopePair pair = rope_pair(config.layout, rotary_dim, i);
        const size_t first = static_cast<size_t>(base + pair.first), second = static_cast<size_t>(base + pair.second);
        const RopeRotated y = rope_rotate(load_as_float(x.data, x.dtype, first), load_as_float(x.data, x.dtype, second),
                                          cos[static_cast<size_t>(i)], sin_sign * sin[static_cast<size_t>(i)]);
        store_from_float(x.data, x.dtype, first, y.first);
        store_from_float(x.data, x.dtype, second, y.second);
      }
    }
  }
}

}  // namespace

void rope_forward(const LayoutView& layout, int cp, int rank, const RopeConfig& config, ThdTensor x,
                  const int32_t* start_offsets, const RopeTable& table, CpLayout cp_layout) {
  rotate(layout, cp, rank, config, x, start_offsets, table, cp_layout, 1.0f);
}

void rope_backward(const LayoutView& layout, int cp, int rank, const RopeConfig& config, ThdTensor x,
                   const int32_t* start_offsets, const RopeTable& table, CpLayout cp_layout) {
  rotate(layout, cp, rank, config, x, start_offsets, table, cp_layout, -1.0f);
}

void rope_table(const RopeConfig& config, int64_t head_dim, int64_t rows, float* cos, float* sin) {
  validate_rope_config(config, head_dim);
  THDCP_CHECK(rows >= 0, "rows=" << rows << " must be >= 0");
  THDCP_CHECK(rows == 0 || (cos != nullptr && sin != nullptr), "rope_table: cos and sin must not be null");
  const int64_t rotary_dim = rope_rotary_dim(config, head_dim);
  const std::vector<float> inv_freq = inverse_frequencies(rotary_dim, config.theta);
  for (int64_t t = 0; t < rows; ++t) theta_cos_sin(t, inv_freq, cos + t * (rotary_dim / 2), sin + t * (rotary_dim / 2));
}

}  // namespace thdcp::cpu
