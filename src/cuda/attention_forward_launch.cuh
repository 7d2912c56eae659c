// The forward launcher: forward_kernel_sm90 on Hopper where it serves the head dims
// (sm90_serves), forward_kernel elsewhere.
#pragma once

#include "attention_forward.cuh"
#include "attention_forward_sm90.cuh"
#include "launch.h"

namespace thdcp::cuda::detail {

template <typename Storage, int kDqk, int kDv>
void configure_forward(bool sm90) {
  // Function attributes belong to the device that is current when they are set, so the plan
  // sets them for its own device, every time it is made (a cheap host call).
  if constexpr (sm90_serves(kDqk, kDv)) {
    if (sm90) {
      set_dynamic_shared_memory(reinterpret_cast<const void*>(forward_kernel_sm90<Storage, kDqk, kDv>),
                                ForwardSm90Shape<kDqk, kDv>::kSmemBytes, "forward_kernel_sm90", kDqk, kDv);
      return;
    }
  }
  set_dynamic_shared_memory(reinterpret_cast<const void*>(forward_kernel<Storage, kDqk, kDv>),
                            ForwardShape<kDqk, kDv>::kSmemBytes, "forward_kernel", kDqk, kDv);
}

template <typename Storage, int kDqk, int kDv>
void launch_forward(const ForwardParams& params, const ForwardStrides& strides, const ForwardTensorMaps* maps,
                    int grid_tiles, int sm_count, cudaStream_t stream) {
  using Shape = ForwardShape<kDqk, kDv>;
  if (grid_tiles == 0 || params.q_heads == 0) return;
  // grid_tiles and the tile schedule were sized with forward_tile_rows(maps != nullptr, kDqk, kDv).
  const dim3 grid(static_cast<unsigned>(grid_tiles), static_cast<unsigned>(params.q_heads));
  if constexpr (sm90_serves(kDqk, kDv)) {
    using Sm90 = ForwardSm90Shape<kDqk, kDv>;
    if (maps != nullptr) {
      // Persistent: a block per SM, or per work item when there are fewer (the real count is
      // known on the device only; blocks past it return at once).
      const int64_t items = static_cast<int64_t>(grid_tiles) * params.q_heads;
      const unsigned blocks = static_cast<unsigned>(items < sm_count ? items : sm_count);
      forward_kernel_sm90<Storage, kDqk, kDv><<<blocks, Sm90::kThreads, Sm90::kSmemBytes, stream>>>(params, strides,
                                                                                                  *maps);
      THDCP_CHECK_CUDA(cudaGetLastError());
      return;
    }
  }
  forward_kernel<Storage, kDqk, kDv><<<grid, Shape::kThreads, Shape::kSmemBytes, stream>>>(params, strides);
  THDCP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace thdcp::cuda::detail
