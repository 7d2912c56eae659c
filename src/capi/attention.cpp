// Single-device attention plans of the C ABI: the CPU backend runs thdcp::cpu over a host
// segment table built per call; the CUDA backend holds a ForwardPlan and a BackwardPlan
// over one caller workspace and builds the device table on the stream.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>

#include "convert.h"
#include "handles.h"
#include "status.h"
#include "thdcp/cpu/attention.h"
#include "thdcp/plan/segment_table.h"

#if defined(THDCP_HAVE_CUDA)
#include "thdcp/cuda/attention.h"
#include "thdcp/core/cuda_check.h"
#endif

namespace thdcp::capi {

// The checked contents of a thdcp_attention_params.
struct AttentionConfig {
  thdcp_backend_t backend = THDCP_BACKEND_CPU;
  DType dtype = DType::kBFloat16;
  DType dq_dtype = DType::kBFloat16;
  DType dkv_dtype = DType::kBFloat16;
  int64_t max_tokens = 0;
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int max_seqs = 0;
  Mask mask;
  float softmax_scale = 0.0f;
  bool deterministic = true;
  int num_threads = 0;
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
  c.dtype = storage_dtype(raw_enum(p.dtype), "params->dtype");
  THDCP_CAPI_REQUIRE(!cuda || c.dtype != DType::kFloat32,
                     "params->dtype=THDCP_DTYPE_FP32 is not supported by the CUDA backend: use THDCP_DTYPE_BF16 or "
                     "THDCP_DTYPE_FP16 (or THDCP_BACKEND_CPU for fp32)");
  THDCP_CAPI_REQUIRE(p.max_tokens >= 0 && p.max_tokens <= std::numeric_limits<int32_t>::max(),
                     "params->max_tokens=" << p.max_tokens << " must be in [0, 2^31): the rows of the tensors");
  THDCP_CAPI_REQUIRE(p.max_seqs >= 1, "params->max_seqs=" << p.max_seqs
                                                          << " must be >= 1: the most sequences a layout may have");
  check_heads(p.q_heads, p.kv_heads, p.head_dim, cuda);
  c.max_tokens = p.max_tokens;
  c.max_seqs = p.max_seqs;
  c.q_heads = p.q_heads;
  c.kv_heads = p.kv_heads;
  c.head_dim = p.head_dim;
  c.mask = mask_of(p.window_left, p.window_right, "params");
  THDCP_CAPI_REQUIRE(std::isfinite(p.softmax_scale),
                     "params->softmax_scale=" << p.softmax_scale << " must be finite (0: 1/sqrt(head_dim))");
  c.softmax_scale = p.softmax_scale;
  c.deterministic = p.deterministic != 0;
  c.dq_dtype = gradient_dtype(raw_enum(p.dq_dtype), c.dtype, "params->dq_dtype");
  c.dkv_dtype = gradient_dtype(raw_enum(p.dkv_dtype), c.dtype, "params->dkv_dtype");
  THDCP_CAPI_REQUIRE(p.num_threads >= 0,
                     "params->num_threads=" << p.num_threads << " must be >= 0 (0: every hardware thread)");
  c.num_threads = p.num_threads;
  return c;
}

AttentionOptions cpu_options(const AttentionConfig& c) {
  AttentionOptions o;
  o.softmax_scale = c.softmax_scale;
  o.accumulate = Accumulate::kFloat32;
  o.num_threads = c.num_threads;
  return o;
}

#if defined(THDCP_HAVE_CUDA)


cuda::AttentionShape shape_of(const AttentionConfig& c) {
  cuda::AttentionShape s;
  s.table = cuda::single_device_table(c.max_seqs, c.max_tokens, c.mask);
  s.q_heads = c.q_heads;
  s.kv_heads = c.kv_heads;
  s.head_dim = c.head_dim;
  s.dtype = c.dtype;
  s.dq_dtype = c.dq_dtype;
  s.dkv_dtype = c.dkv_dtype;
  return s;
}

AttentionOptions cuda_options(const AttentionConfig& c) {
  AttentionOptions o;
  o.softmax_scale = c.softmax_scale;
  o.deterministic = c.deterministic;
  return o;
}

// The workspace: the device segment table, then the forward's, then the backward's.
struct CudaWorkspace {
  size_t forward_offset = 0, forward_bytes = 0;
  size_t backward_offset = 0, backward_bytes = 0;
  size_t total = 0;
};

CudaWorkspace cuda_workspace(const AttentionConfig& c) {
  const cuda::AttentionShape shape = shape_of(c);
  CudaWorkspace w;
  w.forward_offset = align_workspace(static_cast<size_t>(shape.table.capacity) * sizeof(Segment));
  w.forward_bytes = align_workspace(cuda::ForwardPlan::workspace_size(shape));
  w.backward_offset = w.forward_offset + w.forward_bytes;
  w.backward_bytes = align_workspace(cuda::BackwardPlan::workspace_size(shape, cuda_options(c)));
  w.total = w.backward_offset + w.backward_bytes;
  return w;
}
#endif

}  // namespace

}  // namespace thdcp::capi

