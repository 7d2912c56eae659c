// Rotary position embedding (RoPE) on THD tensors under dual-chunk CP (DESIGN.md section 6):
// the configuration, the position of every local row and the rotation arithmetic, in one
// place. The CPU reference (thdcp/cpu/rope.h) and the CUDA kernel (thdcp/cuda/rope.h) call
// these functions; neither repeats them.
//
// Rotation of one pair (x1, x2) by the angle a = position * inv_freq[i]:
//   (x1, x2) -> (x1 cos a - x2 sin a, x2 cos a + x1 sin a)
// The backward (the transpose) is the rotation by -a. Pair i of a head holds elements
//   kInterleaved (GPT-J):  (2i, 2i + 1)
//   kHalfSplit   (NeoX):   (i, i + rotary_dim / 2)
// for i in [0, rotary_dim / 2); elements [rotary_dim, head_dim) pass through unchanged.
//
// Everything here is fp32, and written so that host and device round the same way: the
// inverse frequencies are computed once on the host (rope_inv_freq) and handed to the
// kernels, the angle is one fp32 product, and the rotation uses explicit fmaf (correctly
// rounded on both sides, so no compiler contraction can make them differ). Only cos/sin of
// the angle differ between the host's cosf/sinf and the device's sincosf (a few fp32 ulp);
// with a caller's cos/sin table both sides give the same bits.
#pragma once

#include <cmath>
#include <cstdint>

#include "thdcp/core/error.h"
#include "thdcp/core/host_device.h"
#include "thdcp/plan/contiguous.h"

namespace thdcp {

enum class RopeLayout : int {
  kInterleaved = 0,  // GPT-J: pairs (2i, 2i + 1)
  kHalfSplit = 1,    // NeoX: pairs (i, i + rotary_dim / 2)
};

struct RopeConfig {
  RopeLayout layout = RopeLayout::kHalfSplit;
  // Leading elements of each head that are rotated: even, in [2, head_dim]; 0 means head_dim.
  // The rest of each head passes through unchanged (partial rotary).
  int64_t rotary_dim = 0;
  // Base of the frequencies: inv_freq[i] = theta^(-2i / rotary_dim). Ignored when a cos/sin
  // table is given.
  float theta = 10000.0f;
};

// A caller's cos/sin table, fp32, row-major [rows][rotary_dim / 2]: entry (t, i) holds cos and
// sin of the angle of pair i at position t. Host memory for the CPU reference, device memory
// for the CUDA plan. Both pointers null: cos/sin come from RopeConfig::theta.
struct RopeTable {
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t rows = 0;  // positions the table covers: [0, rows)

