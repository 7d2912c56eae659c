// The attention kernels' launchers, one explicit instantiation per (dtype, D_qk, D_v) per
// file (attention_{fwd,bwd}_{bf16,fp16}_d{64,96,128,192,256,192v128}.cu), and what the plans need to drive them. The
// small kernels around them: table_kernels.h (tables, tile schedule) and backward_support.h
// (delta, the sinks' gradient, accumulator casts).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

#include "attention_params.h"
#include "storage_tags.h"
#include "tile_shapes.h"
#include "thdcp/core/dtype.h"
#include "thdcp/cuda/table.h"
#include "thdcp/plan/mask.h"

namespace thdcp::cuda::detail {

// The compile-time instantiation of a (dtype, D_qk, D_v), FlashAttention's static switch:
// calls body(Storage{}, std::integral_constant<int, kDqk>{}, std::integral_constant<int,
// kDv>{}) for bf16/fp16 and the pairs cuda_supports_head_dims accepts (the plans have
// checked both).
template <int kDqk, int kDv, typename Body>
void dispatch_dtype(DType dtype, Body&& body) {
  using Qk = std::integral_constant<int, kDqk>;
  using V = std::integral_constant<int, kDv>;
  dtype == DType::kBFloat16 ? body(Bf16Tag{}, Qk{}, V{}) : body(Fp16Tag{}, Qk{}, V{});
}

template <typename Body>
void dispatch_instantiation(DType dtype, int64_t head_dim, int64_t v_head_dim, Body&& body) {
  if (v_head_dim != head_dim) return dispatch_dtype<192, 128>(dtype, body);  // MLA
  switch (head_dim) {
    case 64: return dispatch_dtype<64, 64>(dtype, body);
    case 96: return dispatch_dtype<96, 96>(dtype, body);
    case 128: return dispatch_dtype<128, 128>(dtype, body);
    case 192: return dispatch_dtype<192, 192>(dtype, body);
    default: return dispatch_dtype<256, 256>(dtype, body);
  }
}

// Sets a kernel's dynamic shared memory on the current device, after checking that the
// device gives a block that much (kernel_name and the head dims name the refusal).
void set_dynamic_shared_memory(const void* kernel, size_t bytes, const char* kernel_name, int head_dim,
                               int v_head_dim);

// The fields every attention kernel's params take from the call: the tensors q, k, v, out
// and lse, the table, the heads, the scale and the mask (ForwardParams and BackwardParams,
// ForwardTensors and BackwardTensors name them alike).
template <typename Params, typename Tensors>
void set_call_fields(Params& params, const Tensors& t, const DeviceSegmentTable& table, int64_t q_heads,
                     int64_t kv_heads, float scale) {
  params.q = t.q.data;
  params.k = t.k.data;
  params.v = t.v.data;
  params.out = t.out.data;
  params.lse = t.lse;
  params.segments = table.segments;
  params.num_segments = table.capacity;
  params.q_rows = table.q_rows;
  params.q_heads = static_cast<int>(q_heads);
  params.kv_heads = static_cast<int>(kv_heads);
  params.scale = scale;
  params.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  params.window_left = table.mask.window_left;
  params.window_right = table.mask.window_right;
}

// Whether the current device runs the Hopper kernels (sm_90a wgmma; compute capability 9.x)
// for the forward and the deterministic backward, unless the environment variable
// THDCP_PORTABLE_KERNELS is 1, which selects the mma.sync kernels on every device (to test
// and time them on Hopper); read once per process. Host queries only: safe during stream
// capture. The plans call it once and keep the answer.
bool use_sm90_kernels();

// Query rows per forward block of a kernel family at head dims (D_qk, D_v): the tile schedule
// and grid of the forward are sized with it.
inline int forward_tile_rows(bool sm90, int head_dim, int v_head_dim) {
  return sm90 ? forward_sm90_tile_rows(head_dim) : forward_portable_tile_rows(v_head_dim);
}

// Sets the attributes (dynamic shared memory, carveout) of the kernels that launch_forward /
// launch_backward will run for this family (and fused dQ pass) on the current device.
template <typename Storage, int kDqk, int kDv>
void configure_forward(bool sm90);
template <typename Storage, int kDqk, int kDv>
void configure_backward(bool sm90, bool fused);

// Enqueue the kernels of the family `sm90` (configured before on the launching device).
// The forward runs the Hopper kernel when `maps` (the TMA maps of q, k, v) is given, with
// one persistent block per SM (sm_count of the launching device).
template <typename Storage, int kDqk, int kDv>
void launch_forward(const ForwardParams& params, const ForwardStrides& strides, const ForwardTensorMaps* maps,
                    int grid_tiles, int sm_count, cudaStream_t stream);
template <typename Storage, int kDqk, int kDv>
void launch_backward(const BackwardParams& params, const BackwardStrides& strides, bool sm90, int grid_q_tiles,
                     int grid_k_tiles, cudaStream_t stream);

}  // namespace thdcp::cuda::detail
