// The backward launcher: the dK/dV pass (dkv_kernel, or dkv_kernel_sm90 on Hopper) and the
// dQ pass (dq_kernel, or dq_kernel_sm90), or a fused dK/dV/dQ pass: on Hopper at head dim
// 128 without a left window, or on single-device tables with one of at least 4096 keys
// (dkvq_kernel_sm90, then dq_store_kernel; the plan decides), with the portable kernels
// when AttentionOptions::deterministic is off (dkv_kernel with kFuseDq).
#pragma once

#include "attention_backward.cuh"
#include "attention_dq.cuh"
#include "attention_dkv.cuh"
#include "attention_dkv_sm90.cuh"
#include "attention_dkvq_sm90.cuh"
#include "attention_dq_sm90.cuh"

namespace thdcp::cuda::detail {

template <typename Storage, int kHeadDim>
void configure_backward(bool sm90, bool fused) {
  // Function attributes belong to the device that is current when they are set, so the plan
  // sets them, for the kernels it will launch, on its own device every time it is made.
  if (fused && sm90) {
    if constexpr (kHeadDim == DkvqSm90Shape::kD) {
      THDCP_CHECK_CUDA(cudaFuncSetAttribute(dkvq_kernel_sm90<Storage>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(DkvqSm90Shape::kSmemBytes)));
    }
  } else if (fused) {
    THDCP_CHECK_CUDA(cudaFuncSetAttribute(dkv_kernel<Storage, kHeadDim, true>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(DkvShape<kHeadDim, true>::kSmemBytes)));
    THDCP_CHECK_CUDA(cudaFuncSetAttribute(dkv_kernel<Storage, kHeadDim, true>,
                                          cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  } else if (sm90) {
    THDCP_CHECK_CUDA(cudaFuncSetAttribute(dkv_kernel_sm90<Storage, kHeadDim>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(DkvSm90Shape<kHeadDim>::kSmemBytes)));
    THDCP_CHECK_CUDA(cudaFuncSetAttribute(dq_kernel_sm90<Storage, kHeadDim>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(DqSm90Shape<kHeadDim>::kSmemBytes)));
  } else {
    // Two 64-key blocks per SM need the largest shared-memory carveout.
    THDCP_CHECK_CUDA(cudaFuncSetAttribute(dkv_kernel<Storage, kHeadDim, false>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(DkvShape<kHeadDim, false>::kSmemBytes)));
    THDCP_CHECK_CUDA(cudaFuncSetAttribute(dkv_kernel<Storage, kHeadDim, false>,
                                          cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    THDCP_CHECK_CUDA(cudaFuncSetAttribute(dq_kernel<Storage, kHeadDim>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(DqShape<kHeadDim>::kSmemBytes)));
  }
}

template <typename Storage, int kHeadDim>
void launch_backward(const BackwardParams& params, const BackwardStrides& strides, bool sm90, int grid_q_tiles,
                     int grid_k_tiles, cudaStream_t stream) {
  using Dq = DqShape<kHeadDim>;
  using Dkv = DkvShape<kHeadDim, false>;
  using DkvFused = DkvShape<kHeadDim, true>;
  using DqSm90 = DqSm90Shape<kHeadDim>;
  using DkvSm90 = DkvSm90Shape<kHeadDim>;
  const bool fused = params.dq_accum != nullptr;
  if (grid_k_tiles > 0 && params.kv_heads > 0) {
    const dim3 grid(static_cast<unsigned>(grid_k_tiles), static_cast<unsigned>(params.kv_heads));
    if (fused && sm90) {
      if constexpr (kHeadDim == DkvqSm90Shape::kD) {
        dkvq_kernel_sm90<Storage>
            <<<grid, DkvqSm90Shape::kThreads, DkvqSm90Shape::kSmemBytes, stream>>>(params, strides);
      }
    } else if (fused) {
      dkv_kernel<Storage, kHeadDim, true><<<grid, DkvFused::kThreads, DkvFused::kSmemBytes, stream>>>(params, strides);
    } else if (sm90) {
      dkv_kernel_sm90<Storage, kHeadDim><<<grid, DkvSm90::kThreads, DkvSm90::kSmemBytes, stream>>>(params, strides);
    } else {
      dkv_kernel<Storage, kHeadDim, false><<<grid, Dkv::kThreads, Dkv::kSmemBytes, stream>>>(params, strides);
    }
    THDCP_CHECK_CUDA(cudaGetLastError());
  }
  if ((!fused || sm90) && grid_q_tiles > 0 && params.q_heads > 0) {
    const dim3 grid(static_cast<unsigned>(grid_q_tiles), static_cast<unsigned>(params.q_heads));
    if (fused) {
      if constexpr (kHeadDim == DkvqSm90Shape::kD) dq_store_kernel<Storage><<<grid, 128, 0, stream>>>(params, strides);
    } else if (sm90) {
      dq_kernel_sm90<Storage, kHeadDim><<<grid, DqSm90::kThreads, DqSm90::kSmemBytes, stream>>>(params, strides);
    } else {
      dq_kernel<Storage, kHeadDim><<<grid, Dq::kThreads, Dq::kSmemBytes, stream>>>(params, strides);
    }
    THDCP_CHECK_CUDA(cudaGetLastError());
  }
}

}  // namespace thdcp::cuda::detail
