// The CUDA implementations of the thdcp operators (schemas in ops.cpp), and the registry of
// the NCCL communicators that cp_attention runs over.
//
// Every operator enqueues on PyTorch's current stream of the tensors' device and allocates
// only through PyTorch's caching allocator (at::empty), with no host synchronisation and no
// read-back, so it works inside torch.cuda.graph and torch.compile. The single-device
// attention and RoPE make their plan on every call (host arithmetic, a kernel attribute and
// one pointer query: capture-safe). A CP plan is collective (its ranks exchange and check
// the problem, waiting on the host), so it is made once per (communicator, problem) on the
// first, eager, call and reused; a first call inside a capture is refused with the fix.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "common.h"
#include "thdcp/comm_device/nccl.h"
#include "thdcp/cp/cuda.h"
#include "thdcp/cuda/attention.h"
#include "thdcp/core/cuda_check.h"
#include "thdcp/cuda/rope.h"

namespace thdcp::torch_ops {
namespace {

using Outputs3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using Outputs4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// The call's device made current, and PyTorch's current stream on it: every operator
// enqueues there.
struct OnDevice {
  explicit OnDevice(const at::Tensor& t)
      : guard(t.device()), stream(at::cuda::getCurrentCUDAStream(t.get_device()).stream()) {}
  c10::cuda::CUDAGuard guard;
  cudaStream_t stream;
};

void check_cuda_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens,
                       const at::Tensor& cu_seqlens_padded) {
  const at::Device device = q.device();
  check_thd(q, "q");
  check_thd(k, "k");
  check_thd(v, "v");
  check_same_device(k, "k", device);
  check_same_device(v, "v", device);
  check_metadata(cu_seqlens, "cu_seqlens", device);
  check_metadata(cu_seqlens_padded, "cu_seqlens_padded", device);
  TORCH_CHECK_VALUE(cu_seqlens.numel() == cu_seqlens_padded.numel(), "thdcp: cu_seqlens has ", cu_seqlens.numel(),
                    " entries but cu_seqlens_padded has ", cu_seqlens_padded.numel(), "; pass one per sequence + 1");
  TORCH_CHECK_VALUE(q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf, "thdcp: q has dtype ",
                    q.scalar_type(), "; the CUDA backend takes torch.bfloat16 or torch.float16");
  TORCH_CHECK_VALUE(cuda::cuda_supports_head_dims(q.size(2), v.size(2)), "thdcp: head_dim=", q.size(2),
                    " (q.shape[-1]) with v_head_dim=", v.size(2),
                    " (v.shape[-1]) is not supported by the CUDA backend: it takes ", cuda::cuda_head_dims_text(),
                    " (CPU tensors: any multiples of 8 up to 256)");
}

// The outputs of a forward ([rows, Hq, D_v] out, [Hq, rows] fp32 lse, [Hq] or [0] max_logit)
// and the tensor set of a forward call over them (sinks: null or [Hq] fp32 on the device).
Outputs3 forward_outputs(const at::Tensor& q, const at::Tensor& v, bool return_max_logit) {
  return Outputs3{at::empty({q.size(0), q.size(1), v.size(2)}, q.options()),
                  at::empty({q.size(1), q.size(0)}, q.options().dtype(at::kFloat)),
                  at::empty({return_max_logit ? q.size(1) : 0}, q.options().dtype(at::kFloat))};
}

ForwardTensors forward_tensors(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Outputs3& outputs,
                               bool return_max_logit, const float* sinks = nullptr) {
  return ForwardTensors{const_view(q, "q"),
                        const_view(k, "k"),
                        const_view(v, "v"),
                        view(std::get<0>(outputs), "out"),
                        std::get<1>(outputs).data_ptr<float>(),
                        return_max_logit ? std::get<2>(outputs).data_ptr<float>() : nullptr,
                        sinks};
}

// The gradients of a backward (contiguous, in the inputs' dtypes) and the tensor set of a
// backward call over them.
Outputs3 backward_outputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return Outputs3{at::empty({q.size(0), q.size(1), q.size(2)}, q.options()),
                  at::empty({k.size(0), k.size(1), k.size(2)}, k.options()),
                  at::empty({v.size(0), v.size(1), v.size(2)}, v.options())};
}

