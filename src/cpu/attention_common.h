// Shared pieces of the CPU forward and backward passes: argument checks and the loading
// of one KV head's rows into arithmetic precision.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "thdcp/cpu/attention.h"
#include "thdcp/core/error.h"
#include "thdcp/core/overlap.h"

namespace thdcp::cpu::detail {

// The shapes of a call's tensors, from the table and q, k, v: q and dq [q_rows, Hq, D_qk],
// out and dout [q_rows, Hq, D_v], k and dk [k_rows, Hkv, D_qk], v and dv [k_rows, Hkv, D_v].
ThdShape q_shape(const SegmentTable& table, const ConstThdTensor& q);
ThdShape out_shape(const SegmentTable& table, const ConstThdTensor& q, const ConstThdTensor& v);
ThdShape k_shape(const SegmentTable& table, const ConstThdTensor& q, const ConstThdTensor& k);
ThdShape v_shape(const SegmentTable& table, const ConstThdTensor& k, const ConstThdTensor& v);

// One THD tensor argument: its shape, dtype (thdcp::check_thd_shape, check_thd_dtype;
// outputs may be fp32 too, `or_fp32`) and strides (>= 0; any view: the loops below index
// through ThdTensor::offset). The overlap rules are the caller's (check_outputs_apart).
void check_tensor(const char* name, const ConstThdTensor& t, const ThdShape& shape, DType dtype,
                  bool or_fp32 = false);

// Writes 0 to every element of the view `t` (and nothing between its rows or heads).
void zero_view(const ThdTensor& t);

// Checks q/k/v against the table and each other (shared by forward and backward): heads
// (GQA/MQA), head dims the CPU backend supports (D_qk from q, D_v from v), shapes, one
// dtype, the table itself.
void check_qkv(const SegmentTable& table, const ConstThdTensor& q, const ConstThdTensor& k,
               const ConstThdTensor& v);

// Attention sinks, where given: `q_heads` logits, each finite or -inf (no sink for that head);
// NaN and +inf are refused, naming the head.
void check_sinks(const float* sinks, int64_t q_heads);

// Element (row, head, d) of a THD tensor as arithmetic type Acc.
template <typename Acc>
inline Acc load(const ConstThdTensor& t, int64_t row, int64_t head, int64_t d) {
  return static_cast<Acc>(load_as_float(t.data, t.dtype, static_cast<size_t>(t.offset(row, head, d))));
}

// Rows [first_row, first_row + rows) of head `head` of `t`, in two layouts:
//   by_row[j * D + d]   (for sums over keys that produce a D-vector)
//   by_dim[d * rows + j] (for dot products with a query: the inner loop runs over keys)
template <typename Acc>
void load_head_rows(const ConstThdTensor& t, int64_t head, int64_t first_row, int64_t rows, std::vector<Acc>* by_row,
                    std::vector<Acc>* by_dim) {
  const int64_t dim = t.head_dim;
  if (by_row) by_row->resize(static_cast<size_t>(rows * dim));
  if (by_dim) by_dim->resize(static_cast<size_t>(rows * dim));
  for (int64_t j = 0; j < rows; ++j) {
    for (int64_t d = 0; d < dim; ++d) {
      const Acc x = load<Acc>(t, first_row + j, head, d);
      if (by_row) (*by_row)[j * dim + d] = x;
      if (by_dim) (*by_dim)[d * rows + j] = x;
    }
  }
}

// scores[j] = scale * sum_d query[d] * keys_by_dim[d * stride + j] for j in [begin, end).
template <typename Acc>
void scaled_scores(const Acc* __restrict query, const Acc* __restrict keys_by_dim, int64_t stride, int64_t dim,
                   int64_t begin, int64_t end, Acc scale, Acc* __restrict scores) {
  for (int64_t j = begin; j < end; ++j) scores[j] = 0;
  for (int64_t d = 0; d < dim; ++d) {
    const Acc qd = query[d];
    const Acc* __restrict kd = keys_by_dim + d * stride;
    for (int64_t j = begin; j < end; ++j) scores[j] += qd * kd[j];
  }
  for (int64_t j = begin; j < end; ++j) scores[j] *= scale;
}

// out[d] = sum_j weights[j] * rows_by_row[j * dim + d] for j in [begin, end).
template <typename Acc>
void weighted_sum(const Acc* __restrict weights, const Acc* __restrict rows_by_row, int64_t dim, int64_t begin,
                  int64_t end, Acc* __restrict out) {
  for (int64_t d = 0; d < dim; ++d) out[d] = 0;
  for (int64_t j = begin; j < end; ++j) {
    const Acc w = weights[j];
    const Acc* __restrict row = rows_by_row + j * dim;
    for (int64_t d = 0; d < dim; ++d) out[d] += w * row[d];
  }
}

}  // namespace thdcp::cpu::detail
