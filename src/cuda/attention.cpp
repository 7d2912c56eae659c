// Host side of the CUDA backend: argument checks, workspace layout, grid sizes and the
// enqueueing of the kernels. Nothing here reads device memory or synchronises.
#include "thdcp/cuda/attention.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "launch.h"
#include "thdcp/cuda/check.h"
#include "thdcp/core/error.h"

namespace thdcp::cuda {

namespace detail {

bool use_sm90_kernels() {
  static const bool portable = [] {
    const char* value = std::getenv("THDCP_PORTABLE_KERNELS");
    return value != nullptr && std::strcmp(value, "1") == 0;
  }();
  if (portable) return false;
  // Per device, looked up once (attribute queries do not touch a stream).
  constexpr int kMaxDevices = 64;
  static std::atomic<int> major[kMaxDevices];
  int device = 0;
  THDCP_CHECK_CUDA(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices) return false;
  if (major[device].load() == 0) {
    int value = 0;
    THDCP_CHECK_CUDA(cudaDeviceGetAttribute(&value, cudaDevAttrComputeCapabilityMajor, device));
    major[device].store(value);
  }
  return major[device].load() == 9;
}

int forward_tile_rows() { return use_sm90_kernels() ? kForwardSm90TileRows : kForwardTileRows; }

}  // namespace detail

const char* kernel_family() { return detail::use_sm90_kernels() ? "sm90" : "portable"; }

namespace {

constexpr size_t kAlignment = 256;

size_t align_up(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

const char* memory_type_name(cudaMemoryType type) {
  switch (type) {
    case cudaMemoryTypeUnregistered: return "unregistered host memory";
    case cudaMemoryTypeHost: return "pinned host memory";
    case cudaMemoryTypeDevice: return "device memory";
    case cudaMemoryTypeManaged: return "managed memory";
  }
  return "unknown memory";
}

int current_device() {
  int device = 0;
  THDCP_CHECK_CUDA(cudaGetDevice(&device));
  return device;
}

// A pointer the kernels read or write: device (or managed) memory of `device`, aligned to
// `alignment` bytes (16 for the tiles the kernels copy with 16-byte cp.async).
void check_device_pointer(const char* name, const void* pointer, int device, size_t alignment) {
  THDCP_CHECK(pointer != nullptr, name << " is a null pointer");
  THDCP_CHECK(reinterpret_cast<uintptr_t>(pointer) % alignment == 0,
              name << "=" << pointer << " is not " << alignment
                   << "-byte aligned: the CUDA kernels need aligned rows (allocate with cudaMalloc, "
                      "offset by whole rows)");
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, pointer);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky; do not leave it for the caller's next check
    THDCP_FAIL(name << "=" << pointer << " is not a CUDA pointer (" << cudaGetErrorString(status) << ")");
  }
  THDCP_CHECK(attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged,
              name << " points to " << memory_type_name(attributes.type)
                   << ": pass device memory of the current device " << device);
  THDCP_CHECK(attributes.device == device, name << " lives on device " << attributes.device
                                                << " but the current device is " << device
                                                << ": call cudaSetDevice(" << attributes.device
                                                << ") or move the tensor");
}

void check_mask(const Mask& mask) {
  THDCP_CHECK(mask.window_left >= -1, "window_left=" << mask.window_left << " must be >= 0, or -1 for unbounded");
  THDCP_CHECK(mask.window_right >= -1,
              "window_right=" << mask.window_right << " must be >= 0, or -1 for unbounded");
}

void check_table(const DeviceSegmentTable& table, int device) {
  THDCP_CHECK(table.capacity >= 0, "segment table capacity " << table.capacity << " must be >= 0");
  THDCP_CHECK(table.q_rows >= 0 && table.k_rows >= 0 && table.q_rows <= std::numeric_limits<int32_t>::max() &&
                  table.k_rows <= std::numeric_limits<int32_t>::max(),
              "segment table rows (q_rows=" << table.q_rows << ", k_rows=" << table.k_rows
                                            << ") must be in [0, 2^31)");
  check_mask(table.mask);
  if (table.capacity > 0) check_device_pointer("table.segments", table.segments, device, alignof(Segment));
}

void check_tensor(const char* name, const ConstThdTensor& t, int64_t rows, int64_t heads, int64_t head_dim,
                  int device) {
  THDCP_CHECK(t.tokens == rows, name << " has " << t.tokens << " rows but the segment table addresses " << rows);
  THDCP_CHECK(t.heads == heads, name << " has " << t.heads << " heads, expected " << heads);
  THDCP_CHECK(t.head_dim == head_dim, name << " has head_dim=" << t.head_dim << ", expected " << head_dim);
  if (t.numel() > 0) check_device_pointer(name, t.data, device, 16);
}

void check_qkv(const DeviceSegmentTable& table, const ConstThdTensor& q, const ConstThdTensor& k,
               const ConstThdTensor& v, int device) {
  THDCP_CHECK(q.dtype == DType::kBFloat16 || q.dtype == DType::kFloat16,
              "q has dtype " << dtype_name(q.dtype) << ": the CUDA backend takes bf16 or fp16");
  THDCP_CHECK(k.dtype == q.dtype && v.dtype == q.dtype,
              "q, k, v must share a dtype; got " << dtype_name(q.dtype) << ", " << dtype_name(k.dtype) << ", "
                                                 << dtype_name(v.dtype));
  THDCP_CHECK(cuda_supports_head_dim(q.head_dim),
              "head_dim=" << q.head_dim << " is not supported by the CUDA backend: use 64 or 128");
  THDCP_CHECK(q.heads >= 1 && k.heads >= 1 && q.heads <= 65535,
              "q has " << q.heads << " heads and k has " << k.heads << ": need 1 <= Hkv and Hq <= 65535");
  THDCP_CHECK(q.heads % k.heads == 0, "q has " << q.heads << " heads, not a multiple of the " << k.heads
                                               << " heads of k/v (GQA/MQA need Hq % Hkv == 0)");
  check_table(table, device);
  check_tensor("q", q, table.q_rows, q.heads, q.head_dim, device);
  check_tensor("k", k, table.k_rows, k.heads, q.head_dim, device);
  check_tensor("v", v, table.k_rows, k.heads, q.head_dim, device);
}

float resolve_scale(const Options& options, int64_t head_dim) {
  THDCP_CHECK(std::isfinite(options.softmax_scale) && options.softmax_scale >= 0.0f,
              "softmax_scale=" << options.softmax_scale << " must be finite and >= 0 (0 means 1/sqrt(head_dim))");
  return options.softmax_scale > 0.0f ? options.softmax_scale
                                      : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

// Segments that can reach one key row: the dK/dV grid bound and the determinism argument.
int segments_per_key_row(TableKind kind) { return kind == TableKind::kAllGatherCp ? 2 : 1; }

// Workspace of the backward, in order.
struct BackwardWorkspace {
  size_t q_start = 0;
  size_t k_start = 0;
  size_t delta = 0;
  size_t dk_accum = 0;
  size_t dv_accum = 0;
  size_t dq_accum = 0;
  size_t total = 0;
};

BackwardWorkspace backward_layout(const DeviceSegmentTable& table, int64_t q_heads, int64_t kv_heads,
                                  int64_t head_dim, DType dkv_dtype, bool fused_dq) {
  BackwardWorkspace w;
  const size_t schedule = align_up(sizeof(int) * (static_cast<size_t>(table.capacity) + 1));
  w.q_start = 0;
  w.k_start = w.q_start + schedule;
  w.delta = w.k_start + schedule;
  size_t end = w.delta + align_up(sizeof(float) * static_cast<size_t>(q_heads * table.q_rows));
  if (dkv_dtype != DType::kFloat32) {
    const size_t accum = align_up(sizeof(float) * static_cast<size_t>(table.k_rows * kv_heads * head_dim));
    w.dk_accum = end;
    w.dv_accum = end + accum;
    end += 2 * accum;
  }
  if (fused_dq) {
    w.dq_accum = end;
    end += align_up(sizeof(float) * static_cast<size_t>(table.q_rows * q_heads * head_dim));
  }
  w.total = end;
  return w;
}

template <typename T>
T* at(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<unsigned char*>(base) + offset);
}

}  // namespace

