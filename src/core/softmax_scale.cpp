#include "thdcp/core/softmax_scale.h"

#include <cmath>

#include "thdcp/core/error.h"

namespace thdcp {

float resolve_softmax_scale(float softmax_scale, int64_t head_dim) {
  THDCP_CHECK(std::isfinite(softmax_scale) && softmax_scale >= 0.0f,
              "softmax_scale=" << softmax_scale << " must be finite and >= 0 (0 means 1/sqrt(head_dim))");
  return softmax_scale > 0.0f ? softmax_scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

}  // namespace thdcp
