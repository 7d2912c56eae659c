// CP plans of the C ABI: thdcp::cp::CpuPlan over a host communicator (every CP layout,
// communication and K/V gather), thdcp::cp::CudaPlan over a device communicator (every layout
// and communication; the halo gather under the contiguous layout). Every call that is collective aborts an in-process or
// shared-GPU group when it fails on this rank (handles.h).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>

#include "capi_convert.h"
#include "capi_handles.h"
#include "capi_status.h"
#include "thdcp/cp/cp.h"

#if defined(THDCP_HAVE_CUDA)
#include "thdcp/cp/cuda.h"
#endif

namespace thdcp::capi {

// The checked contents of a thdcp_cp_params.
struct CpConfig {
  thdcp_backend_t backend = THDCP_BACKEND_CPU;
  cp::Problem problem;
  float softmax_scale = 0.0f;
  bool deterministic = true;
  int num_threads = 0;
  int backward_kv = THDCP_CP_BACKWARD_KV_GATHER;  // a thdcp_cp_backward_kv_t (CUDA)
};

namespace {

const thdcp_cp_params kDefaults = THDCP_CP_PARAMS_INIT;

const char* cp_comm_c_name(cp::CpComm comm) {
  switch (comm) {
    case cp::CpComm::kAllGather: return "THDCP_CP_COMM_ALL_GATHER";
    case cp::CpComm::kAllToAll: return "THDCP_CP_COMM_ALL_TO_ALL";
    case cp::CpComm::kA2aAg: return "THDCP_CP_COMM_A2A_AG";
  }
  return "?";
}

cp::CpComm cp_comm_of(int cp_comm) {
  THDCP_CAPI_REQUIRE(cp_comm == THDCP_CP_COMM_ALL_GATHER || cp_comm == THDCP_CP_COMM_ALL_TO_ALL ||
                         cp_comm == THDCP_CP_COMM_A2A_AG,
                     "params->cp_comm=" << cp_comm
                                        << " is not a thdcp_cp_comm_t: use THDCP_CP_COMM_ALL_GATHER (0), "
                                           "THDCP_CP_COMM_ALL_TO_ALL (1) or THDCP_CP_COMM_A2A_AG (2)");
  return static_cast<cp::CpComm>(cp_comm);
}

// a2a_size: the all-to-all group of a2a+ag, a divisor of cp, q_heads and kv_heads; 0 or 1
// in the other modes (0, the default, is 1).
int a2a_size_of(int a2a_size, const cp::Problem& problem) {
  if (problem.comm != cp::CpComm::kA2aAg) {
    THDCP_CAPI_REQUIRE(a2a_size == 0 || a2a_size == 1,
                       "params->a2a_size=" << a2a_size << " is set but params->cp_comm="
                                           << cp_comm_c_name(problem.comm)
                                           << " has no all-to-all groups: leave it 0, or use THDCP_CP_COMM_A2A_AG");
    return 1;
  }
  THDCP_CAPI_REQUIRE(a2a_size >= 1 && problem.cp % a2a_size == 0,
                     "params->a2a_size=" << a2a_size << " does not divide cp_size=" << problem.cp
                                         << ": THDCP_CP_COMM_A2A_AG groups cp_size ranks into all-to-all groups of "
                                            "a2a_size; use a divisor of cp_size (1: all-gather, cp_size: all-to-all)");
  for (auto [name, heads] : {std::make_pair("q_heads", problem.q_heads), std::make_pair("kv_heads", problem.kv_heads)}) {
    THDCP_CAPI_REQUIRE(heads % a2a_size == 0,
                       "params->" << name << "=" << heads << " is not a multiple of a2a_size=" << a2a_size
                                  << ", which params->cp_comm=THDCP_CP_COMM_A2A_AG needs (each rank of a group takes "
                                  << name << "/a2a_size heads): use an a2a_size that divides q_heads and kv_heads");
  }
  return a2a_size;
}

cp::KvGather kv_gather_of(int kv_gather) {
  THDCP_CAPI_REQUIRE(kv_gather == THDCP_CP_KV_GATHER_AUTO || kv_gather == THDCP_CP_KV_GATHER_WHOLE ||
                         kv_gather == THDCP_CP_KV_GATHER_HALO,
                     "params->kv_gather=" << kv_gather
                                          << " is not a thdcp_cp_kv_gather_t: use THDCP_CP_KV_GATHER_AUTO (0), "
                                             "THDCP_CP_KV_GATHER_WHOLE (1) or THDCP_CP_KV_GATHER_HALO (2)");
  return static_cast<cp::KvGather>(kv_gather);
}

// Halo gathers: the CPU backend's, with the all-gather communication only.
void check_kv_gather(const CpConfig& c) {
  if (c.problem.kv_gather != cp::KvGather::kHalo) return;
  THDCP_CAPI_REQUIRE(c.backend == THDCP_BACKEND_CPU || c.problem.layout == CpLayout::kContiguous,
                     "params->kv_gather=THDCP_CP_KV_GATHER_HALO is not supported by the CUDA backend with "
                     "THDCP_CP_LAYOUT_DUAL_CHUNK: it gathers a halo under THDCP_CP_LAYOUT_CONTIGUOUS only; use that "
                     "layout, THDCP_CP_KV_GATHER_AUTO or _WHOLE, or THDCP_BACKEND_CPU");
  THDCP_CAPI_REQUIRE(c.problem.comm != cp::CpComm::kAllToAll,
                     "params->kv_gather=THDCP_CP_KV_GATHER_HALO with params->cp_comm=THDCP_CP_COMM_ALL_TO_ALL: "
                     "the all-to-all moves heads, not key rows; use THDCP_CP_KV_GATHER_AUTO, or "
                     "THDCP_CP_COMM_ALL_GATHER or _A2A_AG");
}

// max_tokens under the problem's CP layout: the global rows, in [0, 2^31), cut into 2*cp
// chunks per sequence (dual chunk) or into cp pieces (contiguous).
void check_max_tokens(int64_t max_tokens, const cp::Problem& problem) {
  const int64_t cp = problem.cp;
  const bool dual_chunk = problem.layout == CpLayout::kDualChunk;
  const int64_t multiple = dual_chunk ? 2 * cp : cp;
  THDCP_CAPI_REQUIRE(max_tokens >= 0 && max_tokens <= std::numeric_limits<int32_t>::max() &&
                         max_tokens % multiple == 0,
                     "params->max_tokens=" << max_tokens << " must be a multiple of " << (dual_chunk ? "2*" : "")
                                           << "cp_size=" << multiple
                                           << " in [0, 2^31): the global rows of the layouts, which params->cp_layout="
                                           << cp_layout_c_name(problem.layout)
                                           << (dual_chunk ? " cuts into 2*cp_size chunks per sequence; round it up, "
                                                            "or use THDCP_CP_LAYOUT_CONTIGUOUS, which needs a "
                                                            "multiple of cp_size"
                                                          : " cuts into cp_size equal pieces; round it up to a "
                                                            "multiple of cp_size"));
}

// The heads all-to-all deals out: each rank takes heads/cp of the query and of the key heads.
void check_all_to_all_heads(const cp::Problem& problem) {
  if (problem.comm != cp::CpComm::kAllToAll) return;
  for (auto [name, heads] : {std::make_pair("q_heads", problem.q_heads), std::make_pair("kv_heads", problem.kv_heads)}) {
    THDCP_CAPI_REQUIRE(heads % problem.cp == 0,
                       "params->" << name << "=" << heads << " is not a multiple of cp_size=" << problem.cp
                                  << ", which params->cp_comm=THDCP_CP_COMM_ALL_TO_ALL needs (each rank takes "
                                  << name << "/cp_size heads): use THDCP_CP_COMM_ALL_GATHER, or a cp_size that "
                                              "divides q_heads and kv_heads");
  }
}

CpConfig config_of(const thdcp_cp_params* given) {
  const thdcp_cp_params p = read_params(given, THDCP_CP_PARAMS_MIN_SIZE, kDefaults, "params", "thdcp_cp_params",
                                        "THDCP_CP_PARAMS_INIT or thdcp_cp_params_init()");
  const thdcp_backend_t backend = backend_of(raw_enum(p.backend), "params->backend");
  CpConfig c;
  c.backend = backend;
  cp::Problem& problem = c.problem;
  problem.layout = cp_layout_of(p.cp_layout, "params->cp_layout");
  problem.comm = cp_comm_of(p.cp_comm);
  problem.kv_gather = kv_gather_of(p.kv_gather);
  check_kv_gather(c);
  if (backend == THDCP_BACKEND_CUDA) require_cuda_build("params->backend=THDCP_BACKEND_CUDA");
  problem.dtype = storage_dtype(raw_enum(p.dtype), "params->dtype");
  THDCP_CAPI_REQUIRE(backend == THDCP_BACKEND_CPU || problem.dtype != DType::kFloat32,
                     "params->dtype=THDCP_DTYPE_FP32 is not supported by the CUDA backend: use THDCP_DTYPE_BF16 or "
                     "THDCP_DTYPE_FP16 (or THDCP_BACKEND_CPU for fp32)");
  THDCP_CAPI_REQUIRE(p.cp_size >= 1, "params->cp_size=" << p.cp_size << " must be >= 1: the ranks of the group");
  problem.cp = p.cp_size;
  THDCP_CAPI_REQUIRE(p.max_seqs >= 1, "params->max_seqs=" << p.max_seqs
                                                          << " must be >= 1: the most sequences a layout may have");
  check_max_tokens(p.max_tokens, problem);
  check_heads(p.q_heads, p.kv_heads, p.head_dim, backend == THDCP_BACKEND_CUDA, p.v_head_dim);
  check_plan_elements(p.max_tokens, p.q_heads, p.head_dim, "params");
  check_plan_elements(p.max_tokens, p.q_heads, p.v_head_dim, "params", "v_head_dim");
  problem.capacity = Capacity{p.max_seqs, p.max_tokens};
  problem.mask = mask_of(p.window_left, p.window_right, "params");
  problem.q_heads = p.q_heads;
  problem.kv_heads = p.kv_heads;
  problem.head_dim = p.head_dim;
  problem.v_head_dim = p.v_head_dim;
  check_all_to_all_heads(problem);
  problem.a2a_size = a2a_size_of(p.a2a_size, problem);
  problem.reduce_dtype = raw_enum(p.reduce_dtype) == THDCP_DTYPE_DEFAULT
                             ? DType::kFloat32
                             : storage_dtype(raw_enum(p.reduce_dtype), "params->reduce_dtype");
  const auto c_name = [](DType d) {
    return dtype_c_name(d == DType::kBFloat16 ? THDCP_DTYPE_BF16 : d == DType::kFloat16 ? THDCP_DTYPE_FP16 : THDCP_DTYPE_FP32);
  };
  THDCP_CAPI_REQUIRE(problem.reduce_dtype == DType::kFloat32 || problem.reduce_dtype == problem.dtype,
                     "params->reduce_dtype=" << c_name(problem.reduce_dtype) << " with params->dtype="
                                             << c_name(problem.dtype)
                                             << ": dK/dV partial sums cross ranks in fp32 or in the problem's "
                                                "dtype; use THDCP_DTYPE_DEFAULT (fp32) or "
                                             << c_name(problem.dtype));
  THDCP_CAPI_REQUIRE(p.head_slices >= 0, "params->head_slices=" << p.head_slices << " must be >= 0 (0 or 1: all heads at once)");
  THDCP_CAPI_REQUIRE(p.head_slices <= 1 || problem.comm != cp::CpComm::kA2aAg,
                     "params->head_slices=" << p.head_slices
                                            << " with params->cp_comm THDCP_CP_COMM_A2A_AG: slices are all_to_all's "
                                               "and all_gather's; use 0 or 1");
  problem.head_slices = std::max(p.head_slices, 1);
  if (problem.head_slices > 1) {
    // all_to_all slices a rank's heads (both counts are multiples of cp here), all_gather all.
    const bool per_rank = problem.comm == cp::CpComm::kAllToAll;
    const int64_t q = per_rank ? problem.q_heads / problem.cp : problem.q_heads;
    const int64_t kv = per_rank ? problem.kv_heads / problem.cp : problem.kv_heads;
    THDCP_CAPI_REQUIRE(q % problem.head_slices == 0 && kv % problem.head_slices == 0,
                       "params->head_slices=" << p.head_slices << (per_rank ? " with q_heads/cp_size=" : " with q_heads=")
                                              << q << (per_rank ? " and kv_heads/cp_size=" : " and kv_heads=") << kv
                                              << (per_rank ? " heads per rank" : "")
                                              << ": each slice takes as many of both; use a divisor of both (1 "
                                                 "takes every head at once)");
    THDCP_CAPI_REQUIRE(per_rank || problem.kv_gather != cp::KvGather::kHalo,
                       "params->head_slices=" << p.head_slices
                                              << " with params->kv_gather THDCP_CP_KV_GATHER_HALO: all_gather's "
                                                 "slices gather the whole K/V; use THDCP_CP_KV_GATHER_AUTO or "
                                                 "WHOLE, or head_slices 0 or 1");
  }
  check_softmax_scale(p.softmax_scale, "params");
  c.softmax_scale = p.softmax_scale;
  c.deterministic = p.deterministic != 0;
  check_num_threads(p.num_threads, "params");
  c.num_threads = p.num_threads;
  THDCP_CAPI_REQUIRE(p.backward_kv_from_forward >= THDCP_CP_BACKWARD_KV_GATHER &&
                         p.backward_kv_from_forward <= THDCP_CP_BACKWARD_KV_AUTO,
                     "params->backward_kv_from_forward=" << p.backward_kv_from_forward
                                                         << " is not a thdcp_cp_backward_kv_t: pass "
                                                            "THDCP_CP_BACKWARD_KV_GATHER (0), _FROM_FORWARD (1) or "
                                                            "_AUTO (2)");
  c.backward_kv = p.backward_kv_from_forward;
  THDCP_CAPI_REQUIRE(p.reserved_head_groups == 0 || p.reserved_head_groups == 1,
                     "params->reserved_head_groups=" << p.reserved_head_groups
                                                     << " must be 0 or 1 (head groups were removed in 0.2)");
  THDCP_CAPI_REQUIRE(p.reserved == 0, "params->reserved=" << p.reserved << " must be 0");
  return c;
}

AttentionOptions cpu_options(const CpConfig& c) {
  AttentionOptions o;
  o.softmax_scale = c.softmax_scale;
  o.num_threads = c.num_threads;
  return o;
}

#if defined(THDCP_HAVE_CUDA)
AttentionOptions cuda_options(const CpConfig& c) {
  AttentionOptions o;
  o.softmax_scale = c.softmax_scale;
  o.deterministic = c.deterministic;
  return o;
}
#endif

}  // namespace

// What a thdcp_cp_plan_t stands for. It holds its communicator, declared first so that it
// outlives the plans made over it.
struct CpPlan {
  std::shared_ptr<Comm> comm;
  CpConfig config;
  std::unique_ptr<cp::CpuPlan> cpu;
#if defined(THDCP_HAVE_CUDA)
  std::unique_ptr<cp::CudaPlan> cuda;
#endif
};

namespace {

// The plan of `handle` for a collective call, its communicator into `group` (to abort).
std::shared_ptr<CpPlan> collective_plan(thdcp_cp_plan_t handle, std::shared_ptr<Comm>& group) {
  std::shared_ptr<CpPlan> plan = lookup<CpPlan>(handle, "plan");
  group = plan->comm;
  return plan;
}

void create(thdcp_communicator_t comm_handle, const thdcp_cp_params* params, void* workspace,
            size_t workspace_bytes, thdcp_cp_plan_t* plan, std::shared_ptr<Comm>& group) {
  const std::shared_ptr<Comm> comm = lookup<Comm>(comm_handle, "comm");
  group = comm;
  auto made = std::make_shared<CpPlan>();
  made->comm = comm;
  made->config = config_of(params);
  THDCP_CAPI_NOT_NULL(plan, "a thdcp_cp_plan_t to receive the plan");
  const CpConfig& c = made->config;
  THDCP_CAPI_REQUIRE(c.problem.cp == comm->size(),
                     "params->cp_size=" << c.problem.cp << " but the communicator has " << comm->size()
                                        << " ranks: set cp_size to the communicator's size");
  if (c.backend == THDCP_BACKEND_CPU) {
    THDCP_CAPI_REQUIRE(!comm->is_device(),
                       "comm is a device communicator (" << comm->kind()
                                                         << ") but THDCP_BACKEND_CPU needs a host communicator "
                                                            "(in-process or MPI): pass one, or use THDCP_BACKEND_CUDA");
    (void)workspace;
    (void)workspace_bytes;
    made->cpu = std::make_unique<cp::CpuPlan>(*comm->host, c.problem, cpu_options(c));
  } else {
    THDCP_CAPI_REQUIRE(comm->is_device(),
                       "comm is a host communicator (" << comm->kind()
                                                       << ") but THDCP_BACKEND_CUDA needs a device communicator "
                                                          "(NCCL or a shared-GPU group): pass one, or use "
                                                          "THDCP_BACKEND_CPU");
    require_cuda_device("params->backend=THDCP_BACKEND_CUDA");
#if defined(THDCP_HAVE_CUDA)
    made->cuda = std::make_unique<cp::CudaPlan>(*comm->device, c.problem, cuda_options(c), workspace,
                                                workspace_bytes);
#endif
  }
  *plan = publish(std::move(made));
}

// The layout of a step: CPU host arrays (checked by the plan); CUDA device arrays in
// capacity form.
LayoutView step_layout(const CpConfig& c, const thdcp_layout_t* layout) {
  const LayoutView batch = layout_view(layout, "layout");
  if (c.backend == THDCP_BACKEND_CUDA) {
    THDCP_CAPI_REQUIRE(batch.num_seqs == c.problem.capacity.max_seqs,
                       "layout->num_seqs=" << batch.num_seqs << " but the CUDA backend reads layouts in capacity "
                                           << "form: num_seqs must be the plan's max_seqs="
                                           << c.problem.capacity.max_seqs
                                           << ", unused trailing entries repeating the last offset "
                                              "(thdcp_capacity_layout makes it)");
  }
  return batch;
}

void forward(CpPlan& plan, const thdcp_layout_t* layout, const thdcp_tensor_t* q, const thdcp_tensor_t* k,
             const thdcp_tensor_t* v, const thdcp_tensor_t* out, float* lse, float* max_logit,
             const thdcp_attention_extras* extras, thdcp_stream_t stream) {
  const LayoutView batch = step_layout(plan.config, layout);
  ForwardTensors t = forward_tensors(q, k, v, out, lse, max_logit);
  const cp::Problem& p = plan.config.problem;
  t.sinks = extras_of(extras, p.q_heads, /*backward=*/false).sinks;
  // Shapes and dtypes: the plan's own checks (thdcp::check_thd_shape), the same on both backends.
  THDCP_CAPI_REQUIRE(lse != nullptr || p.q_heads * p.local_rows() == 0,
                     "lse is NULL: pass q_heads * max_tokens / cp = " << p.q_heads * p.local_rows() << " floats");
  if (plan.cpu) {
    plan.cpu->forward(batch, t);
    return;
  }
#if defined(THDCP_HAVE_CUDA)
  plan.cuda->forward(DeviceLayout{batch.cu_seqlens, batch.cu_seqlens_padded, p.capacity}, t, stream);
#else
  (void)stream;
#endif
}

void backward(CpPlan& plan, const thdcp_layout_t* layout, const thdcp_tensor_t* q, const thdcp_tensor_t* k,
              const thdcp_tensor_t* v, const thdcp_tensor_t* out, const thdcp_tensor_t* dout, const float* lse,
              const thdcp_tensor_t* dq, const thdcp_tensor_t* dk, const thdcp_tensor_t* dv,
              const thdcp_attention_extras* extras, thdcp_stream_t stream) {
  const LayoutView batch = step_layout(plan.config, layout);
  BackwardTensors t = backward_tensors(q, k, v, out, dout, lse, dq, dk, dv);
  const cp::Problem& p = plan.config.problem;
  const thdcp_attention_extras e = extras_of(extras, p.q_heads, /*backward=*/true);
  t.sinks = e.sinks;
  t.dsinks = e.dsinks;
  THDCP_CAPI_REQUIRE(lse != nullptr || p.q_heads * p.local_rows() == 0,
                     "lse is NULL: pass the forward's q_heads * max_tokens / cp = " << p.q_heads * p.local_rows()
                                                                                    << " floats");
  // Shapes and dtypes: the plan's own checks (thdcp::check_thd_shape), the same on both backends.
  if (plan.cpu) {
    plan.cpu->backward(batch, t);
    return;
  }
#if defined(THDCP_HAVE_CUDA)
  plan.cuda->backward(DeviceLayout{batch.cu_seqlens, batch.cu_seqlens_padded, p.capacity}, t, stream,
                      plan.config.backward_kv == THDCP_CP_BACKWARD_KV_FROM_FORWARD ? cp::KvSource::kFromForward
                      : plan.config.backward_kv == THDCP_CP_BACKWARD_KV_AUTO     ? cp::KvSource::kAuto
                                                                                 : cp::KvSource::kGather);
#else
  (void)stream;
#endif
}

void kv_traffic(const CpPlan& plan, const thdcp_layout_t* layout, thdcp_cp_kv_gather_t* gather,
                int64_t* forward_bytes, int64_t* backward_bytes) {
  const CpConfig& c = plan.config;
  THDCP_CAPI_REQUIRE(c.backend == THDCP_BACKEND_CPU && c.problem.comm != cp::CpComm::kAllToAll,
                     "plan is a " << (c.backend == THDCP_BACKEND_CPU ? "THDCP_CP_COMM_ALL_TO_ALL" : "THDCP_BACKEND_CUDA")
                                  << " plan: thdcp_cp_plan_kv_traffic reports the K/V rows of a THDCP_BACKEND_CPU plan "
                                     "of THDCP_CP_COMM_ALL_GATHER or _A2A_AG (the CUDA backend always gathers whole)");
  const LayoutView batch = step_layout(c, layout);
  THDCP_CAPI_NOT_NULL(gather, "a thdcp_cp_kv_gather_t to receive the gather the step runs");
  THDCP_CAPI_NOT_NULL(forward_bytes, "an array of cp_size=" << c.problem.cp << " int64_t for the forward's bytes");
  THDCP_CAPI_NOT_NULL(backward_bytes, "an array of cp_size=" << c.problem.cp << " int64_t for the backward's bytes");
  const cp::KvTraffic traffic = plan.cpu->kv_traffic(batch);  // checks the layout
  *gather = traffic.gather == cp::KvGather::kHalo ? THDCP_CP_KV_GATHER_HALO : THDCP_CP_KV_GATHER_WHOLE;
  for (size_t r = 0; r < traffic.forward_bytes.size(); ++r) {
    forward_bytes[r] = traffic.forward_bytes[r];
    backward_bytes[r] = traffic.backward_bytes[r];
  }
}

}  // namespace

}  // namespace thdcp::capi