struct thdcp_attention_plan_st {
  thdcp::capi::AttentionConfig config;
#if defined(THDCP_HAVE_CUDA)
  thdcp::Segment* segments = nullptr;  // in the caller's workspace
  std::unique_ptr<thdcp::cuda::ForwardPlan> forward;
  std::unique_ptr<thdcp::cuda::BackwardPlan> backward;
#endif
};

namespace thdcp::capi {

namespace {

const char* kPlanHint = "a plan made by thdcp_attention_plan_create";

// The layout of a run: CPU on the host, checked in full; CUDA on the device, in capacity form.
LayoutView run_layout(const AttentionConfig& c, const thdcp_layout_t* layout) {
  const LayoutView batch = layout_view(layout, "layout");
  if (c.backend == THDCP_BACKEND_CUDA) {
    THDCP_CAPI_REQUIRE(batch.num_seqs == c.max_seqs,
                       "layout->num_seqs=" << batch.num_seqs << " but the CUDA backend reads layouts in capacity "
                                           << "form: num_seqs must be the plan's max_seqs=" << c.max_seqs
                                           << ", unused trailing entries repeating the last offset "
                                              "(thdcp_capacity_layout makes it)");
    return batch;
  }
  THDCP_CAPI_REQUIRE(batch.num_seqs <= c.max_seqs, "layout->num_seqs=" << batch.num_seqs
                                                                      << " is more than the plan's max_seqs="
                                                                      << c.max_seqs);
  validate_layout(batch, c.max_tokens, 0);
  return batch;
}

struct Inputs {
  ConstThdTensor q, k, v;
};

Inputs inputs_of(const AttentionConfig& c, const thdcp_tensor_t* q, const thdcp_tensor_t* k,
                 const thdcp_tensor_t* v) {
  Inputs in{const_view(q, "q"), const_view(k, "k"), const_view(v, "v")};
  expect_shape(in.q, "q", c.max_tokens, "max_tokens", c.q_heads, "q_heads", c.head_dim, c.dtype);
  expect_shape(in.k, "k", c.max_tokens, "max_tokens", c.kv_heads, "kv_heads", c.head_dim, c.dtype);
  expect_shape(in.v, "v", c.max_tokens, "max_tokens", c.kv_heads, "kv_heads", c.head_dim, c.dtype);
  return in;
}

#if defined(THDCP_HAVE_CUDA)
// Eager runs also check that every pointer is device memory of the plan's device (pointer
// queries), so a host pointer is refused before anything is enqueued; runs being captured
// into a graph skip those queries (the graph's buffers are checked by its eager warm-up).
bool capturing(thdcp_stream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  THDCP_CHECK_CUDA(cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &status));
  return status != cudaStreamCaptureStatusNone;
}
#endif

void forward(thdcp_attention_plan_st* plan, const thdcp_layout_t* layout, const thdcp_tensor_t* q,
             const thdcp_tensor_t* k, const thdcp_tensor_t* v, const thdcp_tensor_t* out, float* lse,
             float* max_logit, thdcp_stream_t stream) {
  THDCP_CAPI_NOT_NULL(plan, kPlanHint);
  const AttentionConfig& c = plan->config;
  const LayoutView batch = run_layout(c, layout);
  const Inputs in = inputs_of(c, q, k, v);
  const ThdTensor o = view(out, "out");
  expect_shape(o, "out", c.max_tokens, "max_tokens", c.q_heads, "q_heads", c.head_dim, c.dtype);
  THDCP_CAPI_REQUIRE(lse != nullptr || c.q_heads * c.max_tokens == 0,
                     "lse is NULL: pass q_heads * max_tokens = " << c.q_heads * c.max_tokens << " floats");
  if (c.backend == THDCP_BACKEND_CPU) {
    const SegmentTable table = build_segment_table(batch, c.mask);
    cpu::attention_forward(table, in.q, in.k, in.v, o, lse, max_logit, cpu_options(c));
    return;
  }
#if defined(THDCP_HAVE_CUDA)
  const cuda::DeviceSegmentTable table =
      cuda::enqueue_segment_table(batch.cu_seqlens, batch.cu_seqlens_padded, c.max_seqs, c.max_tokens, c.mask,
                                  plan->segments, stream);
  cuda::ForwardTensors t;
  t.q = in.q;
  t.k = in.k;
  t.v = in.v;
  t.out = o;
  t.lse = lse;
  t.max_logit = max_logit;
  if (!capturing(stream)) plan->forward->check_tensors(t);
  plan->forward->run(table, t, stream);
#else
  (void)stream;
#endif
}

void backward(thdcp_attention_plan_st* plan, const thdcp_layout_t* layout, const thdcp_tensor_t* q,
              const thdcp_tensor_t* k, const thdcp_tensor_t* v, const thdcp_tensor_t* out, const thdcp_tensor_t* dout,
              const float* lse, const thdcp_tensor_t* dq, const thdcp_tensor_t* dk, const thdcp_tensor_t* dv,
              thdcp_stream_t stream) {
  THDCP_CAPI_NOT_NULL(plan, kPlanHint);
  const AttentionConfig& c = plan->config;
  const LayoutView batch = run_layout(c, layout);
  const Inputs in = inputs_of(c, q, k, v);
  const ConstThdTensor o = const_view(out, "out"), d_o = const_view(dout, "dout");
  expect_shape(o, "out", c.max_tokens, "max_tokens", c.q_heads, "q_heads", c.head_dim, c.dtype);
  expect_shape(d_o, "dout", c.max_tokens, "max_tokens", c.q_heads, "q_heads", c.head_dim, c.dtype);
  THDCP_CAPI_REQUIRE(lse != nullptr || c.q_heads * c.max_tokens == 0,
                     "lse is NULL: pass the forward's q_heads * max_tokens = " << c.q_heads * c.max_tokens
                                                                               << " floats");
  const ThdTensor g_q = view(dq, "dq"), g_k = view(dk, "dk"), g_v = view(dv, "dv");
  expect_shape(g_q, "dq", c.max_tokens, "max_tokens", c.q_heads, "q_heads", c.head_dim, c.dq_dtype);
  expect_shape(g_k, "dk", c.max_tokens, "max_tokens", c.kv_heads, "kv_heads", c.head_dim, c.dkv_dtype);
  expect_shape(g_v, "dv", c.max_tokens, "max_tokens", c.kv_heads, "kv_heads", c.head_dim, c.dkv_dtype);
  if (c.backend == THDCP_BACKEND_CPU) {
    const SegmentTable table = build_segment_table(batch, c.mask);
    cpu::attention_backward(table, in.q, in.k, in.v, o, d_o, lse, g_q, g_k, g_v, cpu_options(c));
    return;
  }
#if defined(THDCP_HAVE_CUDA)
  const cuda::DeviceSegmentTable table =
      cuda::enqueue_segment_table(batch.cu_seqlens, batch.cu_seqlens_padded, c.max_seqs, c.max_tokens, c.mask,
                                  plan->segments, stream);
  cuda::BackwardTensors t;
  t.q = in.q;
  t.k = in.k;
  t.v = in.v;
  t.out = o;
  t.dout = d_o;
  t.lse = lse;
  t.dq = g_q;
  t.dk = g_k;
  t.dv = g_v;
  if (!capturing(stream)) plan->backward->check_tensors(t);
  plan->backward->run(table, t, stream);
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
    if (c.backend == THDCP_BACKEND_CUDA) bytes = thdcp::capi::cuda_workspace(c).total;
#endif
    *workspace_bytes = bytes;
  });
}

