// ForwardPlan: validation and kernel attributes once, then runs that only enqueue.
#include <limits>

#include "attention_checks.h"
#include "launch.h"
#include "table_kernels.h"
#include "tensor_map.h"
#include "thdcp/core/error.h"
#include "thdcp/core/overlap.h"
#include "thdcp/core/softmax_scale.h"
#include "thdcp/cuda/attention.h"
#include "thdcp/cuda/check.h"

namespace thdcp::cuda {

namespace {

// Query tiles never overlap and lie inside q_rows, so their count is at most
// ceil(q_rows / tile) plus one partial tile per segment.
int64_t forward_grid_tiles(const DeviceSegmentTable& table, bool sm90, const AttentionShape& shape) {
  const int tile_rows = detail::forward_tile_rows(sm90, static_cast<int>(shape.head_dim),
                                                  static_cast<int>(shape.value_head_dim()));
  return detail::ceil_div(table.q_rows, tile_rows) + table.capacity;
}

void check_forward_tensors(const AttentionShape& shape, const ForwardTensors& t) {
  const DeviceSegmentTable& table = shape.table;
  detail::check_view("q", t.q, detail::q_shape(shape), shape.dtype);
  detail::check_view("k", t.k, detail::kv_shape(shape), shape.dtype);
  detail::check_view("v", t.v, detail::kv_value_shape(shape), shape.dtype);
  detail::check_view("out", t.out, detail::q_value_shape(shape), shape.dtype);
  check_outputs_apart({{"out", t.out}}, {{"q", t.q}, {"k", t.k}, {"v", t.v}});
  detail::check_float_array("lse", t.lse, shape.q_heads * table.q_rows);
  if (t.max_logit) detail::check_float_array("max_logit", t.max_logit, shape.q_heads);
  if (t.sinks) detail::check_float_array("sinks", t.sinks, shape.q_heads);
}

}  // namespace

size_t ForwardPlan::workspace_size(const AttentionShape& shape) {
  THDCP_CHECK(shape.table.capacity >= 0, "segment table capacity " << shape.table.capacity << " must be >= 0");
  // Tile prefix sums (capacity + 1), then the Hopper kernel's work-item counter.
  return align_workspace(sizeof(int) * (static_cast<size_t>(shape.table.capacity) + 2));
}

ForwardPlan::ForwardPlan(const AttentionShape& shape, const AttentionOptions& options, void* workspace,
                         size_t workspace_bytes)
    : shape_(shape) {
  detail::check_shape(shape_, /*backward=*/false);
  scale_ = resolve_softmax_scale(options.softmax_scale, shape_.head_dim);
  THDCP_CHECK(options.sm_margin >= 0, "sm_margin=" << options.sm_margin
                                                   << " must be >= 0 (the SMs the forward leaves free; 0: none)");
  device_ = detail::current_device();
  const int head_dim = static_cast<int>(shape_.head_dim);
  const int v_head_dim = static_cast<int>(shape_.value_head_dim());
  sm90_ = detail::use_sm90_kernels() && detail::sm90_serves(head_dim, v_head_dim);
  if (sm90_) {
    tensor_map_encoder_ = reinterpret_cast<void*>(detail::tensor_map_encoder());
    int multiprocessors = 0;
    THDCP_CHECK_CUDA(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device_));
    THDCP_CHECK(options.sm_margin < multiprocessors,
                "sm_margin=" << options.sm_margin << " leaves no SM for the forward: device " << device_ << " has "
                             << multiprocessors << "; pass at most " << multiprocessors - 1);
    sm_count_ = multiprocessors - options.sm_margin;  // the persistent kernel's blocks at most
  }
  THDCP_CHECK(forward_grid_tiles(shape_.table, sm90_, shape_) <= std::numeric_limits<int32_t>::max(),
              "too many query tiles: " << forward_grid_tiles(shape_.table, sm90_, shape_)
                                       << " (q_rows=" << shape_.table.q_rows << ", capacity "
                                       << shape_.table.capacity << ")");
  const size_t needed = workspace_size(shape_);
  THDCP_CHECK(workspace_bytes >= needed,
              "workspace has " << workspace_bytes
                               << " bytes; ForwardPlan::workspace_size (forward_workspace_size) gives " << needed
                               << ": pass a workspace of that size");
  detail::check_device_pointer("workspace", workspace, device_, kWorkspaceAlignment);
  workspace_ = workspace;
  detail::dispatch_instantiation(shape_.dtype, head_dim, v_head_dim, [&](auto storage, auto kDqk, auto kDv) {
    detail::configure_forward<decltype(storage), kDqk, kDv>(sm90_);
  });
}

