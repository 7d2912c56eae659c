// The backward launcher: the dK/dV pass (dkv_kernel; on Hopper where it serves the head dims,
// sm90_serves, dkv_kernel_sm90, or dkv_wide_kernel_sm90 above 128 columns) and the dQ pass
// (dq_kernel; dq_kernel_sm90, or dq_wide_kernel_sm90 at 256), or a fused dK/dV/dQ pass: on
// Hopper at head dim 128 without a left window, or on single-device tables with one of at
// least 4096 keys (dkvq_kernel_sm90, then dq_store_kernel; the plan decides), with the
// portable kernels when AttentionOptions::deterministic is off (dkv_kernel with kFuseDq).
#pragma once

#include "attention_backward.cuh"
#include "attention_dq.cuh"
#include "attention_dkv.cuh"
#include "attention_dkv_sm90.cuh"
#include "attention_dkv_wide_sm90.cuh"
#include "attention_dkvq_sm90.cuh"
#include "attention_dq_sm90.cuh"
#include "attention_dq_wide_sm90.cuh"
#include "launch.h"

namespace thdcp::cuda::detail {

template <typename Storage, int kDqk, int kDv>
void configure_backward(bool sm90, bool fused) {
  // Function attributes belong to the device that is current when they are set, so the plan
  // sets them, for the kernels it will launch, on its own device every time it is made.
  // (The plan fuses dQ on Hopper at 128 only, in the portable kernels where portable_fuses_dq,
  // and runs the Hopper kernels where sm90_serves.)
  constexpr bool kHopperFused = kDqk == DkvqSm90Shape::kD && kDv == kDqk;
  constexpr bool kDkvWide = sm90_dkv_wide(kDqk, kDv);
  constexpr bool kDqWide = sm90_dq_wide(kDqk, kDv);
  if (fused && sm90) {
    if constexpr (kHopperFused) {
      set_dynamic_shared_memory(reinterpret_cast<const void*>(dkvq_kernel_sm90<Storage>), DkvqSm90Shape::kSmemBytes,
                                "dkvq_kernel_sm90", kDqk, kDv);
    }
  } else if (fused) {
    if constexpr (portable_fuses_dq(kDqk, kDv)) {
      set_dynamic_shared_memory(reinterpret_cast<const void*>(dkv_kernel<Storage, kDqk, kDv, true>),
                                DkvShape<kDqk, kDv, true>::kSmemBytes, "dkv_kernel", kDqk, kDv);
      THDCP_CHECK_CUDA(cudaFuncSetAttribute(dkv_kernel<Storage, kDqk, kDv, true>,
                                            cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    }
  } else if (sm90) {
    if constexpr (sm90_serves(kDqk, kDv) && kDkvWide) {
      set_dynamic_shared_memory(reinterpret_cast<const void*>(dkv_wide_kernel_sm90<Storage, kDqk, kDv>),
                                DkvWideSm90Shape<kDqk, kDv>::kSmemBytes, "dkv_wide_kernel_sm90", kDqk, kDv);
    } else if constexpr (sm90_serves(kDqk, kDv)) {
      set_dynamic_shared_memory(reinterpret_cast<const void*>(dkv_kernel_sm90<Storage, kDqk, kDv>),
                                DkvSm90Shape<kDqk, kDv>::kSmemBytes, "dkv_kernel_sm90", kDqk, kDv);
    }
    if constexpr (sm90_serves(kDqk, kDv) && kDqWide) {
      set_dynamic_shared_memory(reinterpret_cast<const void*>(dq_wide_kernel_sm90<Storage, kDqk, kDv>),
                                DqWideSm90Shape<kDqk, kDv>::kSmemBytes, "dq_wide_kernel_sm90", kDqk, kDv);
    } else if constexpr (sm90_serves(kDqk, kDv)) {
      set_dynamic_shared_memory(reinterpret_cast<const void*>(dq_kernel_sm90<Storage, kDqk, kDv>),
                                DqSm90Shape<kDqk, kDv>::kSmemBytes, "dq_kernel_sm90", kDqk, kDv);
    }
  } else {
    // Two 64-key blocks per SM need the largest shared-memory carveout.
    set_dynamic_shared_memory(reinterpret_cast<const void*>(dkv_kernel<Storage, kDqk, kDv, false>),
                              DkvShape<kDqk, kDv, false>::kSmemBytes, "dkv_kernel", kDqk, kDv);
    THDCP_CHECK_CUDA(cudaFuncSetAttribute(dkv_kernel<Storage, kDqk, kDv, false>,
                                          cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    set_dynamic_shared_memory(reinterpret_cast<const void*>(dq_kernel<Storage, kDqk, kDv>),
                              DqShape<kDqk, kDv>::kSmemBytes, "dq_kernel", kDqk, kDv);
  }
}

template <typename Storage, int kDqk, int kDv>
void launch_backward(const BackwardParams& params, const BackwardStrides& strides, bool sm90, int grid_q_tiles,
                     int grid_k_tiles, cudaStream_t stream) {
  using Dq = DqShape<kDqk, kDv>;
  using Dkv = DkvShape<kDqk, kDv, false>;
  constexpr bool kHopperFused = kDqk == DkvqSm90Shape::kD && kDv == kDqk;
  const bool fused = params.dq_accum != nullptr;
  if (grid_k_tiles > 0 && params.kv_heads > 0) {
    const unsigned tiles = static_cast<unsigned>(grid_k_tiles), heads = static_cast<unsigned>(params.kv_heads);
    if (fused && sm90) {
      if constexpr (kHopperFused) {
        dkvq_kernel_sm90<Storage>
            <<<dim3(tiles, heads), DkvqSm90Shape::kThreads, DkvqSm90Shape::kSmemBytes, stream>>>(params, strides);
      }
    } else if (fused) {
      if constexpr (portable_fuses_dq(kDqk, kDv)) {
        using DkvFused = DkvShape<kDqk, kDv, true>;
        dkv_kernel<Storage, kDqk, kDv, true>
            <<<dim3(tiles, heads), DkvFused::kThreads, DkvFused::kSmemBytes, stream>>>(params, strides);
      }
    } else if (sm90) {
      if constexpr (sm90_serves(kDqk, kDv) && sm90_dkv_wide(kDqk, kDv)) {
        using DkvWide = DkvWideSm90Shape<kDqk, kDv>;
        dkv_wide_kernel_sm90<Storage, kDqk, kDv>
            <<<dim3(tiles, heads), DkvWide::kThreads, DkvWide::kSmemBytes, stream>>>(params, strides);
      } else if constexpr (sm90_serves(kDqk, kDv)) {
        using DkvSm90 = DkvSm90Shape<kDqk, kDv>;
        dkv_kernel_sm90<Storage, kDqk, kDv>
            <<<dim3(tiles, heads), DkvSm90::kThreads, DkvSm90::kSmemBytes, stream>>>(params, strides);
      }
    } else {
      dkv_kernel<Storage, kDqk, kDv, false>
          <<<dim3(tiles, heads, Dkv::kSlices), Dkv::kThreads, Dkv::kSmemBytes, stream>>>(params, strides);
    }
    THDCP_CHECK_CUDA(cudaGetLastError());
  }
  if ((!fused || sm90) && grid_q_tiles > 0 && params.q_heads > 0) {
    const dim3 grid(static_cast<unsigned>(grid_q_tiles), static_cast<unsigned>(params.q_heads));
    if (fused) {
      if constexpr (kHopperFused) dq_store_kernel<Storage><<<grid, 128, 0, stream>>>(params, strides);
    } else if (sm90) {
      if constexpr (sm90_serves(kDqk, kDv) && sm90_dq_wide(kDqk, kDv)) {
        using DqWide = DqWideSm90Shape<kDqk, kDv>;
        dq_wide_kernel_sm90<Storage, kDqk, kDv><<<grid, DqWide::kThreads, DqWide::kSmemBytes, stream>>>(params, strides);
      } else if constexpr (sm90_serves(kDqk, kDv)) {
        using DqSm90 = DqSm90Shape<kDqk, kDv>;
        dq_kernel_sm90<Storage, kDqk, kDv><<<grid, DqSm90::kThreads, DqSm90::kSmemBytes, stream>>>(params, strides);
      }
    } else {
      dq_kernel<Storage, kDqk, kDv><<<grid, Dq::kThreads, Dq::kSmemBytes, stream>>>(params, strides);
    }
    THDCP_CHECK_CUDA(cudaGetLastError());
  }
}

}  // namespace thdcp::cuda::detail
