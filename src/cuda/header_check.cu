// Compiles the shared index-math headers under nvcc and calls them from device code, so a
// change that breaks the __host__ __device__ contract fails the build.
#include "thdcp/plan/dual_chunk.h"
#include "thdcp/plan/mask.h"
#include "thdcp/plan/rope.h"
#include "thdcp/plan/segment.h"

namespace thdcp {

__global__ void header_check_kernel(const int32_t* cu_seqlens_padded, int num_seqs, int cp, int rank, int64_t* out) {
  const int64_t row = threadIdx.x;
  out[row] = dual_chunk_global_row(cu_seqlens_padded, num_seqs, cp, rank, row);
  const Segment s = cp_segment(0, 64, 50, cp, rank, 0, Mask::causal());
  out[row] += segment_pairs(s, Mask::window(16, 0)) + dual_chunk_locate_row(cu_seqlens_padded, num_seqs, cp, row).rank;
  const int64_t position = rope_position(cu_seqlens_padded, cu_seqlens_padded, num_seqs, cp, rank, row, nullptr);
  const RopePair pair = rope_pair(RopeLayout::kHalfSplit, 64, row % 32);
  const RopeRotated y = rope_rotate(1.0f, 2.0f, 0.5f, rope_angle(position, rope_inv_freq(pair.first, 64, 10000.0f)));
  out[row] += static_cast<int64_t>(y.first + y.second) + pair.second;
}

}  // namespace thdcp
