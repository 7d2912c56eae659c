// BackwardPlan: validation, workspace layout and kernel attributes once, then runs that
// only enqueue.
#include <limits>
#include <utility>

#include "attention_checks.h"
#include "backward_support.h"
#include "launch.h"
#include "table_kernels.h"
#include "thdcp/core/error.h"
#include "thdcp/core/overlap.h"
#include "thdcp/core/softmax_scale.h"
#include "thdcp/cuda/attention.h"
#include "thdcp/cuda/check.h"

namespace thdcp::cuda {

namespace {

// Parts of the backward workspace.
struct BackwardWorkspace {
  int* q_start = nullptr;
  int* k_start = nullptr;
  float* delta = nullptr;
  float* dk_accum = nullptr;
  float* dv_accum = nullptr;
  float* dq_accum = nullptr;
  int* dq_order = nullptr;
};

int64_t dq_grid_tiles(const DeviceSegmentTable& table) {
  return detail::ceil_div(table.q_rows, detail::kDqTileRows) + table.capacity;
}

// Room for the fp32 dQ accumulator of a fused pass and the Hopper pass's order counts, in
// every mode and kernel family, so that a workspace sized on one GPU fits every other.
// `carver` without memory sizes the workspace.
BackwardWorkspace carve_backward(WorkspaceCarver& carver, const AttentionShape& shape) {
  const DeviceSegmentTable& table = shape.table;
  BackwardWorkspace w;
  w.q_start = carver.take_array<int>(static_cast<size_t>(table.capacity) + 1);
  w.k_start = carver.take_array<int>(static_cast<size_t>(table.capacity) + 1);
  w.delta = carver.take_array<float>(static_cast<size_t>(shape.q_heads * table.q_rows));
  if (shape.dkv_dtype != DType::kFloat32) {
    w.dk_accum = carver.take_array<float>(static_cast<size_t>(table.k_rows * shape.kv_heads * shape.head_dim));
    w.dv_accum = carver.take_array<float>(static_cast<size_t>(table.k_rows * shape.kv_heads * shape.value_head_dim()));
  }
  // [q_rows, q_heads, D] for the portable fused pass; the Hopper one's tiles of 64 rows for
  // each query tile of the dQ grid and head (as many rows or more), and its order counts.
  const int64_t dq_tiles = dq_grid_tiles(table) * shape.q_heads;
  w.dq_accum = carver.take_array<float>(static_cast<size_t>(dq_tiles * detail::kDqTileRows * shape.head_dim));
  w.dq_order = carver.take_array<int>(static_cast<size_t>(dq_tiles));
  return w;
}

// The narrowest left window the Hopper backward runs in one pass (single-device tables).
// One H200, 2026-11-27 08:50 UTC, backward ms, two passes -> one (bench/RESULTS.md): window
// 1024 6.81 -> 7.45 and long documents' 2048 12.51 -> 14.29 (slower); 4096 13.44 -> 13.34
// and long documents' 8192 26.35 -> 25.27 (faster).
constexpr int64_t kOnePassMinWindowLeft = 4096;

// Key rows per dK/dV block of the pass the plan runs: 128 for the fused passes, else 64.
int dkv_tile_rows(bool sm90, bool fused_dq) {
  if (!fused_dq) return detail::kDkvTileRows;
  return sm90 ? detail::kDkvqTileRows : detail::kDkvFusedTileRows;
}

// Key tiles: each segment's keys lie inside its sequence's valid rows, and at most
// segments_per_key_row segments share a row.
int64_t dkv_grid_tiles(const DeviceSegmentTable& table, int tile_rows) {
  return detail::ceil_div(table.k_rows * segments_per_key_row(table.kind), tile_rows) + table.capacity;
}

void check_backward_tensors(const AttentionShape& shape, const BackwardTensors& t) {
  const DeviceSegmentTable& table = shape.table;
  const ThdShape q = detail::q_shape(shape), kv = detail::kv_shape(shape);
  detail::check_view("q", t.q, q, shape.dtype);
  detail::check_view("k", t.k, kv, shape.dtype);
  const ThdShape q_values = detail::q_value_shape(shape), kv_values = detail::kv_value_shape(shape);
  detail::check_view("v", t.v, kv_values, shape.dtype);
  detail::check_view("out", t.out, q_values, shape.dtype);
  detail::check_view("dout", t.dout, q_values, shape.dtype);
  detail::check_view("dq", t.dq, q, shape.dq_dtype);
  detail::check_view("dk", t.dk, kv, shape.dkv_dtype);
  detail::check_view("dv", t.dv, kv_values, shape.dkv_dtype);
  check_outputs_apart({{"dq", t.dq}, {"dk", t.dk}, {"dv", t.dv}},
                      {{"q", t.q}, {"k", t.k}, {"v", t.v}, {"out", t.out}, {"dout", t.dout}});
  // fp32 dK/dV are the kernels' accumulators themselves (zeroed with one memset, added to
  // by atomics at contiguous offsets); a strided fp32 output would need a workspace copy.
  if (shape.dkv_dtype == DType::kFloat32) {
    for (const ThdTensor* g : {&t.dk, &t.dv}) {
      const char* name = g == &t.dk ? "dk" : "dv";
      THDCP_CHECK(detail::dense(*g), name << " is fp32 and strided (row_stride=" << g->row_stride << ", head_stride="
                                        << g->head_stride
                                        << "): fp32 dk/dv are accumulated in place and must be contiguous; pass "
                                           "contiguous fp32 tensors, or dk/dv in q's dtype");
    }
  }
  detail::check_float_array("lse", t.lse, shape.q_heads * table.q_rows);
  THDCP_CHECK(t.dsinks == nullptr || t.sinks != nullptr,
              "dsinks is set but sinks is null: pass the forward's sinks to get their gradient");
  if (t.sinks) detail::check_float_array("sinks", t.sinks, shape.q_heads);
  if (t.dsinks) detail::check_float_array("dsinks", t.dsinks, shape.q_heads);
}

}  // namespace

size_t BackwardPlan::workspace_size(const AttentionShape& shape, const AttentionOptions& /*options*/) {
  THDCP_CHECK(shape.table.capacity >= 0, "segment table capacity " << shape.table.capacity << " must be >= 0");
  THDCP_CHECK(shape.q_heads >= 0 && shape.kv_heads >= 0 && shape.head_dim >= 0, "heads and head_dim must be >= 0");
  WorkspaceCarver sizing;
  carve_backward(sizing, shape);
  return sizing.bytes();
}

BackwardPlan::BackwardPlan(const AttentionShape& shape, const AttentionOptions& options, void* workspace,
                           size_t workspace_bytes)
    : shape_(shape), options_(options) {
  detail::check_shape(shape_, /*backward=*/true);
  scale_ = resolve_softmax_scale(options_.softmax_scale, shape_.head_dim);
  device_ = detail::current_device();
  const int head_dim = static_cast<int>(shape_.head_dim);
  const int v_head_dim = static_cast<int>(shape_.value_head_dim());
  sm90_ = detail::use_sm90_kernels() && detail::sm90_serves(head_dim, v_head_dim);
  // Hopper at head dim 128 fuses dQ into the dK/dV pass (dkvq_kernel_sm90), in key-tile
  // order in both modes: the ordered pass measured faster than the same pass in any order.
  // It does so without a left window, or on a single-device table with one of at least
  // kOnePassMinWindowLeft keys. On AllGather-CP tables windows keep the two passes: the
  // reduce-scatter of dK/dV runs beside the dQ pass (4 x H200, 2026-11-27 09:06 UTC, window
  // 4096, T = 131072, CP efficiency 0.732 (cp 2) and 0.601 (cp 4) in one pass against 0.804
  // and 0.698 in two). Narrower windows, and head dim 64 (branch wip/dkvq-d64), measured
  // slower in one pass than in the two, which Hopper runs there. The portable kernels fuse
  // dQ only when deterministic = false (with atomics in any order), at the head dims whose
  // fused pass they have (portable_fuses_dq; the other dims run two passes in either mode).
  // AttentionOptions::separate_dq_pass keeps the two passes on Hopper.
  const int64_t window_left = shape_.table.mask.window_left;
  const bool one_pass_window = window_left < 0 || (shape_.table.kind == TableKind::kSingleDevice &&
                                                     window_left >= kOnePassMinWindowLeft);
  fused_dq_ = sm90_ ? head_dim == 128 && v_head_dim == 128 && one_pass_window && !options_.separate_dq_pass
                   : !options_.deterministic && detail::portable_fuses_dq(head_dim, v_head_dim);
  const int64_t grid_q = dq_grid_tiles(shape_.table);
  const int64_t grid_k = dkv_grid_tiles(shape_.table, dkv_tile_rows(sm90_, fused_dq_));
  THDCP_CHECK(grid_q <= std::numeric_limits<int32_t>::max() && grid_k <= std::numeric_limits<int32_t>::max(),
              "too many tiles: " << grid_q << " query, " << grid_k << " key (q_rows=" << shape_.table.q_rows
                                 << ", k_rows=" << shape_.table.k_rows << ", capacity " << shape_.table.capacity
                                 << ")");
  const size_t needed = workspace_size(shape_, options_);
  THDCP_CHECK(workspace_bytes >= needed,
              "workspace has " << workspace_bytes
                               << " bytes; BackwardPlan::workspace_size (backward_workspace_size) gives " << needed
                               << " for dk/dv in " << dtype_name(shape_.dkv_dtype)
                               << " and deterministic=" << options_.deterministic << ": pass a workspace of that size");
  detail::check_device_pointer("workspace", workspace, device_, kWorkspaceAlignment);
  workspace_ = workspace;
  detail::dispatch_instantiation(shape_.dtype, head_dim, v_head_dim, [&](auto storage, auto kDqk, auto kDv) {
    detail::configure_backward<decltype(storage), kDqk, kDv>(sm90_, fused_dq_);
  });
}

void BackwardPlan::check_tensors(const BackwardTensors& t) const {
  check_backward_tensors(shape_, t);
  const std::pair<const char*, const ConstThdTensor> views[] = {
      {"q", t.q}, {"k", t.k}, {"v", t.v}, {"out", t.out}, {"dout", t.dout}, {"dq", t.dq}, {"dk", t.dk}, {"dv", t.dv}};
  for (const auto& [name, view] : views) {
    if (view.numel() > 0) detail::check_device_pointer(name, view.data, device_, 16);
  }
  if (shape_.q_heads * shape_.table.q_rows > 0) detail::check_device_pointer("lse", t.lse, device_, alignof(float));
  if (t.dkv_rows) detail::check_device_pointer("dkv_rows", t.dkv_rows, device_, alignof(int32_t));
  if (t.sinks) detail::check_device_pointer("sinks", t.sinks, device_, alignof(float));
  if (t.dsinks) detail::check_device_pointer("dsinks", t.dsinks, device_, alignof(float));
}

void BackwardPlan::run(const DeviceSegmentTable& table, const BackwardTensors& t, cudaStream_t stream) const {
  enqueue(table, t, stream, Passes::kBoth);
}

void BackwardPlan::run_keys(const DeviceSegmentTable& table, const BackwardTensors& t, cudaStream_t stream) const {
  enqueue(table, t, stream, Passes::kKeys);
}

void BackwardPlan::run_queries(const DeviceSegmentTable& table, const BackwardTensors& t, cudaStream_t stream) const {
  enqueue(table, t, stream, Passes::kQueries);
}

void BackwardPlan::enqueue(const DeviceSegmentTable& table, const BackwardTensors& t, cudaStream_t stream,
                           Passes passes) const {
  detail::check_table_matches(shape_, table);
  check_backward_tensors(shape_, t);
  const bool keys = passes != Passes::kQueries;
  const bool queries = passes != Passes::kKeys;

  WorkspaceCarver carver(workspace_);
  const BackwardWorkspace parts = carve_backward(carver, shape_);
  const bool fp32_dkv = shape_.dkv_dtype == DType::kFloat32;
  detail::BackwardParams params{};
  detail::set_call_fields(params, t, table, shape_.q_heads, shape_.kv_heads, scale_);
  params.dout = t.dout.data;
  params.delta = parts.delta;
  params.dq = t.dq.data;
  params.dq_fp32 = shape_.dq_dtype == DType::kFloat32;
  params.dq_accum = fused_dq_ ? parts.dq_accum : nullptr;
  params.dq_order = fused_dq_ && sm90_ ? parts.dq_order : nullptr;
  params.dk_accum = fp32_dkv ? static_cast<float*>(t.dk.data) : parts.dk_accum;
  params.dv_accum = fp32_dkv ? static_cast<float*>(t.dv.data) : parts.dv_accum;
  params.dkv_rows = t.dkv_rows;
  // The Hopper kernels store dK/dV rows directly where one segment reaches each key row (a
  // single-device table) and dk/dv are contiguous in q's dtype: no fp32 accumulators, no casts.
  const bool direct_dkv = keys && sm90_ && !fp32_dkv && segments_per_key_row(table.kind) == 1 &&
                          t.dkv_rows == nullptr && detail::dense(t.dk) && detail::dense(t.dv);
  params.dk_out = direct_dkv ? t.dk.data : nullptr;
  params.dv_out = direct_dkv ? t.dv.data : nullptr;
  params.q_tile_start = parts.q_start;
  params.k_tile_start = parts.k_start;
  params.k_rows = table.k_rows;
  const detail::BackwardStrides strides{detail::strides_of(t.q),    detail::strides_of(t.k),
                                        detail::strides_of(t.v),    detail::strides_of(t.out),
                                        detail::strides_of(t.dout), detail::strides_of(t.dq)};

  // dK/dV start at exactly 0: rows no query reaches stay 0. Every table kind this backend
  // builds reaches a key row from at most two segments (segments_per_key_row), which keeps
  // the fp32 dK/dV accumulation order-independent.
  const int head_dim = static_cast<int>(shape_.head_dim);
  const int v_head_dim = static_cast<int>(shape_.value_head_dim());
  if (keys) {
    // (Rows of the direct stores that no block writes stay 0 the same way.)
    const size_t element = direct_dkv ? dtype_size(t.dk.dtype) : sizeof(float);
    const size_t dk_bytes = element * static_cast<size_t>(t.dk.numel());
    const size_t dv_bytes = element * static_cast<size_t>(t.dv.numel());
    if (dk_bytes > 0) THDCP_CHECK_CUDA(cudaMemsetAsync(direct_dkv ? t.dk.data : params.dk_accum, 0, dk_bytes, stream));
    if (dv_bytes > 0) THDCP_CHECK_CUDA(cudaMemsetAsync(direct_dkv ? t.dv.data : params.dv_accum, 0, dv_bytes, stream));
    const size_t dq_bytes = sizeof(float) * static_cast<size_t>(t.dq.numel());
    // (The Hopper pass writes each accumulator tile before it adds to it.)
    if (fused_dq_ && !sm90_ && dq_bytes > 0) THDCP_CHECK_CUDA(cudaMemsetAsync(params.dq_accum, 0, dq_bytes, stream));
    if (params.dq_order) {
      const size_t order_bytes = sizeof(int) * static_cast<size_t>(dq_grid_tiles(table) * params.q_heads);
      THDCP_CHECK_CUDA(cudaMemsetAsync(params.dq_order, 0, order_bytes, stream));
    }
    if (table.capacity > 0) {
      detail::launch_schedule(table.segments, table.capacity, detail::kDqTileRows,
                              parts.q_start, dkv_tile_rows(sm90_, fused_dq_),
                              parts.k_start, nullptr, params.q_heads, nullptr, stream);
      detail::launch_delta(t.out.data, strides.out.row, strides.out.head, t.dout.data, strides.dout.row,
                           strides.dout.head, shape_.dtype, table.q_rows, params.q_heads, v_head_dim, params.delta,
                           stream);
      if (t.dsinks) {
        detail::launch_sink_gradient(t.sinks, t.lse, params.delta, table.q_rows, params.q_heads, t.dsinks, stream);
      }
    } else if (t.dsinks && params.q_heads > 0) {  // no rows: no gradient
      THDCP_CHECK_CUDA(cudaMemsetAsync(t.dsinks, 0, sizeof(float) * static_cast<size_t>(params.q_heads), stream));
    }
  }
  // The schedule and delta of the key half stay in the workspace for the query half.
  if (table.capacity > 0) {
    const int gq = queries ? static_cast<int>(dq_grid_tiles(table)) : 0;
    const int gk = keys ? static_cast<int>(dkv_grid_tiles(table, dkv_tile_rows(sm90_, fused_dq_))) : 0;
    detail::dispatch_instantiation(shape_.dtype, head_dim, v_head_dim, [&](auto storage, auto kDqk, auto kDv) {
      detail::launch_backward<decltype(storage), kDqk, kDv>(params, strides, sm90_, gq, gk, stream);
    });
  }
  if (keys && !fp32_dkv && !direct_dkv) {
    const detail::Strides dk = detail::strides_of(t.dk), dv = detail::strides_of(t.dv);
    detail::launch_cast_strided(params.dk_accum, t.dk.data, t.dk.dtype, table.k_rows, params.kv_heads, head_dim,
                                dk.row, dk.head, 1.0f, stream);
    detail::launch_cast_strided(params.dv_accum, t.dv.data, t.dv.dtype, table.k_rows, params.kv_heads, v_head_dim,
                                dv.row, dv.head, 1.0f, stream);
  }
  // The portable fused pass accumulates dS K in the key half; the softmax scale is applied
  // once here. (The Hopper one's dq_store_kernel is launch_backward's query half.)
  if (queries && fused_dq_ && !sm90_) {
    detail::launch_cast_strided(params.dq_accum, t.dq.data, t.dq.dtype, table.q_rows, params.q_heads, head_dim,
                                strides.dq.row, strides.dq.head, scale_, stream);
  }
}

}  // namespace thdcp::cuda
