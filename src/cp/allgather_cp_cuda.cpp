// The CUDA step set of AllGather CP and the CudaPlan: host code that enqueues device work.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "agreement.h"
#include "allgather_steps.h"
#include "thdcp/core/error.h"
#include "thdcp/cp/cuda.h"
#include "thdcp/cuda/check.h"
#include "thdcp/cuda/reorder.h"

namespace thdcp::cp {

namespace {

constexpr size_t kAlignment = 256;
constexpr double kPlanExchangeTimeoutSeconds = 300;
constexpr int kMaxPhaseMarks = 16;

size_t align_up(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

using detail::SequenceGrads;
using detail::Slot;

int index_of(Slot slot) { return slot == Slot::kK ? 0 : 1; }

cuda::DeviceSegmentTable table_shape(const Problem& p) {
  cuda::DeviceSegmentTable t;
  t.capacity = cuda::segment_table_capacity(cuda::TableKind::kAllGatherCp, p.capacity.max_seqs);
  t.q_rows = p.local_rows();
  t.k_rows = p.capacity.max_tokens;
  t.mask = p.mask;
  t.kind = cuda::TableKind::kAllGatherCp;
  return t;
}

cuda::AttentionShape attention_shape(const Problem& p) {
  cuda::AttentionShape s;
  s.table = table_shape(p);
  s.q_heads = p.q_heads;
  s.kv_heads = p.kv_heads;
  s.head_dim = p.head_dim;
  s.dtype = p.dtype;
  s.dq_dtype = p.dtype;
  s.dkv_dtype = DType::kFloat32;  // partial sums of every gathered row, reduce-scattered in fp32
  return s;
}

// Offsets of the workspace, in order.
struct Layout {
  size_t segments = 0, packed[2] = {}, gathered[2] = {}, sequence[2] = {}, grad_seq[2] = {}, grad_ranked = 0,
         grad_local = 0, forward = 0, backward = 0, total = 0;
  size_t forward_bytes = 0, backward_bytes = 0;
};

Layout workspace_layout(const Problem& p, const cuda::Options& options) {
  detail::validate_problem(p);
  Layout w;
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t offset = at;
    at += align_up(bytes);
    return offset;
  };
  const size_t elements = static_cast<size_t>(p.capacity.max_tokens * p.kv_heads * p.head_dim);
  const size_t local_elements = elements / static_cast<size_t>(p.cp);
  w.segments = take(sizeof(Segment) * static_cast<size_t>(table_shape(p).capacity));
  for (int i = 0; i < 2; ++i) w.packed[i] = take(local_elements * dtype_size(p.dtype));
  for (int i = 0; i < 2; ++i) w.gathered[i] = take(elements * dtype_size(p.dtype));
  for (int i = 0; i < 2; ++i) w.sequence[i] = take(elements * dtype_size(p.dtype));
  for (int i = 0; i < 2; ++i) w.grad_seq[i] = take(elements * sizeof(float));
  // dK and dV go through rank order and the reduce-scatter one after the other: one buffer
  // each, reused (the collective has finished reading it before the next use is enqueued).
  w.grad_ranked = take(elements * sizeof(float));
  w.grad_local = take(local_elements * sizeof(float));
  const cuda::AttentionShape shape = attention_shape(p);
  w.forward_bytes = cuda::ForwardPlan::workspace_size(shape);
  w.backward_bytes = cuda::BackwardPlan::workspace_size(shape, options);
  w.forward = take(w.forward_bytes);
  w.backward = take(w.backward_bytes);
  w.total = at;
  return w;
}

uint64_t options_fingerprint(const cuda::Options& options) {
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &options.softmax_scale, sizeof(scale_bits));
  return (static_cast<uint64_t>(scale_bits) << 8) | (options.deterministic ? 1u : 0u);
}

// A strided K/V row must still be one run of heads * head_dim elements (heads adjacent), so
// that a 2-D copy packs it; arbitrary head strides go through the single-device call.
void check_packable(const char* name, const ConstThdTensor& t) {
  THDCP_CHECK(t.head_step() == t.head_dim,
              name << ".head_stride=" << t.head_step() << " differs from head_dim=" << t.head_dim
                   << ": AllGather CP packs strided K/V rows with one 2-D copy, so the heads of a row must be "
                      "adjacent (views of a packed QKV buffer are)");
  THDCP_CHECK(t.row_step() >= t.heads * t.head_dim,
              name << ".row_stride=" << t.row_step() << " overlaps the next row (a row holds heads*head_dim="
                   << t.heads * t.head_dim << " elements)");
}

void check_tensor(const char* name, const ConstThdTensor& t, const Problem& p, int64_t heads, bool any_dtype) {
  THDCP_CHECK(t.tokens == p.local_rows(),
              name << " has " << t.tokens << " rows but this rank holds T/cp=" << p.local_rows()
                   << " rows: pass the rank's local tensor");
  THDCP_CHECK(t.heads == heads && t.head_dim == p.head_dim,
              name << " is [" << t.tokens << ", " << t.heads << ", " << t.head_dim << "] but the plan has " << heads
                   << " heads of head_dim " << p.head_dim);
  THDCP_CHECK(any_dtype || t.dtype == p.dtype,
              name << " has dtype " << dtype_name(t.dtype) << " but the plan has " << dtype_name(p.dtype));
  THDCP_CHECK(t.data != nullptr || t.numel() == 0, name << " is a null pointer");
}

}  // namespace

