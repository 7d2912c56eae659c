// The backward launcher: the dK/dV pass (dkv_kernel, or dkv_kernel_sm90 on Hopper where it
// serves the head dims) and the dQ pass (dq_kernel, or dq_kernel_sm90), or a fused dK/dV/dQ
// pass: on Hopper at head dim 128 without a left window, or on single-device tables with one
// of at least 4096 keys (dkvq_kernel_sm90, then dq_store_kernel; the plan decides), with the
// portable kernels when AttentionOptions::deterministic is off (dkv_kernel with kFuseDq).
#pragma once

#include "attention_backward.cuh"
#include "attention_dq.cuh"
#include "attention_dkv.cuh"
#include "attention_dkv_sm90.cuh"
#include "attention_dkvq_sm90.cuh"
#include "attention_dq_sm90.cuh"
#include "launch.h"

namespace thdcp::cuda::detail {

template <typename Storage, int kDqk, int kDv>
void configure_backward(bool sm90, bool fused) {
  // Function attributes belong to the device that is current when they are set, so the plan
  // sets them, for the kernels it will launch, on its own device every time it is made.
  // (The plan runs the Hopper kernels only where sm90_kernels_serve, and fuses the portable
  // passes only where portable_fuses_dq.)
  if constexpr (sm90_kernels_serve(kDqk, kDv)) {
    constexpr int kD = kDqk;
    if (fused && sm90) {
      if constexpr (kD == DkvqSm90Shape::kD) {
        set_dynamic_shared_memory(reinterpret_cast<const void*>(dkvq_kernel_sm90<Storage>), DkvqSm90Shape::kSmemBytes,
                                  "dkvq_kernel_sm90", kDqk, kDv);
      }
      return;
    }
    if (fused) {
      set_dynamic_shared_memory(reinterpret_cast<const void*>(dkv_kernel<Storage, kD, kD, true>),
                                DkvShape<kD, kD, true>::kSmemBytes, "dkv_kernel", kDqk, kDv);
      THDCP_CHECK_CUDA(cudaFuncSetAttribute(dkv_kernel<Storage, kD, kD, true>,
                                            cudaFuncAttributePreferredSharedMemoryCarveout, 100));
      return;
    }
    if (sm90) {
      set_dynamic_shared_memory(reinterpret_cast<const void*>(dkv_kernel_sm90<Storage, kD>),
                                DkvSm90Shape<kD>::kSmemBytes, "dkv_kernel_sm90", kDqk, kDv);
      set_dynamic_shared_memory(reinterpret_cast<const void*>(dq_kernel_sm90<Storage, kD>),
                                DqSm90Shape<kD>::kSmemBytes, "dq_kernel_sm90", kDqk, kDv);
      return;
    }
  }
  // Two 64-key blocks per SM need the largest shared-memory carveout.
  set_dynamic_shared_memory(reinterpret_cast<const void*>(dkv_kernel<Storage, kDqk, kDv, false>),
                            DkvShape<kDqk, kDv, false>::kSmemBytes, "dkv_kernel", kDqk, kDv);
  THDCP_CHECK_CUDA(cudaFuncSetAttribute(dkv_kernel<Storage, kDqk, kDv, false>,
                                        cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  set_dynamic_shared_memory(reinterpret_cast<const void*>(dq_kernel<Storage, kDqk, kDv>),
                            DqShape<kDqk, kDv>::kSmemBytes, "dq_kernel", kDqk, kDv);
}

template <typename Storage, int kDqk, int kDv>
void launch_backward(const BackwardParams& params, const BackwardStrides& strides, bool sm90, int grid_q_tiles,
                     int grid_k_tiles, cudaStream_t stream) {
  using Dq = DqShape<kDqk, kDv>;
  using Dkv = DkvShape<kDqk, kDv, false>;
  constexpr bool kHopper = sm90_kernels_serve(kDqk, kDv);
  constexpr int kD = kDqk;
  const bool fused = params.dq_accum != nullptr;
  if (grid_k_tiles > 0 && params.kv_heads > 0) {
    const dim3 grid(static_cast<unsigned>(grid_k_tiles), static_cast<unsigned>(params.kv_heads), Dkv::kSlices);
    if constexpr (kHopper) {
      if (fused && sm90) {
        if constexpr (kD == DkvqSm90Shape::kD) {
          dkvq_kernel_sm90<Storage>
              <<<grid, DkvqSm90Shape::kThreads, DkvqSm90Shape::kSmemBytes, stream>>>(params, strides);
        }
      } else if (fused) {
        using DkvFused = DkvShape<kD, kD, true>;
        dkv_kernel<Storage, kD, kD, true>
            <<<grid, DkvFused::kThreads, DkvFused::kSmemBytes, stream>>>(params, strides);
      } else if (sm90) {
        using DkvSm90 = DkvSm90Shape<kD>;
        dkv_kernel_sm90<Storage, kD><<<grid, DkvSm90::kThreads, DkvSm90::kSmemBytes, stream>>>(params, strides);
      } else {
        dkv_kernel<Storage, kDqk, kDv, false><<<grid, Dkv::kThreads, Dkv::kSmemBytes, stream>>>(params, strides);
      }
    } else {
      dkv_kernel<Storage, kDqk, kDv, false><<<grid, Dkv::kThreads, Dkv::kSmemBytes, stream>>>(params, strides);
    }
    THDCP_CHECK_CUDA(cudaGetLastError());
  }
  if ((!fused || sm90) && grid_q_tiles > 0 && params.q_heads > 0) {
    const dim3 grid(static_cast<unsigned>(grid_q_tiles), static_cast<unsigned>(params.q_heads));
    if constexpr (kHopper) {
      if (fused) {
        if constexpr (kD == DkvqSm90Shape::kD) dq_store_kernel<Storage><<<grid, 128, 0, stream>>>(params, strides);
      } else if (sm90) {
        using DqSm90 = DqSm90Shape<kD>;
        dq_kernel_sm90<Storage, kD><<<grid, DqSm90::kThreads, DqSm90::kSmemBytes, stream>>>(params, strides);
      } else {
        dq_kernel<Storage, kDqk, kDv><<<grid, Dq::kThreads, Dq::kSmemBytes, stream>>>(params, strides);
      }
    } else {
      dq_kernel<Storage, kDqk, kDv><<<grid, Dq::kThreads, Dq::kSmemBytes, stream>>>(params, strides);
    }
    THDCP_CHECK_CUDA(cudaGetLastError());
  }
}

}  // namespace thdcp::cuda::detail