BackwardTensors backward_tensors(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                 const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, Outputs3& grads) {
  return BackwardTensors{const_view(q, "q"),
                         const_view(k, "k"),
                         const_view(v, "v"),
                         const_view(out, "out"),
                         const_view(dout, "dout"),
                         lse.data_ptr<float>(),
                         view(std::get<0>(grads), "dq"),
                         view(std::get<1>(grads), "dk"),
                         view(std::get<2>(grads), "dv")};
}

// `t` with the call's sinks (null: none) and, with them, dsinks written into `dsinks`.
BackwardTensors with_sinks(BackwardTensors t, const float* sink_logits, const std::optional<at::Tensor>& sinks,
                           at::Tensor& dsinks) {
  t.sinks = sink_logits;
  t.dsinks = sinks ? dsinks.data_ptr<float>() : nullptr;
  return t;
}

// Checks of a backward's extra inputs (q, k, v, metadata: check_cuda_inputs).
void check_backward_inputs(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& out,
                           const at::Tensor& lse) {
  check_same_device(dout, "dout", q.device());
  check_same_device(out, "out", q.device());
  check_same_device(lse, "lse", q.device());
  TORCH_CHECK_VALUE(lse.scalar_type() == at::kFloat && lse.is_contiguous() && lse.numel() == q.size(0) * q.size(1),
                    "thdcp: lse must be the forward's float32 [heads, tokens] tensor of ", q.size(1), " x ",
                    q.size(0), "; got ", lse.scalar_type(), " ", lse.sizes());
}

// The single-device problem of a call: its layout's capacity (cu_seqlens has max_seqs + 1
// entries; q has max_tokens rows), heads, mask and dtype (gradients in the inputs' dtype).
AttentionProblem single_device_problem(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& cu_seqlens,
                                       const Mask& mask) {
  AttentionProblem problem;
  problem.capacity = Capacity{static_cast<int>(cu_seqlens.numel() - 1), q.size(0)};
  problem.q_heads = q.size(1);
  problem.kv_heads = k.size(1);
  problem.head_dim = q.size(2);
  problem.v_head_dim = v.size(2);
  problem.mask = mask;
  problem.dtype = problem.dq_dtype = problem.dkv_dtype = to_dtype(q, "q");
  return problem;
}

DeviceLayout device_layout(const at::Tensor& cu_seqlens, const at::Tensor& cu_seqlens_padded, const Capacity& capacity) {
  return DeviceLayout{cu_seqlens.data_ptr<int32_t>(), cu_seqlens_padded.data_ptr<int32_t>(), capacity};
}

// The call's cuda::Attention over a workspace from PyTorch's caching allocator (capture-safe:
// host arithmetic, a kernel attribute and one pointer query). `workspace` keeps it alive.
cuda::Attention single_device_attention(const at::Tensor& q, const AttentionProblem& problem,
                                        const AttentionOptions& options, at::Tensor& workspace) {
  const size_t bytes = cuda::Attention::workspace_size(problem, options);
  workspace = at::empty({static_cast<int64_t>(bytes)}, q.options().dtype(at::kByte));
  return cuda::Attention(problem, options, workspace.data_ptr(), bytes);
}

Outputs3 attention_forward_cuda(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                const at::Tensor& cu_seqlens, const at::Tensor& cu_seqlens_padded,
                                int64_t window_left, int64_t window_right, double softmax_scale,
                                bool return_max_logit, const std::optional<at::Tensor>& sinks) {
  // Views (packed QKV, head-major K/V) pass as they are; only a broadcast is materialised.
  const at::Tensor q = thd_input(q_in), k = thd_input(k_in), v = thd_input(v_in);
  return translate_errors("attention", [&] {
    check_cuda_inputs(q, k, v, cu_seqlens, cu_seqlens_padded);
    const OnDevice on(q);
    const AttentionProblem problem = single_device_problem(q, k, v, cu_seqlens, window_mask(window_left, window_right));
    const float* sink_logits = sinks_data(sinks, q);
    AttentionOptions options;
    options.softmax_scale = static_cast<float>(softmax_scale);
    at::Tensor workspace;
    const cuda::Attention attention = single_device_attention(q, problem, options, workspace);
    Outputs3 outputs = forward_outputs(q, v, return_max_logit);
    attention.forward(device_layout(cu_seqlens, cu_seqlens_padded, problem.capacity),
                      forward_tensors(q, k, v, outputs, return_max_logit, sink_logits), on.stream);
    return outputs;
  });
}

