// The scale of q.k in the softmax, resolved once for every backend.
#pragma once

#include <cstdint>

namespace thdcp {

// `softmax_scale` when it is > 0, else 1/sqrt(head_dim) (0 means "the default"). Throws
// thdcp::Error naming softmax_scale unless it is finite and >= 0.
float resolve_softmax_scale(float softmax_scale, int64_t head_dim);

}  // namespace thdcp