bool cuda_supports_head_dim(int64_t head_dim) { return head_dim == 64 || head_dim == 128; }

int segment_table_capacity(TableKind kind, int max_seqs) {
  THDCP_CHECK(max_seqs >= 0, "max_seqs=" << max_seqs << " must be >= 0");
  return kind == TableKind::kAllGatherCp ? 2 * max_seqs : max_seqs;
}

DeviceSegmentTable build_segment_table(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded, int max_seqs,
                                       int64_t total_rows, const Mask& mask, Segment* segments,
                                       cudaStream_t stream) {
  check_mask(mask);
  THDCP_CHECK(max_seqs >= 1, "max_seqs=" << max_seqs << " must be >= 1");
  THDCP_CHECK(total_rows >= 0 && total_rows <= std::numeric_limits<int32_t>::max(),
              "total_rows=" << total_rows << " must be in [0, 2^31)");
  const int device = current_device();
  check_device_pointer("cu_seqlens", cu_seqlens, device, alignof(int32_t));
  check_device_pointer("cu_seqlens_padded", cu_seqlens_padded, device, alignof(int32_t));
  check_device_pointer("segments", segments, device, alignof(Segment));
  detail::launch_build_single_table(cu_seqlens, cu_seqlens_padded, max_seqs, segments, stream);
  DeviceSegmentTable table;
  table.segments = segments;
  table.capacity = segment_table_capacity(TableKind::kSingleDevice, max_seqs);
  table.q_rows = table.k_rows = total_rows;
  table.mask = mask;
  table.kind = TableKind::kSingleDevice;
  return table;
}

