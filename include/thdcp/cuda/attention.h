// Attention over a segment table on the GPU: the CUDA backend (same semantics as
// thdcp::cpu::attention_forward/backward, DESIGN.md sections 2 and 4).
//
// Plan, then run. Everything that needs the host (argument checks, workspace sizes, grid
// sizes) depends only on the table's *capacity* and the tensor shapes, never on the lengths
// in it. The run functions only enqueue kernels and memsets on `stream`: no allocation, no
// synchronisation, no device-to-host read. So a whole step (table build, forward, backward)
// can be captured once in a CUDA graph and replayed for any batch of the same capacity.
//
// Supported: bf16 and fp16 storage, head_dim 64 and 128, Hq a multiple of Hkv (GQA/MQA),
// fp32 arithmetic on tensor cores (Hopper: wgmma for the forward and the deterministic
// backward, see kernel_family). All pointers are device pointers of the current device,
// 16-byte aligned.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "thdcp/cpu/attention.h"
#include "thdcp/plan/mask.h"
#include "thdcp/plan/segment.h"
#include "thdcp/core/tensor.h"

namespace thdcp::cuda {

// Which builder filled a device table. It bounds how many segments reach one key row
// (1 for a single-device table, 2 for an AllGather-CP table), which sizes the backward grid
// and keeps the fp32 dK/dV accumulation deterministic (see attention_backward).
enum class TableKind {
  kSingleDevice,
  kAllGatherCp,
};

// A segment table in device memory with a fixed capacity. Entries past the batch's real
// sequences are zero-length placeholders written by the builders, so the kernels see a
// fixed-size array and the table needs no host read-back.
struct DeviceSegmentTable {
  Segment* segments = nullptr;  // device array of `capacity` entries
  int capacity = 0;             // entries: max_seqs (single device) or 2 * max_seqs (CP)
  int64_t q_rows = 0;           // rows of the Q/O tensors the table addresses
  int64_t k_rows = 0;           // rows of the K/V tensors the table addresses
  Mask mask;                    // the mask applied by the kernels (and used by the builders)
  TableKind kind = TableKind::kSingleDevice;
};

// Entries a table needs for `max_seqs` sequences: max_seqs, or 2 * max_seqs for CP.
int segment_table_capacity(TableKind kind, int max_seqs);

// Enqueues the build of a single-device table (one segment per sequence, as
// thdcp::build_segment_table) from device metadata.
//   cu_seqlens, cu_seqlens_padded  device int32 arrays of max_seqs + 1 entries (DESIGN.md
//                                  section 1: unused trailing entries repeat the last value)
//   total_rows                     rows of the Q/K/V tensors (cu_seqlens_padded[max_seqs])
//   segments                       device array of segment_table_capacity(kSingleDevice,
//                                  max_seqs) entries, overwritten
// Uses single_device_segment() of thdcp/segment.h, the function the host builder uses.
// Checks the arguments on the host (not the device values: those are the caller's contract,
// as for thdcp::validate_layout on the host) and returns the table's description.
DeviceSegmentTable build_segment_table(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded, int max_seqs,
                                       int64_t total_rows, const Mask& mask, Segment* segments,
                                       cudaStream_t stream);

// Enqueues the build of the AllGather-CP table of `rank` of `cp` (two segments per sequence,
// as thdcp::build_cp_segment_table) with cp_segment() of thdcp/segment.h. The metadata is
// the *global* layout (every P_b a multiple of 2 * cp); q_rows = total_rows / cp,
// k_rows = total_rows. `segments` holds segment_table_capacity(kAllGatherCp, max_seqs).
DeviceSegmentTable build_cp_segment_table(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded,
                                          int max_seqs, int64_t total_rows, int cp, int rank, const Mask& mask,
                                          Segment* segments, cudaStream_t stream);

// Options of the CUDA backend.
struct Options {
  float softmax_scale = 0.0f;  // scale of q.k; 0 means 1/sqrt(head_dim)
  // Backward only. true: same bits on every run. dQ comes from its own pass with no
  // atomics, and each fp32 dK/dV element receives at most two atomic additions onto zero
  // (one per segment that reaches the key row; every table this backend builds has at most
  // two), and two additions onto zero give the same bits in either order.
  // false: the order of additions may vary where that is faster. With the portable kernels,
  // dQ is accumulated inside the dK/dV pass with fp32 atomics (as FlashAttention-2 does), so
  // its last bits depend on the order the blocks run in. On Hopper (kernel_family() "sm90")
  // the deterministic sm90 passes are faster than that fused pass, so they run for both
  // settings (bench/RESULTS.md). Needs a workspace sized with the same options.
  bool deterministic = true;
};

// Head dims the CUDA kernels are compiled for: 64 and 128.
bool cuda_supports_head_dim(int64_t head_dim);

// The kernels the current device runs: "sm90" (Hopper, compute capability 9.x: warpgroup
// MMA kernels for the forward and the deterministic backward) or "portable" (mma.sync
// kernels: on every other GPU, for Options::deterministic = false, and everywhere when the
// environment variable THDCP_PORTABLE_KERNELS is 1). Host queries only; safe during stream
// capture.
const char* kernel_family();

// Bytes of device workspace attention_forward needs (tile schedule). Depends only on the
// table's capacity.
size_t forward_workspace_size(const DeviceSegmentTable& table);

// Bytes of device workspace attention_backward needs: tile schedules, delta = rowsum(dO * O)
// ([Hq, q_rows] fp32), fp32 accumulators for dk/dv when they are stored in 16 bits
// ([k_rows, Hkv, D] each) and, with options.deterministic == false, for dq ([q_rows, Hq, D]).
size_t backward_workspace_size(const DeviceSegmentTable& table, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                               DType dkv_dtype, const Options& options = {});

// Forward attention over `table`, enqueued on `stream`.
//   q          [table.q_rows, Hq, D]   bf16 or fp16
//   k, v       [table.k_rows, Hkv, D]  q's dtype; Hq % Hkv == 0
//   out        [table.q_rows, Hq, D]   q's dtype. Every row of every segment's q_span is
//                                      written (tables from the builders cover every row);
//                                      padding rows and rows that see no key get 0
//   lse        Hq * q_rows floats, [Hq, q_rows]: natural log of the softmax denominator of the
//              scaled scores; -inf for padding rows and rows that see no key
//   max_logit  Hq floats or nullptr: max over allowed pairs of the scaled score; -inf if none
//   workspace  forward_workspace_size(table) bytes of device memory (contents need not be kept)
// Throws thdcp::Error before enqueueing anything when an argument is wrong (shape, dtype,
// head dim, Hq % Hkv, pointer not on the current device or not 16-byte aligned, workspace
// too small).
void attention_forward(const DeviceSegmentTable& table, ConstThdTensor q, ConstThdTensor k, ConstThdTensor v,
                       ThdTensor out, float* lse, float* max_logit, void* workspace, size_t workspace_bytes,
                       cudaStream_t stream, const Options& options = {});

// Backward attention over `table` from the forward's out and lse, enqueued on `stream`.
//   dout       [q_rows, Hq, D]   q's dtype
//   dq         [q_rows, Hq, D]   q's dtype or fp32; every row of every q_span is written
//   dk, dv     [k_rows, Hkv, D]  k's dtype or fp32. Accumulated in fp32 over every query head
//                                of the KV group and every segment that reaches the key row,
//                                rounded once when stored in 16 bits. Rows no query saw are
//                                exactly 0.
//   workspace  backward_workspace_size(table, Hq, Hkv, D, dk.dtype, options) bytes
void attention_backward(const DeviceSegmentTable& table, ConstThdTensor q, ConstThdTensor k, ConstThdTensor v,
                        ConstThdTensor out, ConstThdTensor dout, const float* lse, ThdTensor dq, ThdTensor dk,
                        ThdTensor dv, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                        const Options& options = {});

}  // namespace thdcp::cuda