extern "C" {

thdcp_status_t thdcp_cp_plan_workspace_size(const thdcp_cp_params* params, size_t* workspace_bytes) {
  return thdcp::capi::guarded(__func__, [&] {
    [[maybe_unused]] const thdcp::capi::CpConfig c = thdcp::capi::config_of(params);
    THDCP_CAPI_NOT_NULL(workspace_bytes, "a size_t to receive the bytes");
    size_t bytes = 0;
#if defined(THDCP_HAVE_CUDA)
    if (c.backend == THDCP_BACKEND_CUDA) bytes = thdcp::cp::cuda_workspace_size(c.problem, thdcp::capi::cuda_options(c));
#endif
    *workspace_bytes = bytes;
  });
}

thdcp_status_t thdcp_cp_plan_create(thdcp_communicator_t comm, const thdcp_cp_params* params, void* workspace,
                                    size_t workspace_bytes, thdcp_cp_plan_t* plan) {
  return thdcp::capi::guarded_collective(__func__, [&](std::shared_ptr<thdcp::capi::Comm>& group) {
    thdcp::capi::create(comm, params, workspace, workspace_bytes, plan, group);
  });
}

thdcp_status_t thdcp_cp_plan_destroy(thdcp_cp_plan_t plan) {
  return thdcp::capi::guarded(__func__, [&] { thdcp::capi::retire<thdcp::capi::CpPlan>(plan, "plan"); });
}

thdcp_status_t thdcp_cp_plan_kv_traffic(thdcp_cp_plan_t plan, const thdcp_layout_t* layout,
                                        thdcp_cp_kv_gather_t* gather, int64_t* forward_bytes,
                                        int64_t* backward_bytes) {
  return thdcp::capi::guarded(__func__, [&] {
    const auto live = thdcp::capi::lookup<thdcp::capi::CpPlan>(plan, "plan");
    thdcp::capi::kv_traffic(*live, layout, gather, forward_bytes, backward_bytes);
  });
}

thdcp_status_t thdcp_cp_forward(thdcp_cp_plan_t plan, const thdcp_layout_t* layout, const thdcp_tensor_t* q,
                                const thdcp_tensor_t* k, const thdcp_tensor_t* v, const thdcp_tensor_t* out,
                                float* lse, float* max_logit, thdcp_stream_t stream) {
  return thdcp::capi::guarded_collective(__func__, [&](std::shared_ptr<thdcp::capi::Comm>& group) {
    const auto live = thdcp::capi::collective_plan(plan, group);
    thdcp::capi::forward(*live, layout, q, k, v, out, lse, max_logit, nullptr, stream);
  });
}

thdcp_status_t thdcp_cp_forward_ex(thdcp_cp_plan_t plan, const thdcp_layout_t* layout, const thdcp_tensor_t* q,
                                   const thdcp_tensor_t* k, const thdcp_tensor_t* v, const thdcp_tensor_t* out,
                                   float* lse, float* max_logit, const thdcp_attention_extras* extras,
                                   thdcp_stream_t stream) {
  return thdcp::capi::guarded_collective(__func__, [&](std::shared_ptr<thdcp::capi::Comm>& group) {
    const auto live = thdcp::capi::collective_plan(plan, group);
    thdcp::capi::forward(*live, layout, q, k, v, out, lse, max_logit, extras, stream);
  });
}

thdcp_status_t thdcp_cp_backward(thdcp_cp_plan_t plan, const thdcp_layout_t* layout, const thdcp_tensor_t* q,
                                 const thdcp_tensor_t* k, const thdcp_tensor_t* v, const thdcp_tensor_t* out,
                                 const thdcp_tensor_t* dout, const float* lse, const thdcp_tensor_t* dq,
                                 const thdcp_tensor_t* dk, const thdcp_tensor_t* dv, thdcp_stream_t stream) {
  return thdcp::capi::guarded_collective(__func__, [&](std::shared_ptr<thdcp::capi::Comm>& group) {
    const auto live = thdcp::capi::collective_plan(plan, group);
    thdcp::capi::backward(*live, layout, q, k, v, out, dout, lse, dq, dk, dv, nullptr, stream);
  });
}

thdcp_status_t thdcp_cp_backward_ex(thdcp_cp_plan_t plan, const thdcp_layout_t* layout, const thdcp_tensor_t* q,
                                    const thdcp_tensor_t* k, const thdcp_tensor_t* v, const thdcp_tensor_t* out,
                                    const thdcp_tensor_t* dout, const float* lse, const thdcp_tensor_t* dq,
                                    const thdcp_tensor_t* dk, const thdcp_tensor_t* dv,
                                    const thdcp_attention_extras* extras, thdcp_stream_t stream) {
  return thdcp::capi::guarded_collective(__func__, [&](std::shared_ptr<thdcp::capi::Comm>& group) {
    const auto live = thdcp::capi::collective_plan(plan, group);
    thdcp::capi::backward(*live, layout, q, k, v, out, dout, lse, dq, dk, dv, extras, stream);
  });
}

}  // extern "C"