Outputs4 attention_backward_cuda(const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in,
                                 const at::Tensor& v_in, const at::Tensor& out_in, const at::Tensor& lse,
                                 const at::Tensor& cu_seqlens, const at::Tensor& cu_seqlens_padded,
                                 int64_t window_left, int64_t window_right, double softmax_scale,
                                 bool deterministic, const std::optional<at::Tensor>& sinks) {
  const at::Tensor dout = thd_input(dout_in), q = thd_input(q_in), k = thd_input(k_in), v = thd_input(v_in),
                   out = thd_input(out_in);
  return translate_errors("attention backward", [&] {
    check_cuda_inputs(q, k, v, cu_seqlens, cu_seqlens_padded);
    check_backward_inputs(dout, q, out, lse);
    const OnDevice on(q);
    const AttentionProblem problem = single_device_problem(q, k, v, cu_seqlens, window_mask(window_left, window_right));
    const float* sink_logits = sinks_data(sinks, q);
    AttentionOptions options;
    options.softmax_scale = static_cast<float>(softmax_scale);
    options.deterministic = deterministic;
    at::Tensor workspace;
    const cuda::Attention attention = single_device_attention(q, problem, options, workspace);
    Outputs3 grads = backward_outputs(q, k, v);
    at::Tensor dsinks = dsinks_output(sinks, q);
    attention.backward(device_layout(cu_seqlens, cu_seqlens_padded, problem.capacity),
                       with_sinks(backward_tensors(dout, q, k, v, out, lse, grads), sink_logits, sinks, dsinks),
                       on.stream);
    return Outputs4{std::get<0>(grads), std::get<1>(grads), std::get<2>(grads), dsinks};
  });
}

at::Tensor rope_cuda(const at::Tensor& x, const at::Tensor& cu_seqlens, const at::Tensor& cu_seqlens_padded,
                     const std::optional<at::Tensor>& start_offsets, int64_t cp, int64_t rank, double theta,
                     int64_t rotary_dim, bool interleaved, bool backward, const std::string& layout_name) {
  return translate_errors("rope", [&] {
    check_rope_arguments(x, cu_seqlens, cu_seqlens_padded, start_offsets, cp, rank);
    const OnDevice on(x);
    at::Tensor y = x.clone(at::MemoryFormat::Contiguous);
    cuda::RopeShape shape;
    shape.cp = static_cast<int>(cp);
    shape.rank = static_cast<int>(rank);
    shape.cp_layout = cp_layout_argument(layout_name);
    shape.capacity.max_seqs = static_cast<int>(cu_seqlens.numel() - 1);
    shape.capacity.max_tokens = x.size(0) * cp;
    shape.q_heads = x.size(1);
    shape.kv_heads = 0;
    shape.head_dim = x.size(2);
    shape.dtype = to_dtype(x, "x");
    shape.config = rope_config(theta, rotary_dim, interleaved);
    shape.with_start_offsets = start_offsets.has_value();
    const cuda::RopePlan plan(shape);
    const int32_t* offsets = start_offsets ? start_offsets->data_ptr<int32_t>() : nullptr;
    ThdTensor yv = view(y, "x");
    const DeviceLayout layout = device_layout(cu_seqlens, cu_seqlens_padded, shape.capacity);
    if (backward) {
      plan.backward(layout, offsets, yv, ThdTensor{}, on.stream);
    } else {
      plan.forward(layout, offsets, yv, ThdTensor{}, on.stream);
    }
    return y;
  });
}

// ---- CP over NCCL communicators that thdcp made ----