struct CudaPlan::Workspace {
  unsigned char* base = nullptr;
  Layout layout;
  std::unique_ptr<cuda::ForwardPlan> forward;
  std::unique_ptr<cuda::BackwardPlan> backward;
  template <typename T>
  T* at(size_t offset) const {
    return reinterpret_cast<T*>(base + offset);
  }
};

struct CudaPlan::Events {
  cudaEvent_t marks[kMaxPhaseMarks] = {};
  Phase phases[kMaxPhaseMarks] = {};
  int recorded = 0;
  ~Events() {
    for (cudaEvent_t e : marks) {
      if (e) cudaEventDestroy(e);
    }
  }
};

namespace {

class CudaSteps {
 public:
  CudaSteps(DeviceCommunicator& comm, const Problem& problem, const CudaPlan::Workspace& w,
            CudaPlan::Events* events, const DeviceLayout& layout, cudaStream_t stream)
      : comm_(comm), p_(problem), w_(w), events_(events), layout_(layout), stream_(stream) {
    if (events_) events_->recorded = 0;
  }

  void phase(Phase next) {
    if (!events_ || events_->recorded >= kMaxPhaseMarks) return;
    events_->phases[events_->recorded] = next;
    THDCP_CHECK_CUDA(cudaEventRecord(events_->marks[events_->recorded++], stream_));
  }

  void build_table() {
    table_ = cuda::enqueue_cp_segment_table(layout_.cu_seqlens, layout_.cu_seqlens_padded, p_.capacity.max_seqs,
                                            p_.capacity.max_tokens, p_.cp, comm_.rank(), p_.mask,
                                            w_.at<Segment>(w_.layout.segments), stream_);
  }

  ConstThdTensor gather(const ConstThdTensor& local, Slot slot) {
    const int i = index_of(slot);
    const size_t row_bytes = local.row_bytes();
    const void* send = local.data;
    if (!local.contiguous()) {
      unsigned char* packed = w_.at<unsigned char>(w_.layout.packed[i]);
      if (local.tokens > 0) {
        THDCP_CHECK_CUDA(cudaMemcpy2DAsync(packed, row_bytes, local.data,
                                           static_cast<size_t>(local.row_step()) * dtype_size(local.dtype), row_bytes,
                                           static_cast<size_t>(local.tokens), cudaMemcpyDeviceToDevice, stream_));
      }
      send = packed;
    }
    unsigned char* gathered = w_.at<unsigned char>(w_.layout.gathered[i]);
    comm_.all_gather(send, gathered, static_cast<size_t>(local.tokens) * row_bytes, stream_);
    return ConstThdTensor(gathered, local.dtype, local.tokens * p_.cp, local.heads, local.head_dim);
  }

  ConstThdTensor to_sequence_order(const ConstThdTensor& gathered, Slot slot) {
    unsigned char* ordered = w_.at<unsigned char>(w_.layout.sequence[index_of(slot)]);
    cuda::gathered_to_sequence_order(gathered.data, ordered, gathered.row_bytes(), layout_.cu_seqlens_padded,
                                     p_.capacity.max_seqs, p_.capacity.max_tokens, p_.cp, stream_);
    return ConstThdTensor(ordered, gathered.dtype, gathered.tokens, gathered.heads, gathered.head_dim);
  }

  void attention_forward(const ConstThdTensor& q, const ConstThdTensor& k, const ConstThdTensor& v, ThdTensor out,
                         float* lse, float* max_logit) {
    w_.forward->run(table_, cuda::ForwardTensors{q, k, v, out, lse, max_logit}, stream_);
  }

  void max_reduce(float* max_logit, size_t count) { comm_.all_reduce_max(max_logit, count, stream_); }

  SequenceGrads attention_backward(const ConstThdTensor& q, const ConstThdTensor& k, const ConstThdTensor& v,
                                   const ConstThdTensor& out, const ConstThdTensor& dout, const float* lse,
                                   ThdTensor dq) {
    const SequenceGrads grads{fp32(w_.layout.grad_seq[0], p_.capacity.max_tokens),
                              fp32(w_.layout.grad_seq[1], p_.capacity.max_tokens)};
    w_.backward->run(table_, cuda::BackwardTensors{q, k, v, out, dout, lse, dq, grads.dk, grads.dv}, stream_);
    return grads;
  }

