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
constexpr int kForwardSm90KeyRows = 128;
constexpr int kDqTileRows = 64;
constexpr int kDkvTileRows = 64;
constexpr int kDkvFusedTileRows = 128;
// Key rows per block of the Hopper dK/dV/dQ pass (head dim 128): two consumer warpgroups.
constexpr int kDkvqTileRows = 128;

}  // namespace thdcp::cuda::detail