struct PlanKey {
  int cp, max_seqs;
  int64_t max_tokens;
  int32_t window_left, window_right;
  int64_t q_heads, kv_heads, head_dim, v_head_dim;
  int dtype;
  float scale;
  int layout, comm, a2a_size, reduce_dtype, head_slices;
  bool operator<(const PlanKey& o) const {
    return std::tie(cp, max_seqs, max_tokens, window_left, window_right, q_heads, kv_heads, head_dim, v_head_dim,
                    dtype, scale, layout, comm, a2a_size, reduce_dtype, head_slices) <
           std::tie(o.cp, o.max_seqs, o.max_tokens, o.window_left, o.window_right, o.q_heads, o.kv_heads, o.head_dim,
                    o.v_head_dim, o.dtype, o.scale, o.layout, o.comm, o.a2a_size, o.reduce_dtype, o.head_slices);
  }
};

struct CpPlanEntry {
  // The plan's workspace, kept for its life (allocated once, outside any capture): from
  // PyTorch's caching allocator, or NCCL's window memory where the communicator wants windows
  // (copy_engine), which the plan registers as a symmetric window.
  at::Tensor workspace;
  std::shared_ptr<void> window_memory;
  std::unique_ptr<cp::CudaPlan> plan;
};

// Destroyed in reverse order: the plans, then the communicator they refer to.
struct CommEntry {
  std::unique_ptr<DeviceCommunicator> comm;
  std::map<PlanKey, CpPlanEntry> plans;
};

std::mutex registry_mutex;
// Never destroyed: at interpreter exit the peers may be gone, and finalizing a communicator
// then would wait for them. communicator_destroy() releases one explicitly.
std::map<int64_t, std::unique_ptr<CommEntry>>& registry() {
  static auto* entries = new std::map<int64_t, std::unique_ptr<CommEntry>>();
  return *entries;
}
int64_t next_handle = 1;

CommEntry& comm_entry(int64_t handle) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto it = registry().find(handle);
  TORCH_CHECK_VALUE(it != registry().end(), "thdcp: communicator handle ", handle,
                    " is not a live communicator; make one with thdcp.Communicator(group)");
  return *it->second;
}

at::Tensor nccl_unique_id_op() {
  return translate_errors("nccl_unique_id", [] {
    const std::vector<char> id = nccl::unique_id();
    at::Tensor t = at::empty({static_cast<int64_t>(id.size())}, at::TensorOptions().dtype(at::kByte));
    std::memcpy(t.data_ptr(), id.data(), id.size());
    return t;
  });
}

// A registry entry for `comm`, connected (warmed up) now, outside any capture; its handle.
int64_t register_communicator(std::unique_ptr<DeviceCommunicator> comm) {
  auto entry = std::make_unique<CommEntry>();
  entry->comm = std::move(comm);
  const auto device = static_cast<c10::DeviceIndex>(entry->comm->device());
  // NCCL connects lazily: connect now, outside any capture.
  entry->comm->warm_up(at::cuda::getCurrentCUDAStream(device).stream());
  std::lock_guard<std::mutex> lock(registry_mutex);
  const int64_t handle = next_handle++;
  registry()[handle] = std::move(entry);
  return handle;
}

int64_t communicator_create_op(const at::Tensor& unique_id, int64_t rank, int64_t size, int64_t device,
                               bool copy_engine) {
  return translate_errors("communicator_create", [&] {
    TORCH_CHECK_VALUE(unique_id.device().is_cpu() && unique_id.scalar_type() == at::kByte && unique_id.is_contiguous(),
                      "thdcp: unique_id must be the CPU uint8 tensor of thdcp.ops.nccl_unique_id()");
    const int rank32 = to_int(rank, "rank"), size32 = to_int(size, "size"), device32 = to_int(device, "device");
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device32));
    nccl::Options options;
    options.copy_engine = copy_engine;
    return register_communicator(nccl::create_from_unique_id(
        unique_id.data_ptr(), static_cast<size_t>(unique_id.numel()), rank32, size32, device32, options));
  });
}

// The sub-communicator of the ranks of `parent` that pass the same color (>= 0), ranked by
// (key, rank), with the parent's options; 0 for a rank that passes color < 0. Collective
// over the parent.
int64_t communicator_split_op(int64_t parent, int64_t color, int64_t key) {
  return translate_errors("communicator_split", [&] {
    const int color32 = to_int(color, "color"), key32 = to_int(key, "key");
    DeviceCommunicator& comm = *comm_entry(parent).comm;
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(comm.device()));
    std::unique_ptr<DeviceCommunicator> child = comm.split(color32, key32);
    return child ? register_communicator(std::move(child)) : int64_t{0};
  });
}