DeviceSegmentTable build_cp_segment_table(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded,
                                          int max_seqs, int64_t total_rows, int cp, int rank, const Mask& mask,
                                          Segment* segments, cudaStream_t stream) {
  check_mask(mask);
  THDCP_CHECK(max_seqs >= 1, "max_seqs=" << max_seqs << " must be >= 1");
  THDCP_CHECK(cp >= 1, "cp=" << cp << " must be >= 1");
  THDCP_CHECK(rank >= 0 && rank < cp, "rank=" << rank << " must be in [0, cp=" << cp << ")");
  THDCP_CHECK(total_rows >= 0 && total_rows <= std::numeric_limits<int32_t>::max(),
              "total_rows=" << total_rows << " must be in [0, 2^31)");
  THDCP_CHECK(total_rows % (2 * static_cast<int64_t>(cp)) == 0,
              "total_rows=" << total_rows << " is not a multiple of 2*cp=" << 2 * cp);
  const int device = current_device();
  check_device_pointer("cu_seqlens", cu_seqlens, device, alignof(int32_t));
  check_device_pointer("cu_seqlens_padded", cu_seqlens_padded, device, alignof(int32_t));
  check_device_pointer("segments", segments, device, alignof(Segment));
  detail::launch_build_cp_table(cu_seqlens, cu_seqlens_padded, max_seqs, cp, rank, mask, segments, stream);
  DeviceSegmentTable table;
  table.segments = segments;
  table.capacity = segment_table_capacity(TableKind::kAllGatherCp, max_seqs);
  table.q_rows = total_rows / cp;
  table.k_rows = total_rows;
  table.mask = mask;
  table.kind = TableKind::kAllGatherCp;
  return table;
}

size_t forward_workspace_size(const DeviceSegmentTable& table) {
  THDCP_CHECK(table.capacity >= 0, "segment table capacity " << table.capacity << " must be >= 0");
  return align_up(sizeof(int) * (static_cast<size_t>(table.capacity) + 1));
}

size_t backward_workspace_size(const DeviceSegmentTable& table, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                               DType dkv_dtype, const Options& options) {
  THDCP_CHECK(table.capacity >= 0, "segment table capacity " << table.capacity << " must be >= 0");
  THDCP_CHECK(q_heads >= 0 && kv_heads >= 0 && head_dim >= 0, "heads and head_dim must be >= 0");
  return backward_layout(table, q_heads, kv_heads, head_dim, dkv_dtype, !options.deterministic).total;
}