void ForwardPlan::check_tensors(const ForwardTensors& t) const {
  check_forward_tensors(shape_, t);
  const int64_t q_rows = shape_.table.q_rows;
  if (t.q.numel() > 0) detail::check_device_pointer("q", t.q.data, device_, 16);
  if (t.k.numel() > 0) detail::check_device_pointer("k", t.k.data, device_, 16);
  if (t.v.numel() > 0) detail::check_device_pointer("v", t.v.data, device_, 16);
  if (t.out.numel() > 0) detail::check_device_pointer("out", t.out.data, device_, 16);
  if (shape_.q_heads * q_rows > 0) detail::check_device_pointer("lse", t.lse, device_, alignof(float));
  if (t.max_logit) detail::check_device_pointer("max_logit", t.max_logit, device_, alignof(float));
  if (t.sinks) detail::check_device_pointer("sinks", t.sinks, device_, alignof(float));
}

void ForwardPlan::run(const DeviceSegmentTable& table, const ForwardTensors& t, cudaStream_t stream) const {
  detail::check_table_matches(shape_, table);
  check_forward_tensors(shape_, t);

  detail::ForwardParams params{};
  detail::set_call_fields(params, t, table, shape_.q_heads, shape_.kv_heads, scale_);
  params.max_logit = t.max_logit;
  params.sinks = t.sinks;
  params.tile_start = static_cast<const int*>(workspace_);
  params.work_counter = static_cast<int*>(workspace_) + table.capacity + 1;
  const detail::ForwardStrides strides{detail::strides_of(t.q), detail::strides_of(t.k), detail::strides_of(t.v),
                                       detail::strides_of(t.out)};

  // Also sets max_logit to -inf (all that an empty table writes) and zeroes the counter.
  const int head_dim = static_cast<int>(shape_.head_dim);
  const int v_head_dim = static_cast<int>(shape_.value_head_dim());
  detail::launch_schedule(table.segments, table.capacity, detail::forward_tile_rows(sm90_, head_dim, v_head_dim),
                          static_cast<int*>(workspace_), 1, nullptr, t.max_logit,
                          params.q_heads, params.work_counter, stream);
  if (table.capacity == 0) return;
  const int grid_tiles = static_cast<int>(forward_grid_tiles(table, sm90_, shape_));
  // The Hopper kernel's TMA maps: host arithmetic and a driver call per tensor, no stream
  // work (capture-safe); a graph keeps them with the kernel's parameters.
  detail::ForwardTensorMaps maps;
  if (sm90_) {
    const auto encode = reinterpret_cast<detail::EncodeTiledFn>(tensor_map_encoder_);
    maps.q = detail::encode_thd_tensor_map(encode, "q", t.q, detail::forward_sm90_tile_rows(head_dim));
    maps.k = detail::encode_thd_tensor_map(encode, "k", t.k, detail::forward_sm90_key_rows(v_head_dim));
    maps.v = detail::encode_thd_tensor_map(encode, "v", t.v, detail::forward_sm90_key_rows(v_head_dim));
  }
  const detail::ForwardTensorMaps* sm90_maps = sm90_ ? &maps : nullptr;
  detail::dispatch_instantiation(shape_.dtype, head_dim, v_head_dim, [&](auto storage, auto kDqk, auto kDv) {
    detail::launch_forward<decltype(storage), kDqk, kDv>(params, strides, sm90_maps, grid_tiles, sm_count_, stream);
  });
}

}  // namespace thdcp::cuda