void communicator_destroy_op(int64_t handle) {
  std::unique_ptr<CommEntry> entry;
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    auto it = registry().find(handle);
    if (it == registry().end()) return;
    entry = std::move(it->second);
    registry().erase(it);
  }
}

CpPlanEntry& cp_plan(CommEntry& entry, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& cu_seqlens, const Mask& mask, double softmax_scale, CpLayout layout,
                     cp::CpComm cp_comm, int a2a_size, DType reduce_dtype, int head_slices, cudaStream_t stream) {
  DeviceCommunicator& comm = *entry.comm;
  TORCH_CHECK_VALUE(q.get_device() == comm.device(), "thdcp: q is on cuda:", q.get_device(),
                    " but the communicator's device is cuda:", comm.device(), "; pass tensors of that device");
  cp::Problem problem;
  problem.cp = comm.size();
  problem.capacity.max_seqs = static_cast<int>(cu_seqlens.numel() - 1);
  problem.capacity.max_tokens = q.size(0) * comm.size();
  problem.mask = mask;
  problem.q_heads = q.size(1);
  problem.kv_heads = k.size(1);
  problem.head_dim = q.size(2);
  problem.v_head_dim = v.size(2);
  problem.dtype = to_dtype(q, "q");
  problem.layout = layout;
  problem.comm = cp_comm;
  problem.a2a_size = a2a_size;
  problem.reduce_dtype = reduce_dtype;
  problem.head_slices = head_slices;
  const PlanKey key{problem.cp,         problem.capacity.max_seqs,       problem.capacity.max_tokens,
                    mask.window_left,   mask.window_right,               problem.q_heads,
                    problem.kv_heads,   problem.head_dim,                problem.v_head_dim,
                    static_cast<int>(problem.dtype), static_cast<float>(softmax_scale), static_cast<int>(layout),
                    static_cast<int>(cp_comm), a2a_size, static_cast<int>(reduce_dtype), head_slices};
  auto it = entry.plans.find(key);
  if (it != entry.plans.end()) return it->second;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  THDCP_CHECK_CUDA(cudaStreamIsCapturing(stream, &capture));
  TORCH_CHECK(capture == cudaStreamCaptureStatusNone,
              "thdcp.cp_attention: the first call for this shape (capacity ", problem.capacity.max_tokens, " tokens, ",
              problem.capacity.max_seqs, " sequences, ", problem.q_heads, ":", problem.kv_heads, " heads, D ",
              problem.head_dim, ") is inside a CUDA graph capture; making its plan is collective and waits on the "
              "host: run one eager step (a warm-up) before capturing");
  AttentionOptions options;
  options.softmax_scale = static_cast<float>(softmax_scale);
  CpPlanEntry made;
  const size_t bytes = cp::cuda_workspace_size(problem, options);
  void* workspace = nullptr;
  if (comm.wants_windows()) {
    made.window_memory = cp::cuda_workspace_memory(comm, bytes);
    workspace = made.window_memory.get();
  } else {
    made.workspace = at::empty({static_cast<int64_t>(bytes)}, q.options().dtype(at::kByte));
    workspace = made.workspace.data_ptr();
  }
  made.plan = std::make_unique<cp::CudaPlan>(comm, problem, options, workspace, bytes);
  return entry.plans.emplace(key, std::move(made)).first->second;
}

