// Host side of the CUDA backend above the plans: the kernel family of a device and the
// single-device Attention over a table plan and the two attention plans (forward_plan.cpp,
// backward_plan.cpp, table_plan.cpp). Nothing here reads device memory or synchronises.
#include "thdcp/cuda/attention.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <tuple>

#include "attention_checks.h"
#include "launch.h"
#include "thdcp/core/error.h"
#include "thdcp/cuda/check.h"

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

void set_dynamic_shared_memory(const void* kernel, size_t bytes, const char* kernel_name, int head_dim,
                               int v_head_dim) {
  const int device = current_device();
  int limit = 0;
  THDCP_CHECK_CUDA(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  THDCP_CHECK(bytes <= static_cast<size_t>(limit),
              "head_dim=" << head_dim << ", v_head_dim=" << v_head_dim << ": " << kernel_name << " needs " << bytes
                          << " bytes of shared memory per block and device " << device << " gives a block at most "
                          << limit << ": use a GPU with more (Hopper: 232448) or smaller head dims");
  THDCP_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

}  // namespace detail

const char* kernel_family() { return detail::use_sm90_kernels() ? "sm90" : "portable"; }

bool cuda_supports_head_dims(int64_t head_dim, int64_t v_head_dim) {
  if (v_head_dim == 0) v_head_dim = head_dim;
  if (head_dim == 192 && v_head_dim == 128) return true;  // MLA
  return v_head_dim == head_dim &&
         (head_dim == 64 || head_dim == 96 || head_dim == 128 || head_dim == 192 || head_dim == 256);
}

bool cuda_supports_head_dim(int64_t head_dim) { return cuda_supports_head_dims(head_dim, head_dim); }

const char* cuda_head_dims_text() {
  return "D_qk = D_v in {64, 96, 128, 192, 256}, or D_qk 192 with D_v 128 (MLA)";
}

namespace {

AttentionShape shape_of(const AttentionProblem& problem, const TablePlan& table) {
  AttentionShape shape;
  static_cast<HeadShape&>(shape) = problem.heads();
  shape.table = table.table();
  shape.dtype = problem.dtype;
  shape.dq_dtype = problem.dq_dtype;
  shape.dkv_dtype = problem.dkv_dtype;
  return shape;
}

}  // namespace

// The workspace, in order: the segment table, the forward's, the backward's.
struct Attention::Parts {
  Segment* segments = nullptr;
  void* forward = nullptr;
  void* backward = nullptr;
  size_t forward_bytes = 0, backward_bytes = 0;

  Parts(WorkspaceCarver& carver, const AttentionProblem& problem, const TablePlan& table,
        const AttentionOptions& options) {
    const AttentionShape shape = shape_of(problem, table);
    forward_bytes = ForwardPlan::workspace_size(shape);
    backward_bytes = BackwardPlan::workspace_size(shape, options);
    segments = carver.take<Segment>(table.workspace_size());
    forward = carver.take(forward_bytes);
    backward = carver.take(backward_bytes);
  }
};

size_t Attention::workspace_size(const AttentionProblem& problem, const AttentionOptions& options) {
  WorkspaceCarver sizing;
  const Parts parts(sizing, problem, TablePlan::single_device(problem.capacity, problem.mask), options);
  (void)parts;
  return sizing.bytes();
}

namespace {

// The parts of a checked workspace (the plans check its pointer: device memory, aligned).
WorkspaceCarver checked_carver(const AttentionProblem& problem, const AttentionOptions& options, void* workspace,
                               size_t workspace_bytes) {
  const size_t needed = Attention::workspace_size(problem, options);
  THDCP_CHECK(workspace != nullptr && workspace_bytes >= needed,
              "workspace=" << workspace << " of " << workspace_bytes << " bytes: the call needs " << needed
                           << " bytes of device memory (Attention::workspace_size)");
  return WorkspaceCarver(workspace);
}

}  // namespace

Attention::Attention(const AttentionProblem& problem, const AttentionOptions& options, void* workspace,
                     size_t workspace_bytes)
    : Attention(problem, options, TablePlan::single_device(problem.capacity, problem.mask),
                checked_carver(problem, options, workspace, workspace_bytes)) {}

Attention::Attention(const AttentionProblem& problem, const AttentionOptions& options, const TablePlan& table,
                     WorkspaceCarver carver)
    : Attention(problem, options, table, Parts(carver, problem, table, options)) {}

Attention::Attention(const AttentionProblem& problem, const AttentionOptions& options, const TablePlan& table,
                     const Parts& parts)
    : problem_(problem),
      table_(table),
      segments_(parts.segments),
      forward_(shape_of(problem, table), options, parts.forward, parts.forward_bytes),
      backward_(shape_of(problem, table), options, parts.backward, parts.backward_bytes) {}

namespace {

// The query-side and key-side shapes of the problem; `values`: of v, out, dout, dv (D_v).
ThdShape q_rows_of(const AttentionProblem& p, bool values = false) {
  return values ? ThdShape{p.capacity.max_tokens, "max_tokens", p.q_heads, "q_heads", p.value_head_dim(), "v_head_dim"}
                : ThdShape{p.capacity.max_tokens, "max_tokens", p.q_heads, "q_heads", p.head_dim};
}

ThdShape kv_rows_of(const AttentionProblem& p, bool values = false) {
  return values
             ? ThdShape{p.capacity.max_tokens, "max_tokens", p.kv_heads, "kv_heads", p.value_head_dim(), "v_head_dim"}
             : ThdShape{p.capacity.max_tokens, "max_tokens", p.kv_heads, "kv_heads", p.head_dim};
}

}  // namespace

void Attention::check(const DeviceLayout& layout, const ForwardTensors* forward,
                      const BackwardTensors* backward) const {
  table_.check(layout, segments_);
  if (forward) forward_.check_tensors(*forward);
  if (backward) backward_.check_tensors(*backward);
}

void Attention::forward(const DeviceLayout& layout, const ForwardTensors& t, cudaStream_t stream) const {
  // The shapes in the problem's terms first (the plans check the rest: strides, alignment).
  for (const auto& [name, tensor, shape] : {std::make_tuple("q", t.q, q_rows_of(problem_)),
                                            std::make_tuple("k", t.k, kv_rows_of(problem_)),
                                            std::make_tuple("v", t.v, kv_rows_of(problem_, true)),
                                            std::make_tuple("out", ConstThdTensor(t.out), q_rows_of(problem_, true))}) {
    check_thd_shape(name, tensor, shape);
  }
  const DeviceSegmentTable table = table_.run(layout, segments_, stream);
  forward_.run(table, t, stream);
}

void Attention::backward(const DeviceLayout& layout, const BackwardTensors& t, cudaStream_t stream) const {
  for (const auto& [name, tensor, shape] :
       {std::make_tuple("q", t.q, q_rows_of(problem_)), std::make_tuple("k", t.k, kv_rows_of(problem_)),
        std::make_tuple("v", t.v, kv_rows_of(problem_, true)), std::make_tuple("out", t.out, q_rows_of(problem_, true)),
        std::make_tuple("dout", t.dout, q_rows_of(problem_, true)),
        std::make_tuple("dq", ConstThdTensor(t.dq), q_rows_of(problem_)),
        std::make_tuple("dk", ConstThdTensor(t.dk), kv_rows_of(problem_)),
        std::make_tuple("dv", ConstThdTensor(t.dv), kv_rows_of(problem_, true))}) {
    check_thd_shape(name, tensor, shape);
  }
  const DeviceSegmentTable table = table_.run(layout, segments_, stream);
  backward_.run(table, t, stream);
}

}  // namespace thdcp::cuda
