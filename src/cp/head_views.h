// Views of a THD tensor's heads, shared by the CP step sets that work on slices of heads
// (all_to_all's exchanges, all_gather's sliced forward).
#pragma once

#include <cstddef>
#include <cstdint>

#include "thdcp/core/tensor.h"

namespace thdcp::cp::detail {

// The heads [first, first + count) of `t`, as a view with explicit strides.
template <typename Tensor>
Tensor heads_of(const Tensor& t, int64_t first, int64_t count) {
  Tensor part = t;
  part.data = static_cast<unsigned char*>(const_cast<void*>(static_cast<const void*>(t.data))) +
              static_cast<size_t>(first * t.head_step()) * dtype_size(t.dtype);
  part.heads = count;
  part.row_stride = t.row_step();
  part.head_stride = t.head_step();
  return part;
}

}  // namespace thdcp::cp::detail
