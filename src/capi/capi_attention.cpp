// Single-device attention plans of the C ABI: arguments translated to the library's types
// and checked as the C ABI names them, then one call. The CPU backend runs thdcp::cpu over a
// host segment table built per call; the CUDA backend holds one cuda::Attention over the
// caller's workspace.
#include <cstdint>
#include <limits>
#include <memory>
#include <tuple>
#include <utility>

#include "capi_convert.h"
#include "capi_handles.h"
#include "capi_status.h"
#include "thdcp/cpu/attention.h"
#include "thdcp/plan/segment_table.h"

#if defined(THDCP_HAVE_CUDA)
#include "thdcp/cuda/attention.h"
#include "thdcp/core/cuda_check.h"
#endif

namespace thdcp::capi {

// The checked contents of a thdcp_attention_params: the backend, the problem (what the CUDA
// backend's cuda::Attention takes; the CPU backend reads the same fields) and the options.
struct AttentionConfig {
  thdcp_backend_t backend = THDCP_BACKEND_CPU;
  AttentionProblem problem;
  AttentionOptions options;
};

namespace {

const thdcp_attention_params kDefaults = THDCP_ATTENTION_PARAMS_INIT;

AttentionConfig config_of(const thdcp_attention_params* given) {
  const thdcp_attention_params p =
      read_params(given, THDCP_ATTENTION_PARAMS_MIN_SIZE, kDefaults, "params", "thdcp_attention_params",
                  "THDCP_ATTENTION_PARAMS_INIT or thdcp_attention_params_init()");
  const thdcp_backend_t backend = backend_of(raw_enum(p.backend), "params->backend");
  if (backend == THDCP_BACKEND_CUDA) require_cuda_build("params->backend=THDCP_BACKEND_CUDA");
  const bool cuda = backend == THDCP_BACKEND_CUDA;
  AttentionConfig c;
  c.backend = backend;
  auto& problem = c.problem;
  problem.dtype = storage_dtype(raw_enum(p.dtype), "params->dtype");
  THDCP_CAPI_REQUIRE(!cuda || problem.dtype != DType::kFloat32,
                     "params->dtype=THDCP_DTYPE_FP32 is not supported by the CUDA backend: use THDCP_DTYPE_BF16 or "
                     "THDCP_DTYPE_FP16 (or THDCP_BACKEND_CPU for fp32)");
  THDCP_CAPI_REQUIRE(p.max_tokens >= 0 && p.max_tokens <= std::numeric_limits<int32_t>::max(),
                     "params->max_tokens=" << p.max_tokens << " must be in [0, 2^31): the rows of the tensors");
  THDCP_CAPI_REQUIRE(p.max_seqs >= 1, "params->max_seqs=" << p.max_seqs
                                                          << " must be >= 1: the most sequences a layout may have");
  check_heads(p.q_heads, p.kv_heads, p.head_dim, cuda, p.v_head_dim);
  check_plan_elements(p.max_tokens, p.q_heads, p.head_dim, "params");
  check_plan_elements(p.max_tokens, p.q_heads, p.v_head_dim, "params", "v_head_dim");
  problem.capacity = Capacity{p.max_seqs, p.max_tokens};
  problem.q_heads = p.q_heads;
  problem.kv_heads = p.kv_heads;
  problem.head_dim = p.head_dim;
  problem.v_head_dim = p.v_head_dim;
  problem.mask = mask_of(p.window_left, p.window_right, "params");
  problem.dq_dtype = gradient_dtype(raw_enum(p.dq_dtype), problem.dtype, "params->dq_dtype");
  problem.dkv_dtype = gradient_dtype(raw_enum(p.dkv_dtype), problem.dtype, "params->dkv_dtype");
  check_softmax_scale(p.softmax_scale, "params");
  check_num_threads(p.num_threads, "params");
  c.options.softmax_scale = p.softmax_scale;
  c.options.deterministic = p.deterministic != 0;
  c.options.num_threads = p.num_threads;
  return c;
}

}  // namespace

// What a thdcp_attention_plan_t stands for.
struct AttentionPlan {
  AttentionConfig config;
#if defined(THDCP_HAVE_CUDA)
  std::unique_ptr<cuda::Attention> cuda;
#endif
};

namespace {

// The tensors of a call, named as the C ABI names them: [max_tokens, heads, head_dim] each
// (v_head_dim for v, out, dout, dv), in the plan's dtypes (the CUDA backend checks the rest:
// strides, alignment, devices).
ThdShape q_side(const AttentionConfig& c, bool values = false) {
  const auto& p = c.problem;
  return values ? ThdShape{p.capacity.max_tokens, "max_tokens", p.q_heads, "q_heads", p.value_head_dim(), "v_head_dim"}
                : ThdShape{p.capacity.max_tokens, "max_tokens", p.q_heads, "q_heads", p.head_dim};
}
ThdShape kv_side(const AttentionConfig& c, bool values = false) {
  const auto& p = c.problem;
  return values ? ThdShape{p.capacity.max_tokens, "max_tokens", p.kv_heads, "kv_heads", p.value_head_dim(), "v_head_dim"}
                : ThdShape{p.capacity.max_tokens, "max_tokens", p.kv_heads, "kv_heads", p.head_dim};
}

// The shape and dtype of each tensor, named as the C ABI names them.
void check_forward(const AttentionConfig& c, const ForwardTensors& t) {
  const DType dtype = c.problem.dtype;
  for (const auto& [name, tensor, shape] :
       {std::make_tuple("q", t.q, q_side(c)), std::make_tuple("k", t.k, kv_side(c)),
        std::make_tuple("v", t.v, kv_side(c, true)), std::make_tuple("out", ConstThdTensor(t.out), q_side(c, true))}) {
    check_thd_shape(name, tensor, shape);
    check_thd_dtype(name, tensor.dtype, dtype);
  }
}

void check_backward(const AttentionConfig& c, const BackwardTensors& t) {
  const auto& p = c.problem;
  for (const auto& [name, tensor, shape, dtype] :
       {std::make_tuple("q", t.q, q_side(c), p.dtype), std::make_tuple("k", t.k, kv_side(c), p.dtype),
        std::make_tuple("v", t.v, kv_side(c, true), p.dtype), std::make_tuple("out", t.out, q_side(c, true), p.dtype),
        std::make_tuple("dout", t.dout, q_side(c, true), p.dtype),
        std::make_tuple("dq", ConstThdTensor(t.dq), q_side(c), p.dq_dtype),
        std::make_tuple("dk", ConstThdTensor(t.dk), kv_side(c), p.dkv_dtype),
        std::make_tuple("dv", ConstThdTensor(t.dv), kv_side(c, true), p.dkv_dtype)}) {
    check_thd_shape(name, tensor, shape);
    check_thd_dtype(name, tensor.dtype, dtype);
  }
}

// The layout of a run: CPU on the host, checked in full; CUDA on the device, in capacity form.
LayoutView run_layout(const AttentionConfig& c, const thdcp_layout_t* layout) {
  const LayoutView batch = layout_view(layout, "layout");
  const Capacity& capacity = c.problem.capacity;
  if (c.backend == THDCP_BACKEND_CUDA) {
    THDCP_CAPI_REQUIRE(batch.num_seqs == capacity.max_seqs,
                       "layout->num_seqs=" << batch.num_seqs << " but the CUDA backend reads layouts in capacity "
                                           << "form: num_seqs must be the plan's max_seqs=" << capacity.max_seqs
                                           << ", unused trailing entries repeating the last offset "
                                              "(thdcp_capacity_layout makes it)");
    return batch;
  }
  THDCP_CAPI_REQUIRE(batch.num_seqs <= capacity.max_seqs, "layout->num_seqs=" << batch.num_seqs
                                                                             << " is more than the plan's max_seqs="
                                                                             << capacity.max_seqs);
  validate_layout(batch, capacity.max_tokens, 0);
  return batch;
}

#if defined(THDCP_HAVE_CUDA)
DeviceLayout device_layout(const AttentionConfig& c, const LayoutView& batch) {
  return DeviceLayout{batch.cu_seqlens, batch.cu_seqlens_padded, c.problem.capacity};
}

// Eager runs also check that every pointer is device memory of the plan's device (pointer
// queries), so a host pointer is refused before anything is enqueued; runs being captured
// into a graph skip those queries (the graph's buffers are checked by its eager warm-up).
bool capturing(thdcp_stream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  THDCP_CHECK_CUDA(cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &status));
  return status != cudaStreamCaptureStatusNone;
}
#endif

void forward(thdcp_attention_plan_t handle, const thdcp_layout_t* layout, const thdcp_tensor_t* q,
             const thdcp_tensor_t* k, const thdcp_tensor_t* v, const thdcp_tensor_t* out, float* lse,
             float* max_logit, const thdcp_attention_extras* extras, thdcp_stream_t stream) {
  const std::shared_ptr<AttentionPlan> plan = lookup<AttentionPlan>(handle, "plan");
  const AttentionConfig& c = plan->config;
  const LayoutView batch = run_layout(c, layout);
  ForwardTensors t = forward_tensors(q, k, v, out, lse, max_logit);
  t.sinks = extras_of(extras, c.problem.q_heads, /*backward=*/false).sinks;
  check_forward(c, t);
  THDCP_CAPI_REQUIRE(lse != nullptr || c.problem.q_heads * c.problem.capacity.max_tokens == 0,
                     "lse is NULL: pass q_heads * max_tokens = " << c.problem.q_heads * c.problem.capacity.max_tokens
                                                                 << " floats");
  if (c.backend == THDCP_BACKEND_CPU) {
    cpu::attention_forward(build_segment_table(batch, c.problem.mask), t, c.options);
    return;
  }
#if defined(THDCP_HAVE_CUDA)
  const DeviceLayout device = device_layout(c, batch);
  if (!capturing(stream)) plan->cuda->check(device, &t, nullptr);
  plan->cuda->forward(device, t, stream);
#else
  (void)stream;
#endif
}

void backward(thdcp_attention_plan_t handle, const thdcp_layout_t* layout, const thdcp_tensor_t* q,
              const thdcp_tensor_t* k, const thdcp_tensor_t* v, const thdcp_tensor_t* out, const thdcp_tensor_t* dout,
              const float* lse, const thdcp_tensor_t* dq, const thdcp_tensor_t* dk, const thdcp_tensor_t* dv,
              const thdcp_attention_extras* extras, thdcp_stream_t stream) {
  const std::shared_ptr<AttentionPlan> plan = lookup<AttentionPlan>(handle, "plan");
  const AttentionConfig& c = plan->config;
  const LayoutView batch = run_layout(c, layout);
  const auto& p = c.problem;
  BackwardTensors t = backward_tensors(q, k, v, out, dout, lse, dq, dk, dv);
  const thdcp_attention_extras e = extras_of(extras, c.problem.q_heads, /*backward=*/true);
  t.sinks = e.sinks;
  t.dsinks = e.dsinks;
  check_backward(c, t);
  THDCP_CAPI_REQUIRE(lse != nullptr || p.q_heads * p.capacity.max_tokens == 0,
                     "lse is NULL: pass the forward's q_heads * max_tokens = " << p.q_heads * p.capacity.max_tokens
                                                                               << " floats");
  if (c.backend == THDCP_BACKEND_CPU) {
    cpu::attention_backward(build_segment_table(batch, p.mask), t, c.options);
    return;
  }
#if defined(THDCP_HAVE_CUDA)
  const DeviceLayout device = device_layout(c, batch);
  if (!capturing(stream)) plan->cuda->check(device, nullptr, &t);
  plan->cuda->backward(device, t, stream);
#else
  (void)stream;
#endif
}

}  // namespace

}  // namespace thdcp::capi

