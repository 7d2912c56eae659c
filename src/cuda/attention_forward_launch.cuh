// The forward launcher: forward_kernel_sm90 on Hopper, forward_kernel elsewhere.
#pragma once

#include "attention_forward.cuh"
#include "attention_forward_sm90.cuh"

namespace thdcp::cuda::detail {

template <typename Storage, int kHeadDim>
void launch_forward(const ForwardParams& params, int grid_tiles, cudaStream_t stream) {
  using Shape = ForwardShape<kHeadDim>;
  using Sm90 = ForwardSm90Shape<kHeadDim>;
  static const cudaError_t attribute_status = cudaFuncSetAttribute(
      forward_kernel<Storage, kHeadDim>, cudaFuncAttributeMaxDynamicSharedMemorySize, Shape::kSmemBytes);
  static const cudaError_t sm90_status = cudaFuncSetAttribute(
      forward_kernel_sm90<Storage, kHeadDim>, cudaFuncAttributeMaxDynamicSharedMemorySize, Sm90::kSmemBytes);
  THDCP_CHECK_CUDA(attribute_status);
  THDCP_CHECK_CUDA(sm90_status);
  if (grid_tiles == 0 || params.q_heads == 0) return;
  // grid_tiles and the tile schedule were sized with forward_tile_rows(), which follows the
  // same choice.
  const dim3 grid(static_cast<unsigned>(grid_tiles), static_cast<unsigned>(params.q_heads));
  if (use_sm90_kernels()) {
    forward_kernel_sm90<Storage, kHeadDim><<<grid, Sm90::kThreads, Sm90::kSmemBytes, stream>>>(params);
  } else {
    forward_kernel<Storage, kHeadDim><<<grid, Shape::kThreads, Shape::kSmemBytes, stream>>>(params);
  }
  THDCP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace thdcp::cuda::detail