  THDCP_HD bool present() const { return cos != nullptr || sin != nullptr; }
};

// The rotary dim a config resolves to for heads of `head_dim` elements (0 means head_dim).
THDCP_HD int64_t rope_rotary_dim(const RopeConfig& config, int64_t head_dim) {
  return config.rotary_dim == 0 ? head_dim : config.rotary_dim;
}

// Inverse frequency of pair i: theta^(-2i / rotary_dim), in fp32.
THDCP_HD float rope_inv_freq(int64_t pair, int64_t rotary_dim, float theta) {
  return powf(theta, -static_cast<float>(2 * pair) / static_cast<float>(rotary_dim));
}

// Angle of a pair at `position`: one fp32 product (positions are exact in fp32 below 2^24).
THDCP_HD float rope_angle(int64_t position, float inv_freq) { return static_cast<float>(position) * inv_freq; }

// Elements of head-local pair `pair` (see the top of this file).
struct RopePair {
  int64_t first;
  int64_t second;
};

THDCP_HD RopePair rope_pair(RopeLayout layout, int64_t rotary_dim, int64_t pair) {
  return layout == RopeLayout::kInterleaved ? RopePair{2 * pair, 2 * pair + 1} : RopePair{pair, pair + rotary_dim / 2};
}

// The rotation of (x1, x2) by the angle whose cosine and sine are (c, s); pass -s for the
// backward. Explicit fmaf: the same rounding on the host and the device.
struct RopeRotated {
  float first;
  float second;
};

THDCP_HD RopeRotated rope_rotate(float x1, float x2, float c, float s) {
  return RopeRotated{fmaf(x1, c, -(x2 * s)), fmaf(x2, c, x1 * s)};
}

// RoPE position of local row `local_row` of `rank` of `cp` under `cp_layout`, from the
// *global* layout (cu_seqlens and cu_seqlens_padded, max_seqs + 1 entries each, in capacity
// form: DESIGN.md section 1):
//   * the row's position within its sequence from the layout's map (cp_layout_row), plus
//     start_offsets[b] when start_offsets is not null (max_seqs entries, one per sequence);
//   * 0 for every row of a sequence with no valid token (placeholders, including the last
//     one, which absorbs the slack rows up to max_tokens), whatever its offset;
//   * padding rows of a real sequence keep their computed position (past the valid ones).
// cp = 1 gives the single-device position local_row - cu_seqlens_padded[b] (any padding).
THDCP_HD int64_t rope_position(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded, int max_seqs, int cp,
                               int rank, int64_t local_row, const int32_t* start_offsets,
                               CpLayout cp_layout = CpLayout::kDualChunk) {
  const DualChunkRow row = cp_layout_row(cp_layout, cu_seqlens_padded, max_seqs, cp, rank, local_row);
  if (cu_seqlens[row.sequence + 1] == cu_seqlens[row.sequence]) return 0;
  return row.position + (start_offsets != nullptr ? start_offsets[row.sequence] : 0);
}

// Throws thdcp::Error unless `config` can rotate heads of `head_dim` elements: a known
// layout, rotary_dim even and in [2, head_dim] (0: head_dim, which must then be even), theta
// finite and > 0. Host only.
inline void validate_rope_config(const RopeConfig& config, int64_t head_dim) {
  THDCP_CHECK(config.layout == RopeLayout::kInterleaved || config.layout == RopeLayout::kHalfSplit,
              "RopeConfig::layout=" << static_cast<int>(config.layout)
                                    << " is not a RopeLayout: use kInterleaved (GPT-J) or kHalfSplit (NeoX)");
  THDCP_CHECK(head_dim >= 2, "head_dim=" << head_dim << " must be >= 2 for RoPE (it rotates pairs of elements)");
  THDCP_CHECK(config.rotary_dim >= 0 && config.rotary_dim <= head_dim,
              "RopeConfig::rotary_dim=" << config.rotary_dim << " must be in [0, head_dim=" << head_dim
                                        << "] (0 means head_dim)");
  const int64_t rotary_dim = rope_rotary_dim(config, head_dim);
  THDCP_CHECK(rotary_dim % 2 == 0, "RopeConfig::rotary_dim=" << config.rotary_dim << " resolves to " << rotary_dim
                                                             << ", which is odd: RoPE rotates pairs, set rotary_dim "
                                                                "to an even value <= head_dim="
                                                             << head_dim);
  THDCP_CHECK(std::isfinite(config.theta) && config.theta > 0.0f,
              "RopeConfig::theta=" << config.theta << " must be finite and > 0 (10000 is the usual base)");
}

// Throws thdcp::Error unless a table (when present) has both pointers and at least one row.
// Host only; the memory a table points to is the caller's (host or device per backend).
inline void validate_rope_table(const RopeTable& table) {
  if (!table.present()) return;
  THDCP_CHECK(table.cos != nullptr && table.sin != nullptr,
              "RopeTable: cos=" << static_cast<const void*>(table.cos) << " and sin="
                                << static_cast<const void*>(table.sin)
                                << ": give both (a table) or neither (cos/sin from theta)");
  THDCP_CHECK(table.rows >= 1, "RopeTable::rows=" << table.rows << " must be >= 1 when a table is given");
}

}  // namespace thdcp