void attention_forward(const DeviceSegmentTable& table, ConstThdTensor q, ConstThdTensor k, ConstThdTensor v,
                       ThdTensor out, float* lse, float* max_logit, void* workspace, size_t workspace_bytes,
                       cudaStream_t stream, const Options& options) {
  const int device = current_device();
  check_qkv(table, q, k, v, device);
  check_tensor("out", out, table.q_rows, q.heads, q.head_dim, device);
  THDCP_CHECK(out.dtype == q.dtype,
              "out has dtype " << dtype_name(out.dtype) << " but q has " << dtype_name(q.dtype) << ": they must match");
  if (q.heads * table.q_rows > 0) check_device_pointer("lse", lse, device, alignof(float));
  if (max_logit) check_device_pointer("max_logit", max_logit, device, alignof(float));
  const size_t needed = forward_workspace_size(table);
  THDCP_CHECK(workspace_bytes >= needed, "workspace has " << workspace_bytes << " bytes; forward_workspace_size gives "
                                                          << needed);
  check_device_pointer("workspace", workspace, device, kAlignment);
  const float scale = resolve_scale(options, q.head_dim);

  detail::ForwardParams params{};
  params.q = q.data;
  params.k = k.data;
  params.v = v.data;
  params.out = out.data;
  params.lse = lse;
  params.max_logit = max_logit;
  params.segments = table.segments;
  params.num_segments = table.capacity;
  params.tile_start = static_cast<const int*>(workspace);
  params.q_rows = table.q_rows;
  params.q_heads = static_cast<int>(q.heads);
  params.kv_heads = static_cast<int>(k.heads);
  params.scale = scale;
  params.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  params.window_left = table.mask.window_left;
  params.window_right = table.mask.window_right;

  // Also sets max_logit to -inf (all that an empty table writes).
  const int tile_rows = detail::forward_tile_rows();
  detail::launch_schedule(table.segments, table.capacity, tile_rows, static_cast<int*>(workspace), 1, nullptr,
                          max_logit, params.q_heads, stream);
  // Query tiles never overlap and lie inside q_rows, so their count is at most
  // ceil(q_rows / tile) plus one partial tile per segment.
  const int64_t grid_tiles = ceil_div(table.q_rows, tile_rows) + table.capacity;
  THDCP_CHECK(grid_tiles <= std::numeric_limits<int32_t>::max(), "too many query tiles: " << grid_tiles);
  if (table.capacity == 0) return;
  const bool bf16 = q.dtype == DType::kBFloat16;
  if (q.head_dim == 64) {
    bf16 ? detail::launch_forward<detail::Bf16Tag, 64>(params, static_cast<int>(grid_tiles), stream)
         : detail::launch_forward<detail::Fp16Tag, 64>(params, static_cast<int>(grid_tiles), stream);
  } else {
    bf16 ? detail::launch_forward<detail::Bf16Tag, 128>(params, static_cast<int>(grid_tiles), stream)
         : detail::launch_forward<detail::Fp16Tag, 128>(params, static_cast<int>(grid_tiles), stream);
  }
}

