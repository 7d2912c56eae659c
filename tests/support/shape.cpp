#include "support/shape.h"

namespace thdcp::test {

Shape batch_shape(const Batch& b, const Mask& mask) {
  return Shape{b.q.dtype(), b.q.heads(), b.k.heads(), b.q.head_dim(), mask};
}

Batch make_batch(const BatchLayout& layout, const Shape& s, uint64_t seed) {
  return make_batch(layout, s.dtype, s.q_heads, s.kv_heads, s.head_dim, seed, s.v_head_dim);
}

}  // namespace thdcp::test