thdcp_status_t thdcp_attention_plan_create(const thdcp_attention_params* params, void* workspace,
                                           size_t workspace_bytes, thdcp_attention_plan_t* plan) {
  return thdcp::capi::guarded(__func__, [&] {
    auto made = std::make_unique<thdcp_attention_plan_st>();
    made->config = thdcp::capi::config_of(params);
    THDCP_CAPI_NOT_NULL(plan, "a thdcp_attention_plan_t to receive the plan");
    if (made->config.backend == THDCP_BACKEND_CUDA) {
      thdcp::capi::require_cuda_device("params->backend=THDCP_BACKEND_CUDA");
#if defined(THDCP_HAVE_CUDA)
      const thdcp::capi::CudaWorkspace w = thdcp::capi::cuda_workspace(made->config);
      THDCP_CAPI_REQUIRE(workspace != nullptr && workspace_bytes >= w.total,
                         "workspace=" << workspace << " of workspace_bytes=" << workspace_bytes << ": the plan needs "
                                      << w.total << " bytes of device memory (thdcp_attention_plan_workspace_size)");
      THDCP_CAPI_REQUIRE(reinterpret_cast<uintptr_t>(workspace) % thdcp::kWorkspaceAlignment == 0,
                         "workspace=" << workspace << " is not " << thdcp::kWorkspaceAlignment
                                      << "-byte aligned: pass memory from cudaMalloc");
      auto* base = static_cast<unsigned char*>(workspace);
      const thdcp::cuda::AttentionShape shape = thdcp::capi::shape_of(made->config);
      const thdcp::AttentionOptions options = thdcp::capi::cuda_options(made->config);
      made->segments = reinterpret_cast<thdcp::Segment*>(base);
      made->forward = std::make_unique<thdcp::cuda::ForwardPlan>(shape, options, base + w.forward_offset,
                                                                 w.forward_bytes);
      made->backward = std::make_unique<thdcp::cuda::BackwardPlan>(shape, options, base + w.backward_offset,
                                                                   w.backward_bytes);
#endif
    } else {
      (void)workspace;
      (void)workspace_bytes;
    }
    *plan = made.release();
  });
}

