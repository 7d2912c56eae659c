// Rotary position embedding on the CPU: the reference the CUDA plan (thdcp/cuda/rope.h) is
// tested against. Positions, frequencies and the rotation come from thdcp/plan/rope.h.
#pragma once

#include <cstdint>

#include "thdcp/core/tensor.h"
#include "thdcp/plan/layout.h"
#include "thdcp/plan/rope.h"

namespace thdcp::cpu {

// Rotates every head of `x` in place by the RoPE angles of its rows.
//   layout         the *global* layout (cu_seqlens, cu_seqlens_padded, num_seqs = max_seqs),
//                  in capacity form or not; with cp > 1 every padded length is a multiple of
//                  2*cp (cp = 1 accepts any padding)
//   cp, rank       x holds the local rows of `rank` in the order of `cp_layout` (dual chunk,
//                  DESIGN.md section 3, or contiguous, thdcp/plan/contiguous.h):
//                  x.tokens == layout.total_rows() / cp. cp = 1, rank = 0: a single device
//   config         layout of the pairs, rotary_dim, theta (validate_rope_config)
//   x              [T / cp, H, D], bf16, fp16 or fp32, any view (row_stride, head_stride:
//                  packed QKV, head-major [H, T, D] memory) whose elements do not overlap
//                  (thdcp/core/overlap.h). Every row is rotated: padding rows by their
//                  computed position, rows of empty sequences by 0 (unchanged)
//   start_offsets  null, or num_seqs int32 values added to the positions of each sequence
//   table          a host cos/sin table (rope.h), or none: cos/sin from theta (cosf/sinf of
//                  rope_angle). With a table every position must lie in [0, table.rows)
//   cp_layout      the CP layout of x's rows (validate_cp_layout); positions follow it
// fp32 arithmetic and one rounding to storage per element. Throws thdcp::Error, before
// anything is written, when an argument is wrong (naming it) or a position falls outside
// the table (naming the row and sequence).
void rope_forward(const LayoutView& layout, int cp, int rank, const RopeConfig& config, ThdTensor x,
                  const int32_t* start_offsets = nullptr, const RopeTable& table = {},
                  CpLayout cp_layout = CpLayout::kDualChunk);

// The backward: the rotation by the negative angles (the transpose of the forward), so
// rope_backward(rope_forward(x)) == x up to the rounding to storage. Same arguments; x holds
// the gradient with respect to the forward's output and receives the one for its input.
void rope_backward(const LayoutView& layout, int cp, int rank, const RopeConfig& config, ThdTensor x,
                   const int32_t* start_offsets = nullptr, const RopeTable& table = {},
                   CpLayout cp_layout = CpLayout::kDualChunk);

// Fills a cos/sin table of `rows` positions, [rows][rotary_dim / 2] fp32 each, with exactly
// the values the theta path of rope_forward uses, so a table built here gives the same bits.
void rope_table(const RopeConfig& config, int64_t head_dim, int64_t rows, float* cos, float* sin);

}  // namespace thdcp::cpu
