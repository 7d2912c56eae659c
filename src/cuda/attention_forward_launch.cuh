// The forward launcher: forward_kernel_sm90 on Hopper, forward_kernel elsewhere.
#pragma once

#include "attention_forward.cuh"
#include "attention_forward_sm90.cuh"

namespace thdcp::cuda::detail {

template <typename Storage, int kHeadDim>
void configure_forward(bool sm90) {
  // Function attributes belong to the device that is current when they are set, so the plan
  // sets them for its own device, every time it is made (a cheap host call).
  if (sm90) {
    THDCP_CHECK_CUDA(cudaFuncSetAttribute(forward_kernel_sm90<Storage, kHeadDim>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(ForwardSm90Shape<kHeadDim>::kSmemBytes)));
  } else {
    THDCP_CHECK_CUDA(cudaFuncSetAttribute(forward_kernel<Storage, kHeadDim>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(ForwardShape<kHeadDim>::kSmemBytes)));
  }
}

template <typename Storage, int kHeadDim>
void launch_forward(const ForwardParams& params, const ForwardStrides& strides, const ForwardTensorMaps* maps,
                    int grid_tiles, int sm_count, cudaStream_t stream) {
  using Shape = ForwardShape<kHeadDim>;
  using Sm90 = ForwardSm90Shape<kHeadDim>;
  if (grid_tiles == 0 || params.q_heads == 0) return;
  // grid_tiles and the tile schedule were sized with forward_tile_rows(maps != nullptr, kHeadDim).
  const dim3 grid(static_cast<unsigned>(grid_tiles), static_cast<unsigned>(params.q_heads));
  if (maps != nullptr) {
    // Persistent: a block per SM, or per work item when there are fewer (the real count is
    // known on the device only; blocks past it return at once).
    const int64_t items = static_cast<int64_t>(grid_tiles) * params.q_heads;
    const unsigned blocks = static_cast<unsigned>(items < sm_count ? items : sm_count);
    forward_kernel_sm90<Storage, kHeadDim><<<blocks, Sm90::kThreads, Sm90::kSmemBytes, stream>>>(params, strides,
                                                                                               *maps);
  } else {
    forward_kernel<Storage, kHeadDim><<<grid, Shape::kThreads, Shape::kSmemBytes, stream>>>(params, strides);
  }
  THDCP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace thdcp::cuda::detail