thdcp_status_t thdcp_attention_plan_destroy(thdcp_attention_plan_t plan) {
  return thdcp::capi::guarded(__func__, [&] { delete plan; });
}

thdcp_status_t thdcp_attention_forward(thdcp_attention_plan_t plan, const thdcp_layout_t* layout,
                                       const thdcp_tensor_t* q, const thdcp_tensor_t* k, const thdcp_tensor_t* v,
                                       const thdcp_tensor_t* out, float* lse, float* max_logit,
                                       thdcp_stream_t stream) {
  return thdcp::capi::guarded(
      __func__, [&] { thdcp::capi::forward(plan, layout, q, k, v, out, lse, max_logit, stream); });
}

thdcp_status_t thdcp_attention_backward(thdcp_attention_plan_t plan, const thdcp_layout_t* layout,
                                        const thdcp_tensor_t* q, const thdcp_tensor_t* k, const thdcp_tensor_t* v,
                                        const thdcp_tensor_t* out, const thdcp_tensor_t* dout, const float* lse,
                                        const thdcp_tensor_t* dq, const thdcp_tensor_t* dk, const thdcp_tensor_t* dv,
                                        thdcp_stream_t stream) {
  return thdcp::capi::guarded(__func__, [&] {
    thdcp::capi::backward(plan, layout, q, k, v, out, dout, lse, dq, dk, dv, stream);
  });
}

}  // extern "C"
