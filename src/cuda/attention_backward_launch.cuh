// The backward launcher: the dK/dV pass (dkv_kernel, or dkv_kernel_sm90 on Hopper) and the
// dQ pass (dq_kernel, or dq_kernel_sm90), or the fused dK/dV/dQ pass when Options::deterministic is off.
#pragma once

#include "attention_backward.cuh"
#include "attention_dkv_sm90.cuh"
#include "attention_dq_sm90.cuh"

namespace thdcp::cuda::detail {

template <typename Storage, int kHeadDim>
void launch_backward(const BackwardParams& params, int grid_q_tiles, int grid_k_tiles, cudaStream_t stream) {
  using Dq = DqShape<kHeadDim>;
  using Dkv = DkvShape<kHeadDim, false>;
  using DkvFused = DkvShape<kHeadDim, true>;
  using DqSm90 = DqSm90Shape<kHeadDim>;
  using DkvSm90 = DkvSm90Shape<kHeadDim>;
  static const cudaError_t dq_status = cudaFuncSetAttribute(
      dq_kernel<Storage, kHeadDim>, cudaFuncAttributeMaxDynamicSharedMemorySize, Dq::kSmemBytes);
  static const cudaError_t dq_sm90_status = cudaFuncSetAttribute(
      dq_kernel_sm90<Storage, kHeadDim>, cudaFuncAttributeMaxDynamicSharedMemorySize, DqSm90::kSmemBytes);
  static const cudaError_t dkv_sm90_status = cudaFuncSetAttribute(
      dkv_kernel_sm90<Storage, kHeadDim>, cudaFuncAttributeMaxDynamicSharedMemorySize, DkvSm90::kSmemBytes);
  static const cudaError_t dkv_status = cudaFuncSetAttribute(
      dkv_kernel<Storage, kHeadDim, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, Dkv::kSmemBytes);
  static const cudaError_t fused_status = cudaFuncSetAttribute(
      dkv_kernel<Storage, kHeadDim, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, DkvFused::kSmemBytes);
  // Two 64-key blocks per SM need the largest shared-memory carveout.
  static const cudaError_t dkv_carveout = cudaFuncSetAttribute(
      dkv_kernel<Storage, kHeadDim, false>, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
  static const cudaError_t fused_carveout = cudaFuncSetAttribute(
      dkv_kernel<Storage, kHeadDim, true>, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
  THDCP_CHECK_CUDA(dkv_carveout);
  THDCP_CHECK_CUDA(fused_carveout);
  THDCP_CHECK_CUDA(dq_status);
  THDCP_CHECK_CUDA(dq_sm90_status);
  THDCP_CHECK_CUDA(dkv_status);
  THDCP_CHECK_CUDA(dkv_sm90_status);
  THDCP_CHECK_CUDA(fused_status);
  const bool fused = params.dq_accum != nullptr;
  const bool sm90 = use_sm90_kernels();
  if (grid_k_tiles > 0 && params.kv_heads > 0) {
    const dim3 grid(static_cast<unsigned>(grid_k_tiles), static_cast<unsigned>(params.kv_heads));
    if (fused) {
      dkv_kernel<Storage, kHeadDim, true><<<grid, DkvFused::kThreads, DkvFused::kSmemBytes, stream>>>(params);
    } else if (sm90) {
      dkv_kernel_sm90<Storage, kHeadDim><<<grid, DkvSm90::kThreads, DkvSm90::kSmemBytes, stream>>>(params);
    } else {
      dkv_kernel<Storage, kHeadDim, false><<<grid, Dkv::kThreads, Dkv::kSmemBytes, stream>>>(params);
    }
    THDCP_CHECK_CUDA(cudaGetLastError());
  }
  if (!fused && grid_q_tiles > 0 && params.q_heads > 0) {
    const dim3 grid(static_cast<unsigned>(grid_q_tiles), static_cast<unsigned>(params.q_heads));
    if (sm90) {
      dq_kernel_sm90<Storage, kHeadDim><<<grid, DqSm90::kThreads, DqSm90::kSmemBytes, stream>>>(params);
    } else {
      dq_kernel<Storage, kHeadDim><<<grid, Dq::kThreads, Dq::kSmemBytes, stream>>>(params);
    }
    THDCP_CHECK_CUDA(cudaGetLastError());
  }
}

}  // namespace thdcp::cuda::detail