  ThdTensor to_rank_order(const ThdTensor& seq, Slot) {
    const ThdTensor ranked = fp32(w_.layout.grad_ranked, p_.capacity.max_tokens);
    cuda::sequence_to_gathered_order(seq.data, ranked.data, seq.row_bytes(), layout_.cu_seqlens_padded,
                                     p_.capacity.max_seqs, p_.capacity.max_tokens, p_.cp, stream_);
    return ranked;
  }

  ThdTensor reduce_scatter(const ThdTensor& ranked, Slot) {
    const ThdTensor local = fp32(w_.layout.grad_local, p_.local_rows());
    comm_.reduce_scatter_sum(static_cast<const float*>(ranked.data), static_cast<float*>(local.data),
                             static_cast<size_t>(local.numel()), stream_);
    return local;
  }

  void cast(const ThdTensor& local, ThdTensor grad) {
    if (grad.contiguous()) {
      cuda::convert_from_fp32(static_cast<const float*>(local.data), grad.data, grad.dtype, local.numel(), stream_);
      return;
    }
    // Strided gradient rows (views of a packed dQKV buffer): round into the K gather buffer,
    // dead by now, then one 2-D copy.
    unsigned char* staging = w_.at<unsigned char>(w_.layout.gathered[0]);
    cuda::convert_from_fp32(static_cast<const float*>(local.data), staging, grad.dtype, local.numel(), stream_);
    if (grad.tokens > 0) {
      THDCP_CHECK_CUDA(cudaMemcpy2DAsync(grad.data, static_cast<size_t>(grad.row_step()) * dtype_size(grad.dtype),
                                         staging, grad.row_bytes(), grad.row_bytes(), static_cast<size_t>(grad.tokens),
                                         cudaMemcpyDeviceToDevice, stream_));
    }
  }

 private:
  ThdTensor fp32(size_t offset, int64_t rows) const {
    return ThdTensor{w_.at<float>(offset), DType::kFloat32, rows, p_.kv_heads, p_.head_dim};
  }

  DeviceCommunicator& comm_;
  const Problem& p_;
  const CudaPlan::Workspace& w_;
  CudaPlan::Events* events_;
  DeviceLayout layout_;
  cudaStream_t stream_;
  cuda::DeviceSegmentTable table_;
};

void check_layout(const DeviceLayout& layout) {
  THDCP_CHECK(layout.cu_seqlens != nullptr && layout.cu_seqlens_padded != nullptr,
              "layout.cu_seqlens and layout.cu_seqlens_padded must be device arrays of max_seqs + 1 int32 entries");
  THDCP_CHECK(reinterpret_cast<uintptr_t>(layout.cu_seqlens) % alignof(int32_t) == 0 &&
                  reinterpret_cast<uintptr_t>(layout.cu_seqlens_padded) % alignof(int32_t) == 0,
              "layout arrays must be 4-byte aligned int32 arrays");
}

}  // namespace

size_t cuda_workspace_size(const Problem& problem, const cuda::Options& options) {
  return workspace_layout(problem, options).total;
}

CudaPlan::CudaPlan(DeviceCommunicator& comm, const Problem& problem, const cuda::Options& options, void* workspace,
                   size_t workspace_bytes)
    : comm_(comm), problem_(problem), options_(options), workspace_(std::make_unique<Workspace>()) {
  detail::AgreementInput in;
  in.problem = problem;
  in.rank = comm.rank();
  in.size = comm.size();
  in.options_fingerprint = options_fingerprint(options);
  // The exchange needs the device: a small buffer and a stream of the plan's own, at plan time.
  int device = -1;
  THDCP_CHECK_CUDA(cudaGetDevice(&device));
  THDCP_CHECK(device == comm.device(), "the current device is " << device << " but the communicator's rank "
                                                                << comm.rank() << " uses device " << comm.device()
                                                                << ": call cudaSetDevice(" << comm.device() << ")");
  cudaStream_t stream = nullptr;
  THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* exchange_buffer = nullptr;
  try {
    detail::agree(
        in,
        [&] {
          THDCP_CHECK(problem.cp == comm.size(),
                      "problem.cp=" << problem.cp << " but the communicator has " << comm.size() << " ranks");
          workspace_->layout = workspace_layout(problem, options);
          const cuda::AttentionShape shape = attention_shape(problem);
          THDCP_CHECK(workspace_bytes >= workspace_->layout.total,
                      "workspace has " << workspace_bytes << " bytes; cuda_workspace_size gives "
                                       << workspace_->layout.total);
          workspace_->base = static_cast<unsigned char*>(workspace);
          // The attention plans check dtype, head dim, kernel family and their workspaces.
          workspace_->forward = std::make_unique<cuda::ForwardPlan>(
              shape, options, workspace_->at<void>(workspace_->layout.forward), workspace_->layout.forward_bytes);
          workspace_->backward = std::make_unique<cuda::BackwardPlan>(
              shape, options, workspace_->at<void>(workspace_->layout.backward), workspace_->layout.backward_bytes);
        },
        [&](const void* send, void* recv, size_t bytes) {
          THDCP_CHECK_CUDA(cudaMalloc(&exchange_buffer, bytes * static_cast<size_t>(comm.size() + 1)));
          auto* device_send = static_cast<unsigned char*>(exchange_buffer);
          unsigned char* device_recv = device_send + bytes;
          THDCP_CHECK_CUDA(cudaMemcpyAsync(device_send, send, bytes, cudaMemcpyHostToDevice, stream));
          comm.all_gather(device_send, device_recv, bytes, stream);
          THDCP_CHECK_CUDA(cudaMemcpyAsync(recv, device_recv, bytes * static_cast<size_t>(comm.size()),
                                           cudaMemcpyDeviceToHost, stream));
          comm.synchronize(stream, kPlanExchangeTimeoutSeconds);
        });
  } catch (...) {
    if (exchange_buffer) cudaFree(exchange_buffer);
    cudaStreamDestroy(stream);
    throw;
  }
  cudaFree(exchange_buffer);
  THDCP_CHECK_CUDA(cudaStreamDestroy(stream));
}

