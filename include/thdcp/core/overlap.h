// Where THD views share memory: the one overlap check of every backend (CPU reference, CUDA
// kernels, RoPE, CP plans).
//
// Element (row, head, d) of a view t lives at element offset
//     row * t.row_step() + head * t.head_step() + d      (d < head_dim, contiguous)
// from t.data. Any strides >= 0 are a valid *view*: row-major [T, H, D] with padded rows or
// heads, a packed QKV buffer, head-major [H, T, D] memory (row stride D, head stride T * D,
// what transformers hands over from its KV cache), or rows and heads interleaved.
//
// The rules of a call:
//   - Inputs (q, k, v, dout, and out where a backward reads it) are only read: they may
//     overlap themselves and each other (views of one buffer, broadcasts).
//   - Outputs (out, dq, dk, dv, the tensors RoPE rotates in place) must not overlap
//     themselves (no two elements at one address: thd_self_overlap finds none) and must not
//     share a byte with any other tensor of the call, output or input (views_overlap).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>

#include "thdcp/core/tensor.h"

namespace thdcp {

// Two distinct elements (row, head, d) of one view at one address.
struct ElementCollision {
  int64_t row[2], head[2], d[2];
};

// The elements (row, head, d) in [0, rows) x [0, heads) x [0, head_dim) of a view with
// positive element strides row_stride and head_stride (d contiguous) land at distinct
// addresses, or here are two that do not. Exact (no false alarm, no miss), O(min(rows, heads)).
std::optional<ElementCollision> thd_self_overlap(int64_t rows, int64_t heads, int64_t head_dim, int64_t row_stride,
                                                 int64_t head_stride);
std::optional<ElementCollision> thd_self_overlap(const ConstThdTensor& t);

// Whether two views share a byte.
enum class ViewOverlap {
  kApart,     // they share no byte (proven)
  kOverlap,   // they share a byte (proven; `witness` names an element of each at it)
  kUnproven,  // their address ranges intersect but their strides or element sizes differ,
              // the case views_overlap does not decide: the checks treat it as overlapping
};

struct ViewOverlapResult {
  ViewOverlap kind = ViewOverlap::kApart;
  int64_t a_row = 0, a_head = 0, a_d = 0;  // kOverlap: an element of a and one of b that share a byte
  int64_t b_row = 0, b_head = 0, b_d = 0;
};

// Exact when the views' byte ranges are disjoint, or when they have one element size, the
// same row stride (where both have more than one row) and head stride (where both have more
// than one head): views of one buffer, such as q, k, v of a packed QKV or dq, dk, dv of a
// packed dQKV. Otherwise kUnproven when the ranges intersect. Empty views share nothing.
ViewOverlapResult views_overlap(const ConstThdTensor& a, const ConstThdTensor& b);

// A named view of a call, for the checks below.
struct NamedView {
  const char* name;
  ConstThdTensor view;
};

// Throws thdcp::Error unless the strides are >= 0 ("k has row_stride=-8 and head_stride=0:
// strides are in elements, >= 0 (0 means contiguous)").
void check_thd_strides(const char* name, const ConstThdTensor& t);

// The overlap rules of one call (see above): throws thdcp::Error, naming the tensor, its
// shape and strides, the elements that collide and what to change, when an output overlaps
// itself, another output or an input. Host arithmetic only.
void check_outputs_apart(std::initializer_list<NamedView> outputs, std::initializer_list<NamedView> inputs);

}  // namespace thdcp
