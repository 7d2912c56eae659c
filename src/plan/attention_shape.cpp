#include "thdcp/plan/attention_shape.h"

#include <limits>

#include "thdcp/core/error.h"

namespace thdcp {

void check_head_shape(const HeadShape& h, const char* prefix) {
  THDCP_CHECK(h.q_heads >= 1 && h.kv_heads >= 1 && h.q_heads % h.kv_heads == 0,
              prefix << "q_heads=" << h.q_heads << ", " << prefix << "kv_heads=" << h.kv_heads
                     << ": need kv_heads >= 1 and q_heads a multiple of kv_heads (GQA/MQA)");
  THDCP_CHECK(h.q_heads <= std::numeric_limits<int32_t>::max(),
              prefix << "q_heads=" << h.q_heads << " must be below 2^31");
  THDCP_CHECK(h.head_dim >= 1, prefix << "head_dim=" << h.head_dim << " must be >= 1");
  THDCP_CHECK(h.v_head_dim >= 0,
              prefix << "v_head_dim=" << h.v_head_dim << " must be >= 1, or 0 for v_head_dim = head_dim");
}

}  // namespace thdcp
