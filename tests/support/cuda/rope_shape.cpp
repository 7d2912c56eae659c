#include "support/cuda/rope_shape.h"

namespace thdcp::test {

cuda::RopeShape rope_shape(int cp, int rank, const Capacity& capacity, const HeadShape& heads, DType dtype,
                           const RopeConfig& config) {
  cuda::RopeShape s;
  s.cp = cp;
  s.rank = rank;
  s.capacity = capacity;
  static_cast<HeadShape&>(s) = heads;
  s.dtype = dtype;
  s.config = config;
  return s;
}

}  // namespace thdcp::test