void attention_backward(const DeviceSegmentTable& table, ConstThdTensor q, ConstThdTensor k, ConstThdTensor v,
                        ConstThdTensor out, ConstThdTensor dout, const float* lse, ThdTensor dq, ThdTensor dk,
                        ThdTensor dv, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                        const Options& options) {
  const int device = current_device();
  check_qkv(table, q, k, v, device);
  check_tensor("out", out, table.q_rows, q.heads, q.head_dim, device);
  check_tensor("dout", dout, table.q_rows, q.heads, q.head_dim, device);
  check_tensor("dq", dq, table.q_rows, q.heads, q.head_dim, device);
  check_tensor("dk", dk, table.k_rows, k.heads, q.head_dim, device);
  check_tensor("dv", dv, table.k_rows, k.heads, q.head_dim, device);
  THDCP_CHECK(out.dtype == q.dtype && dout.dtype == q.dtype,
              "out and dout must have q's dtype " << dtype_name(q.dtype) << "; got " << dtype_name(out.dtype) << " and "
                                                  << dtype_name(dout.dtype));
  THDCP_CHECK(dq.dtype == q.dtype || dq.dtype == DType::kFloat32,
              "dq has dtype " << dtype_name(dq.dtype) << ": use q's dtype (" << dtype_name(q.dtype) << ") or fp32");
  THDCP_CHECK(dk.dtype == q.dtype || dk.dtype == DType::kFloat32,
              "dk has dtype " << dtype_name(dk.dtype) << ": use k's dtype (" << dtype_name(q.dtype) << ") or fp32");
  THDCP_CHECK(dv.dtype == dk.dtype,
              "dk and dv must share a dtype; got " << dtype_name(dk.dtype) << " and " << dtype_name(dv.dtype));
  if (q.heads * table.q_rows > 0) check_device_pointer("lse", lse, device, alignof(float));
  // deterministic = false allows the fused pass with dQ atomics; on Hopper the sm90 pair of
  // deterministic passes is the faster one, so it serves both settings there. The workspace
  // check below uses the size backward_workspace_size reports (room for dq_accum either way).
  const bool fused_dq = !options.deterministic && !detail::use_sm90_kernels();
  const BackwardWorkspace layout =
      backward_layout(table, q.heads, k.heads, q.head_dim, dk.dtype, !options.deterministic);
  THDCP_CHECK(workspace_bytes >= layout.total, "workspace has " << workspace_bytes
                                                                << " bytes; backward_workspace_size gives "
                                                                << layout.total << " for dk/dv in "
                                                                << dtype_name(dk.dtype) << " and deterministic="
                                                                << options.deterministic);
  check_device_pointer("workspace", workspace, device, kAlignment);
  // Every table kind this backend builds reaches a key row from at most two segments
  // (segments_per_key_row), which keeps the fp32 dK/dV accumulation order-independent.
  const float scale = resolve_scale(options, q.head_dim);

  const bool fp32_dkv = dk.dtype == DType::kFloat32;
  detail::BackwardParams params{};
  params.q = q.data;
  params.k = k.data;
  params.v = v.data;
  params.out = out.data;
  params.dout = dout.data;
  params.lse = lse;
  params.delta = at<float>(workspace, layout.delta);
  params.dq = dq.data;
  params.dq_fp32 = dq.dtype == DType::kFloat32;
  params.dq_accum = fused_dq ? at<float>(workspace, layout.dq_accum) : nullptr;
  params.dk_accum = fp32_dkv ? static_cast<float*>(dk.data) : at<float>(workspace, layout.dk_accum);
  params.dv_accum = fp32_dkv ? static_cast<float*>(dv.data) : at<float>(workspace, layout.dv_accum);
  params.segments = table.segments;
  params.num_segments = table.capacity;
  params.q_tile_start = at<int>(workspace, layout.q_start);
  params.k_tile_start = at<int>(workspace, layout.k_start);
  params.q_rows = table.q_rows;
  params.k_rows = table.k_rows;
  params.q_heads = static_cast<int>(q.heads);
  params.kv_heads = static_cast<int>(k.heads);
  params.scale = scale;
  params.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  params.window_left = table.mask.window_left;
  params.window_right = table.mask.window_right;

  // dK/dV start at exactly 0: rows no query reaches stay 0.
  const size_t dkv_bytes = sizeof(float) * static_cast<size_t>(dk.numel());
  if (dkv_bytes > 0) {
    THDCP_CHECK_CUDA(cudaMemsetAsync(params.dk_accum, 0, dkv_bytes, stream));
    THDCP_CHECK_CUDA(cudaMemsetAsync(params.dv_accum, 0, dkv_bytes, stream));
  }
  const size_t dq_bytes = sizeof(float) * static_cast<size_t>(dq.numel());
  if (fused_dq && dq_bytes > 0) THDCP_CHECK_CUDA(cudaMemsetAsync(params.dq_accum, 0, dq_bytes, stream));
  if (table.capacity > 0) {
    const int dkv_tile_rows = fused_dq ? detail::kDkvFusedTileRows : detail::kDkvTileRows;
    detail::launch_schedule(table.segments, table.capacity, detail::kDqTileRows, at<int>(workspace, layout.q_start),
                            dkv_tile_rows, at<int>(workspace, layout.k_start), nullptr, params.q_heads, stream);
    detail::launch_delta(out.data, dout.data, q.dtype, table.q_rows, params.q_heads, static_cast<int>(q.head_dim),
                         params.delta, stream);
    const int64_t grid_q = ceil_div(table.q_rows, detail::kDqTileRows) + table.capacity;
    // Key tiles: each segment's keys lie inside its sequence's valid rows, and at most
    // segments_per_key_row segments share a row.
    const int64_t grid_k =
        ceil_div(table.k_rows * segments_per_key_row(table.kind), dkv_tile_rows) + table.capacity;
    THDCP_CHECK(grid_q <= std::numeric_limits<int32_t>::max() && grid_k <= std::numeric_limits<int32_t>::max(),
                "too many tiles: " << grid_q << " query, " << grid_k << " key");
    const bool bf16 = q.dtype == DType::kBFloat16;
    const int gq = static_cast<int>(grid_q);
    const int gk = static_cast<int>(grid_k);
    if (q.head_dim == 64) {
      bf16 ? detail::launch_backward<detail::Bf16Tag, 64>(params, gq, gk, stream)
           : detail::launch_backward<detail::Fp16Tag, 64>(params, gq, gk, stream);
    } else {
      bf16 ? detail::launch_backward<detail::Bf16Tag, 128>(params, gq, gk, stream)
           : detail::launch_backward<detail::Fp16Tag, 128>(params, gq, gk, stream);
    }
  }
  if (!fp32_dkv) {
    detail::launch_cast(params.dk_accum, dk.data, dk.dtype, dk.numel(), 1.0f, stream);
    detail::launch_cast(params.dv_accum, dv.data, dv.dtype, dv.numel(), 1.0f, stream);
  }
  // The fused path accumulates dS K; the softmax scale is applied once here.
  if (fused_dq) detail::launch_cast(params.dq_accum, dq.data, dq.dtype, dq.numel(), scale, stream);
}

}  // namespace thdcp::cuda