extern "C" {

thdcp_status_t thdcp_attention_plan_workspace_size(const thdcp_attention_params* params, size_t* workspace_bytes) {
  return thdcp::capi::guarded(__func__, [&] {
    [[maybe_unused]] const thdcp::capi::AttentionConfig c = thdcp::capi::config_of(params);
    THDCP_CAPI_NOT_NULL(workspace_bytes, "a size_t to receive the bytes");
    size_t bytes = 0;
#if defined(THDCP_HAVE_CUDA)
    if (c.backend == THDCP_BACKEND_CUDA) bytes = thdcp::cuda::Attention::workspace_size(c.problem, c.options);
#endif
    *workspace_bytes = bytes;
  });
}

thdcp_status_t thdcp_attention_plan_create(const thdcp_attention_params* params, void* workspace,
                                           size_t workspace_bytes, thdcp_attention_plan_t* plan) {
  return thdcp::capi::guarded(__func__, [&] {
    auto made = std::make_shared<thdcp::capi::AttentionPlan>();
    made->config = thdcp::capi::config_of(params);
    THDCP_CAPI_NOT_NULL(plan, "a thdcp_attention_plan_t to receive the plan");
    if (made->config.backend == THDCP_BACKEND_CUDA) {
      thdcp::capi::require_cuda_device("params->backend=THDCP_BACKEND_CUDA");
#if defined(THDCP_HAVE_CUDA)
      const thdcp::capi::AttentionConfig& c = made->config;
      const size_t needed = thdcp::cuda::Attention::workspace_size(c.problem, c.options);
      THDCP_CAPI_REQUIRE(workspace != nullptr && workspace_bytes >= needed,
                         "workspace=" << workspace << " of workspace_bytes=" << workspace_bytes << ": the plan needs "
                                      << needed << " bytes of device memory (thdcp_attention_plan_workspace_size)");
      THDCP_CAPI_REQUIRE(reinterpret_cast<uintptr_t>(workspace) % thdcp::kWorkspaceAlignment == 0,
                         "workspace=" << workspace << " is not " << thdcp::kWorkspaceAlignment
                                      << "-byte aligned: pass memory from cudaMalloc");
      made->cuda = std::make_unique<thdcp::cuda::Attention>(c.problem, c.options, workspace, workspace_bytes);
#endif
    } else {
      (void)workspace;
      (void)workspace_bytes;
    }
    *plan = thdcp::capi::publish(std::move(made));
  });
}

thdcp_status_t thdcp_attention_plan_destroy(thdcp_attention_plan_t plan) {
  return thdcp::capi::guarded(__func__, [&] { thdcp::capi::retire<thdcp::capi::AttentionPlan>(plan, "plan"); });
}

thdcp_status_t thdcp_attention_forward(thdcp_attention_plan_t plan, const thdcp_layout_t* layout,
                                       const thdcp_tensor_t* q, const thdcp_tensor_t* k, const thdcp_tensor_t* v,
                                       const thdcp_tensor_t* out, float* lse, float* max_logit,
                                       thdcp_stream_t stream) {
  return thdcp::capi::guarded(
      __func__, [&] { thdcp::capi::forward(plan, layout, q, k, v, out, lse, max_logit, nullptr, stream); });
}

thdcp_status_t thdcp_attention_forward_ex(thdcp_attention_plan_t plan, const thdcp_layout_t* layout,
                                          const thdcp_tensor_t* q, const thdcp_tensor_t* k, const thdcp_tensor_t* v,
                                          const thdcp_tensor_t* out, float* lse, float* max_logit,
                                          const thdcp_attention_extras* extras, thdcp_stream_t stream) {
  return thdcp::capi::guarded(
      __func__, [&] { thdcp::capi::forward(plan, layout, q, k, v, out, lse, max_logit, extras, stream); });
}

thdcp_status_t thdcp_attention_backward(thdcp_attention_plan_t plan, const thdcp_layout_t* layout,
                                        const thdcp_tensor_t* q, const thdcp_tensor_t* k, const thdcp_tensor_t* v,
                                        const thdcp_tensor_t* out, const thdcp_tensor_t* dout, const float* lse,
                                        const thdcp_tensor_t* dq, const thdcp_tensor_t* dk, const thdcp_tensor_t* dv,
                                        thdcp_stream_t stream) {
  return thdcp::capi::guarded(__func__, [&] {
    thdcp::capi::backward(plan, layout, q, k, v, out, dout, lse, dq, dk, dv, nullptr, stream);
  });
}

thdcp_status_t thdcp_attention_backward_ex(thdcp_attention_plan_t plan, const thdcp_layout_t* layout,
                                           const thdcp_tensor_t* q, const thdcp_tensor_t* k, const thdcp_tensor_t* v,
                                           const thdcp_tensor_t* out, const thdcp_tensor_t* dout, const float* lse,
                                           const thdcp_tensor_t* dq, const thdcp_tensor_t* dk,
                                           const thdcp_tensor_t* dv, const thdcp_attention_extras* extras,
                                           thdcp_stream_t stream) {
  return thdcp::capi::guarded(__func__, [&] {
    thdcp::capi::backward(plan, layout, q, k, v, out, dout, lse, dq, dk, dv, extras, stream);
  });
}

}  // extern "C"