Outputs3 cp_attention_forward_cuda(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                   const at::Tensor& cu_seqlens, const at::Tensor& cu_seqlens_padded, int64_t handle,
                                   int64_t window_left, int64_t window_right, double softmax_scale,
                                   bool return_max_logit, const std::optional<at::Tensor>& sinks,
                                   const std::string& layout, const std::string& cp_comm, int64_t a2a_size,
                                   const std::string& reduce_dtype, int64_t head_slices) {
  // Views (packed QKV, head-major K/V) pass as they are; only a broadcast is materialised.
  const at::Tensor q = thd_input(q_in), k = thd_input(k_in), v = thd_input(v_in);
  return translate_errors("cp_attention", [&] {
    check_cuda_inputs(q, k, v, cu_seqlens, cu_seqlens_padded);
    const OnDevice on(q);
    CommEntry& entry = comm_entry(handle);
    CpPlanEntry& made = cp_plan(entry, q, k, v, cu_seqlens, window_mask(window_left, window_right), softmax_scale,
                                cp_layout_argument(layout), cp_comm_argument(cp_comm), to_int(a2a_size, "a2a_size"),
                                reduce_dtype_argument(reduce_dtype), to_int(head_slices, "head_slices"), on.stream);
    const float* sink_logits = sinks_data(sinks, q);
    Outputs3 outputs = forward_outputs(q, v, return_max_logit);
    made.plan->forward(device_layout(cu_seqlens, cu_seqlens_padded, made.plan->problem().capacity),
                       forward_tensors(q, k, v, outputs, return_max_logit, sink_logits), on.stream);
    return outputs;
  });
}

Outputs4 cp_attention_backward_cuda(const at::Tensor& dout_in, const at::Tensor& q_in, const at::Tensor& k_in,
                                    const at::Tensor& v_in, const at::Tensor& out_in, const at::Tensor& lse,
                                    const at::Tensor& cu_seqlens, const at::Tensor& cu_seqlens_padded, int64_t handle,
                                    int64_t window_left, int64_t window_right, double softmax_scale,
                                    const std::optional<at::Tensor>& sinks, const std::string& layout,
                                    const std::string& cp_comm, int64_t a2a_size, const std::string& reduce_dtype,
                                    int64_t head_slices) {
  const at::Tensor dout = thd_input(dout_in), q = thd_input(q_in), k = thd_input(k_in), v = thd_input(v_in),
                   out = thd_input(out_in);
  return translate_errors("cp_attention backward", [&] {
    check_cuda_inputs(q, k, v, cu_seqlens, cu_seqlens_padded);
    check_backward_inputs(dout, q, out, lse);
    const OnDevice on(q);
    CommEntry& entry = comm_entry(handle);
    CpPlanEntry& made = cp_plan(entry, q, k, v, cu_seqlens, window_mask(window_left, window_right), softmax_scale,
                                cp_layout_argument(layout), cp_comm_argument(cp_comm), to_int(a2a_size, "a2a_size"),
                                reduce_dtype_argument(reduce_dtype), to_int(head_slices, "head_slices"), on.stream);
    const float* sink_logits = sinks_data(sinks, q);
    Outputs3 grads = backward_outputs(q, k, v);
    at::Tensor dsinks = dsinks_output(sinks, q);
    made.plan->backward(device_layout(cu_seqlens, cu_seqlens_padded, made.plan->problem().capacity),
                        with_sinks(backward_tensors(dout, q, k, v, out, lse, grads), sink_logits, sinks, dsinks),
                        on.stream, cp::KvSource::kAuto);  // the forward's K/V when it ran last on this plan
    return Outputs4{std::get<0>(grads), std::get<1>(grads), std::get<2>(grads), dsinks};
  });
}

}  // namespace
}  // namespace thdcp::torch_ops

TORCH_LIBRARY_FRAGMENT(thdcp, m) {
  using namespace thdcp::torch_ops;
  // NCCL communicators for cp_attention, made over a torch.distributed group by
  // thdcp.Communicator (the unique id travels over the group).
  m.def("nccl_unique_id() -> Tensor", &nccl_unique_id_op);
  m.def("communicator_create(Tensor unique_id, int rank, int size, int device, bool copy_engine=False) -> int",
        &communicator_create_op);
  m.def("communicator_split(int comm, int color, int key) -> int", &communicator_split_op);
  m.def("communicator_destroy(int comm) -> ()", &communicator_destroy_op);
}

TORCH_LIBRARY_IMPL(thdcp, CUDA, m) {
  using namespace thdcp::torch_ops;
  m.impl("attention_forward", &attention_forward_cuda);
  m.impl("attention_backward", &attention_backward_cuda);
  m.impl("rope", &rope_cuda);
  m.impl("cp_attention_forward", &cp_attention_forward_cuda);
  m.impl("cp_attention_backward", &cp_attention_backward_cuda);
}
