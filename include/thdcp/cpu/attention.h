// Attention over a segment table on the CPU: the reference backend.
//
// Storage is bf16, fp16 (raw 16-bit storage, exact conversions) or fp32; arithmetic is fp32
// (or fp64 for tests, AttentionOptions::accumulate). The CUDA backend runs the same
// semantics in namespace thdcp::cuda.
//
// Every tensor is a view with any row and head strides >= 0 (thdcp/core/tensor.h): packed
// QKV, padded rows or heads, head-major [H, T, D] memory; nothing is copied. Inputs may
// overlap; outputs must not overlap themselves or any other tensor of the call
// (thdcp/core/overlap.h); only the outputs' elements are written, never the memory between
// them.
#pragma once

#include <cstdint>

#include "thdcp/plan/attention_shape.h"
#include "thdcp/plan/segment_table.h"
#include "thdcp/core/tensor.h"

namespace thdcp {

// Head dims the CPU backend supports: multiples of 8 in [8, 256], for D_qk and D_v alike
// (any pair: MLA's 192/128, or D_v above D_qk).
bool cpu_supports_head_dim(int64_t head_dim);
// Throws thdcp::Error naming the field unless both heads.head_dim and heads.value_head_dim()
// are supported.
void check_cpu_head_dims(const HeadShape& heads);

namespace cpu {

// Forward attention over `table` (mask = table.mask).
//   q         [table.q_rows, Hq, D_qk]     storage dtype
//   k         [table.k_rows, Hkv, D_qk]    same dtype as q; Hq a multiple of Hkv (GQA/MQA)
//   v         [table.k_rows, Hkv, D_v]     same dtype as q; D_v is v's head dim (any supported
//                                          one: it need not equal D_qk)
//   out       [table.q_rows, Hq, D_v]      same dtype as q; every row is written, rows that
//                                          are padding or see no key get 0
//   lse       Hq * table.q_rows floats, [Hq, q_rows]: natural log of the softmax denominator
//             of the scaled scores; -inf for rows that are padding or see no key
//   max_logit Hq floats or nullptr: max over allowed pairs of the scaled score; -inf if none
// Throws thdcp::Error, before writing anything, when shapes, dtypes or the table are wrong.
void attention_forward(const SegmentTable& table, ConstThdTensor q, ConstThdTensor k, ConstThdTensor v,
                       ThdTensor out, float* lse, float* max_logit, const AttentionOptions& options = {});
// The same with every tensor of ForwardTensors, attention sinks included (tensors.sinks:
// host [Hq] fp32 or null).
void attention_forward(const SegmentTable& table, const ForwardTensors& tensors, const AttentionOptions& options = {});

// Backward attention over `table`, from the forward's out and lse.
//   out, dout [q_rows, Hq, D_v]   same dtype as q
//   dq        [q_rows, Hq, D_qk]  q's dtype or fp32
//   dk        [k_rows, Hkv, D_qk] k's dtype or fp32 (fp32 lets CP sum partial gradients
//                                 across ranks before the one rounding to storage)
//   dv        [k_rows, Hkv, D_v]  k's dtype or fp32
// Every row is written; rows no query saw get exactly 0.
void attention_backward(const SegmentTable& table, ConstThdTensor q, ConstThdTensor k, ConstThdTensor v,
                        ConstThdTensor out, ConstThdTensor dout, const float* lse, ThdTensor dq, ThdTensor dk,
                        ThdTensor dv, const AttentionOptions& options = {});
// The same with every tensor of BackwardTensors: with sinks, dsinks (host [Hq] fp32, or null)
// receives each head's d(sink) summed over the table's query rows; dkv_rows must be null.
void attention_backward(const SegmentTable& table, const BackwardTensors& tensors,
                        const AttentionOptions& options = {});

}  // namespace cpu
}  // namespace thdcp
