// What a test case runs: the storage dtype, the heads, the head dims and the mask.
#pragma once

#include <cstdint>

#include "support/random_batch.h"
#include "thdcp/core/dtype.h"
#include "thdcp/plan/attention_shape.h"
#include "thdcp/plan/mask.h"

namespace thdcp::test {

struct Shape {
  DType dtype = DType::kBFloat16;
  int64_t q_heads = 4;
  int64_t kv_heads = 2;
  int64_t head_dim = 64;
  Mask mask = Mask::causal();
  int64_t v_head_dim = 0;  // D_v of v, out, dout, dv; 0: head_dim

  HeadShape heads() const { return HeadShape{q_heads, kv_heads, head_dim, v_head_dim}; }
};

// The shape of `b` (its dtype and heads) with `mask`.
Shape batch_shape(const Batch& b, const Mask& mask);

// make_batch with the dtype and heads of `s`.
Batch make_batch(const BatchLayout& layout, const Shape& s, uint64_t seed);

}  // namespace thdcp::test
