// Tile shapes of the attention kernels, shared by the kernels (device headers) and the host
// code that sizes their grids and schedules (launch.h, the plans).
#pragma once

namespace thdcp::cuda::detail {

// Query rows per forward block (portable kernel; the Hopper one: consumer warpgroups of 64
// rows, two at head dim 128 and three at 64, see forward_sm90_tile_rows), query rows per dQ
// block, key rows per dK/dV block (64 for the deterministic
// backward: two 4-warp blocks per SM; 128 when dQ is fused into it: half the dQ atomics).
// The host sizes grids and schedules with them.
constexpr int kForwardTileRows = 128;
// The Hopper forward's query rows per block and key rows per K/V tile at head dim D: at 64
// the GEMMs of a key tile are too short for two warpgroups to hide each other's softmax, so
// three take turns (as FlashAttention-3's 192 x 128 tiles).
constexpr int forward_sm90_tile_rows(int head_dim) { return head_dim == 64 ? 192 : 128; }
// Key rows per K/V tile of the Hopper forward: 128, or 64 above D_v 128 (the O accumulator
// of 256 columns takes the registers that S of 128 keys would).
constexpr int forward_sm90_key_rows(int v_head_dim) { return v_head_dim > 128 ? 64 : 128; }
constexpr int kDqTileRows = 64;
constexpr int kDkvTileRows = 64;
constexpr int kDkvFusedTileRows = 128;
// Key rows per block of the Hopper dK/dV/dQ pass (head dim 128): two consumer warpgroups.
constexpr int kDkvqTileRows = 128;

// Head dims. D_qk (q, k) and D_v (v, out, dout) are template parameters of the portable
// kernels, which serve every pair the backend supports (cuda_supports_head_dims). The Hopper
// kernels serve 64, 128, 192, MLA's (192, 128) and 256 (whole 64-column swizzle atoms); the
// portable ones run 96 on Hopper.
constexpr bool sm90_serves(int head_dim, int v_head_dim) {
  return (head_dim == v_head_dim && head_dim % 64 == 0 && head_dim >= 64 && head_dim <= 256) ||
         (head_dim == 192 && v_head_dim == 128);
}

// Whether the Hopper dK/dV pass splits each step's products between two warpgroups by
// operand (dkv_wide_kernel_sm90): above 128 columns, where one warpgroup's registers cannot
// hold dK and dV beside the step's S^T and dP^T.
constexpr bool sm90_dkv_wide(int head_dim, int v_head_dim) { return head_dim > 128 || v_head_dim > 128; }
// The same for the dQ pass (dq_wide_kernel_sm90): at 256, where one warpgroup's tiles take
// 193 KiB and its registers spill. At 192 and 192/128 the one-warpgroup pass measured
// faster (one H200, bwd TFLOP/s 282.2 against 261.2 at 192, 288.3 against 246.9 at MLA's;
// 271.3 against 282.0 at 256; bench/RESULTS.md).
constexpr bool sm90_dq_wide(int head_dim, int v_head_dim) { return head_dim > 192 || v_head_dim > 192; }

// Elements per shared-memory row of a tile of D-element rows: D rounded up to 64 elements, a
// whole swizzle group of eight 16-byte chunks (96 -> 128: the padding chunks are neither
// loaded nor read).
constexpr int smem_row_elements(int head_dim) { return (head_dim + 63) / 64 * 64; }

// Query rows per block of the portable forward: four warps of two 16-row fragments each, or
// one fragment each above D_v 128 (the O accumulator's registers).
constexpr int forward_portable_tile_rows(int v_head_dim) { return v_head_dim <= 128 ? kForwardTileRows : 64; }

// Column slices of the portable dK/dV pass (its grid's z): above 128 columns a block's
// dK and dV registers would spill, so each block owns 1/slices of their columns (and
// recomputes S^T and dP^T for them).
constexpr int dkv_column_slices(int head_dim, int v_head_dim) { return head_dim > 128 || v_head_dim > 128 ? 2 : 1; }

// Whether the portable dK/dV pass can fuse the dQ pass (AttentionOptions::deterministic =
// false): its dQ columns split over the block's warps in 16-column steps, at D_qk = D_v in
// {64, 128}. Other pairs run the two deterministic passes in either mode.
constexpr bool portable_fuses_dq(int head_dim, int v_head_dim) {
  return head_dim == v_head_dim && (head_dim == 64 || head_dim == 128);
}

}  // namespace thdcp::cuda::detail
