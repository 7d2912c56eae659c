// Grid sizes of the small elementwise and per-row kernels.
#pragma once

#include <cstdint>

namespace thdcp::cuda::detail {

// Blocks of `threads` threads that cover `items` items, one item per thread.
inline unsigned blocks_for(int64_t items, int threads) {
  return static_cast<unsigned>((items + threads - 1) / threads);
}

}  // namespace thdcp::cuda::detail