CudaPlan::~CudaPlan() = default;

void CudaPlan::forward(const DeviceLayout& layout, const ForwardTensors& t, cudaStream_t stream) {
  const Problem& p = problem_;
  check_layout(layout);
  check_tensor("q", t.q, p, p.q_heads, false);
  check_tensor("k", t.k, p, p.kv_heads, false);
  check_tensor("v", t.v, p, p.kv_heads, false);
  check_tensor("out", t.out, p, p.q_heads, false);
  check_packable("k", t.k);
  check_packable("v", t.v);
  THDCP_CHECK(t.lse != nullptr || p.local_rows() * p.q_heads == 0, "lse must point to Hq * T/cp floats");
  CudaSteps steps(comm_, p, *workspace_, events_.get(), layout, stream);
  detail::run_forward(steps, t);
}

void CudaPlan::backward(const DeviceLayout& layout, const BackwardTensors& t, cudaStream_t stream) {
  const Problem& p = problem_;
  check_layout(layout);
  check_tensor("q", t.q, p, p.q_heads, false);
  check_tensor("k", t.k, p, p.kv_heads, false);
  check_tensor("v", t.v, p, p.kv_heads, false);
  check_tensor("out", t.out, p, p.q_heads, false);
  check_tensor("dout", t.dout, p, p.q_heads, false);
  check_tensor("dq", t.dq, p, p.q_heads, true);
  check_tensor("dk", t.dk, p, p.kv_heads, true);
  check_tensor("dv", t.dv, p, p.kv_heads, true);
  check_packable("k", t.k);
  check_packable("v", t.v);
  check_packable("dk", t.dk);
  check_packable("dv", t.dv);
  THDCP_CHECK(t.dq.dtype == p.dtype || t.dq.dtype == DType::kFloat32,
              "dq has dtype " << dtype_name(t.dq.dtype) << ": use q's dtype (" << dtype_name(p.dtype) << ") or fp32");
  THDCP_CHECK((t.dk.dtype == p.dtype || t.dk.dtype == DType::kFloat32) && t.dv.dtype == t.dk.dtype,
              "dk/dv have dtypes " << dtype_name(t.dk.dtype) << "/" << dtype_name(t.dv.dtype)
                                   << ": use k's dtype (" << dtype_name(p.dtype) << ") or fp32 for both");
  THDCP_CHECK(t.lse != nullptr || p.local_rows() * p.q_heads == 0, "lse must point to the forward's Hq * T/cp floats");
  CudaSteps steps(comm_, p, *workspace_, events_.get(), layout, stream);
  detail::run_backward(steps, t);
}

void CudaPlan::enable_phase_timing() {
  if (events_) return;
  events_ = std::make_unique<Events>();
  for (cudaEvent_t& e : events_->marks) THDCP_CHECK_CUDA(cudaEventCreate(&e));
}

void CudaPlan::add_phase_timings(Timings& timings) const {
  THDCP_CHECK(events_ != nullptr, "call enable_phase_timing() before the step");
  for (int i = 0; i + 1 < events_->recorded; ++i) {
    float ms = 0;
    THDCP_CHECK_CUDA(cudaEventElapsedTime(&ms, events_->marks[i], events_->marks[i + 1]));
    timings[events_->phases[i]] += ms * 1e-3;
  }
}

}  // namespace thdcp::cp
