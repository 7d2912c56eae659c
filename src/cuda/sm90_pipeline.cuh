// Hopper (sm_90a) building blocks of the warp-specialized kernels: shared-memory
// transaction barriers (mbarrier), tensor-memory-accelerator copies (TMA,
// cp.async.bulk.tensor) that complete on them, named barriers of a warpgroup, and the
// register reallocation between warpgroups (setmaxnreg). Thin wrappers over one PTX
// instruction each; the PTX ISA's "Asynchronous operations" chapter defines them.
//
// A pipeline stage has a "full" barrier (one arrival: the producer's arrive.expect_tx, then
// the copy's bytes) and an "empty" barrier (one arrival per consumer thread). Use u of stage
// s (u = 0, 1, ...) waits for phase parity u & 1 of its full barrier; the producer's u-th
// refill waits for parity (u & 1) ^ 1 of the empty barrier, which a freshly initialised
// barrier already passes (its "previous" phase counts as complete).
#pragma once

#include <cstdint>

#include "tensor_core.cuh"

namespace thdcp::cuda::detail {

__device__ __forceinline__ void mbarrier_init(uint32_t barrier, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(arrivals) : "memory");
}

// Makes the initialisations of this thread's barriers visible to the other threads and to
// the async proxy (TMA); the block synchronises after it.
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also announces `bytes` of asynchronous copies completing on the barrier.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint32_t barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(barrier) : "memory");
}

// Returns once the phase of parity `parity` of the barrier has completed.
__device__ __forceinline__ void mbarrier_wait(uint32_t barrier, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(barrier), "r"(parity)
        : "memory");
  } while (done == 0);
}

// TMA: the box of the 3-D tensor map at generic address `map` (a __grid_constant__ kernel
// parameter) at coordinates (c0, c1, c2), innermost first, into shared memory at `dst`;
// completes `barrier`'s transaction count by the box's bytes (zeros for elements outside the
// tensor, which count too).
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* map, int c0, int c1, int c2, uint32_t barrier) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(barrier)
      : "memory");
}

__device__ __forceinline__ void prefetch_tensor_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads (a multiple of 32).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// A hand-over of registers between two warpgroups through shared memory: thread t of one
// stores kVectors 16-byte vectors, thread t of the other loads them (both at slot = area +
// 16 t); vector i at slot + i * 128 * 16, so that a warp's accesses cover 512 contiguous
// bytes. The two sides synchronise around it with named_barrier_sync_across.
template <int kVectors>
__device__ __forceinline__ void store_hand_over(uint32_t slot, const uint32_t (&x)[kVectors][4]) {
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(slot + i * 128 * 16), "r"(x[i][0]),
                 "r"(x[i][1]), "r"(x[i][2]), "r"(x[i][3])
                 : "memory");
  }
}
template <int kVectors>
__device__ __forceinline__ void load_hand_over(uint32_t slot, uint32_t (&x)[kVectors][4]) {
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(x[i][0]), "=r"(x[i][1]), "=r"(x[i][2]), "=r"(x[i][3])
                 : "r"(slot + i * 128 * 16)
                 : "memory");
  }
}

// The same over warps that reach it from different instructions (two warpgroups, each in its
// own code): bar.sync is barrier.sync.aligned, which the PTX ISA allows only where every
// participating thread executes the same instruction; this is the unaligned form.
__device__ __forceinline__ void named_barrier_sync_across(int id, int threads) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Register reallocation: every warp of a warpgroup executes the same one.
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

}  // namespace thdcp::cuda::detail
