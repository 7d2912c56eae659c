#include "alltoall_cuda.h"

#include <algorithm>
#include <optional>

#include "thdcp/core/error.h"
#include "thdcp/core/workspace.h"
#include "thdcp/cuda/attention.h"
#include "thdcp/cuda/check.h"
#include "thdcp/cuda/reorder.h"
#include "thdcp/cuda/table.h"

namespace thdcp::cp::detail {

namespace {

// The dual-chunk layout's rank-major rows need a reorder to and from sequence order; the
// contiguous layout's are in sequence order already.
bool needs_reorder(const Problem& p) { return p.layout == CpLayout::kDualChunk; }

cuda::TablePlan table_plan(const Problem& p) { return cuda::TablePlan::single_device(p.capacity, p.mask); }

// This rank's share of the heads over every row: the single-device kernels' shape, with
// fp32 gradients (rounded once, on the way back to the rank's rows).
cuda::AttentionShape head_shape(const Problem& p) {
  cuda::AttentionShape s;
  s.q_heads = p.q_heads / p.cp;
  s.kv_heads = p.kv_heads / p.cp;
  s.head_dim = p.head_dim;
  s.v_head_dim = p.v_head_dim;
  s.table = table_plan(p).table();
  s.dtype = p.dtype;
  s.dq_dtype = DType::kFloat32;
  s.dkv_dtype = DType::kFloat32;
  return s;
}

// The parts of the workspace; `carver` without memory sizes it.
struct Parts {
  Segment* segments = nullptr;
  unsigned char* send = nullptr;            // one exchange's cp blocks (up to fp32 rows of the
  unsigned char* recv = nullptr;            // widest head-sharded tensor)
  unsigned char* q = nullptr;               // head-sharded [T, H/cp, D], sequence order, the
  unsigned char* k = nullptr;               // problem's dtype
  unsigned char* v = nullptr;
  unsigned char* out = nullptr;
  unsigned char* dout = nullptr;
  float* lse = nullptr;                     // [Hq/cp, T], sequence order
  float* lse_ranked = nullptr;              // [Hq/cp, T], rank-major (dual chunk only)
  float* dq = nullptr;                      // head-sharded fp32, sequence order
  float* dk = nullptr;
  float* dv = nullptr;
  float* max_logit = nullptr;               // [Hq/cp]
  float* dsinks = nullptr;                  // [Hq/cp]
  void* forward = nullptr;
  void* backward = nullptr;
  size_t forward_bytes = 0, backward_bytes = 0;
};

Parts carve(WorkspaceCarver& carver, const Problem& p, const AttentionOptions& options) {
  Parts w;
  const size_t rows = static_cast<size_t>(p.capacity.max_tokens);
  const size_t hq = static_cast<size_t>(p.q_heads / p.cp), hk = static_cast<size_t>(p.kv_heads / p.cp);
  const size_t dqk = static_cast<size_t>(p.head_dim), dv = static_cast<size_t>(p.value_head_dim());
  const size_t element = dtype_size(p.dtype);
  const size_t widest = std::max({hq * dqk, hq * dv, hk * dqk, hk * dv});  // elements of a head-sharded row
  w.segments = carver.take<Segment>(table_plan(p).workspace_size());
  w.send = carver.take<unsigned char>(rows * widest * sizeof(float));
  w.recv = carver.take<unsigned char>(rows * widest * sizeof(float));
  w.q = carver.take<unsigned char>(rows * hq * dqk * element);
  w.k = carver.take<unsigned char>(rows * hk * dqk * element);
  w.v = carver.take<unsigned char>(rows * hk * dv * element);
  w.out = carver.take<unsigned char>(rows * hq * dv * element);
  w.dout = carver.take<unsigned char>(rows * hq * dv * element);
  w.lse = carver.take_array<float>(hq * rows);
  w.lse_ranked = carver.take_array<float>(needs_reorder(p) ? hq * rows : 0);
  w.dq = carver.take_array<float>(rows * hq * dqk);
  w.dk = carver.take_array<float>(rows * hk * dqk);
  w.dv = carver.take_array<float>(rows * hk * dv);
  w.max_logit = carver.take_array<float>(hq);
  w.dsinks = carver.take_array<float>(hq);
  const cuda::AttentionShape shape = head_shape(p);
  w.forward_bytes = cuda::ForwardPlan::workspace_size(shape);
  w.backward_bytes = cuda::BackwardPlan::workspace_size(shape, options);
  w.forward = carver.take(w.forward_bytes);
  w.backward = carver.take(w.backward_bytes);
  return w;
}

// The heads [first, first + count) of `t`, as a view with explicit strides.
template <typename Tensor>
Tensor heads_of(const Tensor& t, int64_t first, int64_t count) {
  Tensor part = t;
  part.data = static_cast<unsigned char*>(const_cast<void*>(static_cast<const void*>(t.data))) +
              static_cast<size_t>(first * t.head_step()) * dtype_size(t.dtype);
  part.heads = count;
  part.row_stride = t.row_step();
  part.head_stride = t.head_step();
  return part;
}

// `view` (any strides) <-> dense rows [tokens, heads, head_dim] at `rows`, by 2-D copies: one
// where a row's heads are adjacent, else one per head.
void copy_view(const ConstThdTensor& view, void* rows, bool into_rows, cudaStream_t stream) {
  if (view.numel() == 0) return;
  const size_t element = dtype_size(view.dtype);
  const size_t head_bytes = static_cast<size_t>(view.head_dim) * element;
  const size_t row_bytes = static_cast<size_t>(view.heads) * head_bytes;
  const size_t pitch = view.tokens > 1 ? static_cast<size_t>(view.row_step()) * element : row_bytes;
  const bool adjacent = view.heads == 1 || view.head_step() == view.head_dim;
  const int64_t copies = adjacent ? 1 : view.heads;
  const size_t width = adjacent ? row_bytes : head_bytes;
  for (int64_t h = 0; h < copies; ++h) {
    auto* strided = static_cast<unsigned char*>(const_cast<void*>(view.data)) +
                    static_cast<size_t>(h * view.head_step()) * element;
    unsigned char* dense = static_cast<unsigned char*>(rows) + static_cast<size_t>(h) * head_bytes;
    if (into_rows) {
      THDCP_CHECK_CUDA(cudaMemcpy2DAsync(dense, row_bytes, strided, pitch, width, static_cast<size_t>(view.tokens),
                                         cudaMemcpyDeviceToDevice, stream));
    } else {
      THDCP_CHECK_CUDA(cudaMemcpy2DAsync(strided, pitch, dense, row_bytes, width, static_cast<size_t>(view.tokens),
                                         cudaMemcpyDeviceToDevice, stream));
    }
  }
}

}  // namespace

struct CudaAllToAll::State {
  DeviceCommunicator& comm;
  Problem p;
  Parts w;
  cuda::TablePlan table;
  std::unique_ptr<cuda::ForwardPlan> forward;
  std::unique_ptr<cuda::BackwardPlan> backward;
  int cp;
  int64_t local_rows, rows, q_heads;  // q_heads: this rank's share
  // The step in flight.
  DeviceLayout layout;
  cudaStream_t stream = nullptr;

  State(DeviceCommunicator& comm_, const Problem& problem, const Parts& parts)
      : comm(comm_),
        p(problem),
        w(parts),
        table(table_plan(problem)),
        cp(problem.cp),
        local_rows(problem.local_rows()),
        rows(problem.capacity.max_tokens),
        q_heads(problem.q_heads / problem.cp) {}

  // This rank's rows of `local` ([T/cp, H, D], any view) -> every row of its H/cp heads,
  // dense at `seq` in sequence order.
  ConstThdTensor to_heads(const ConstThdTensor& local, unsigned char* seq) {
    const int64_t heads = local.heads / cp;
    const size_t row_bytes = static_cast<size_t>(heads * local.head_dim) * dtype_size(local.dtype);
    const size_t block = static_cast<size_t>(local_rows) * row_bytes;
    for (int j = 0; j < cp; ++j) {
      const ConstThdTensor part = heads_of(local, j * heads, heads);
      copy_view(part, w.send + static_cast<size_t>(j) * block, true, stream);
    }
    const bool reorder = needs_reorder(p);
    comm.all_to_all(w.send, reorder ? w.recv : seq, block, stream);
    if (reorder) cuda::reorder_rows(w.recv, seq, row_bytes, 1, cuda::RowOrder::kSequence, layout, cp, stream);
    return ConstThdTensor(seq, local.dtype, rows, heads, local.head_dim);
  }

  // The inverse: this rank's heads `seq` (dense, sequence order; the local dtype or fp32) ->
  // its rows of every head, into `local` (any view), rounded once where seq is fp32.
  void to_rows(const ConstThdTensor& seq, ThdTensor local) {
    const int64_t heads = seq.heads;
    const size_t row_bytes = static_cast<size_t>(heads * seq.head_dim) * dtype_size(seq.dtype);
    const size_t block = static_cast<size_t>(local_rows) * row_bytes;
    const void* ranked = seq.data;
    if (needs_reorder(p)) {
      cuda::reorder_rows(seq.data, w.send, row_bytes, 1, cuda::RowOrder::kGathered, layout, cp, stream);
      ranked = w.send;
    }
    comm.all_to_all(ranked, w.recv, block, stream);
    for (int i = 0; i < cp; ++i) {
      const ThdTensor part = heads_of(local, i * heads, heads);
      const unsigned char* from = w.recv + static_cast<size_t>(i) * block;
      if (seq.dtype == local.dtype) {
        copy_view(ConstThdTensor(part), const_cast<unsigned char*>(from), false, stream);
      } else {
        cuda::convert_from_fp32(reinterpret_cast<const float*>(from), part, stream);
      }
    }
  }

  // lse [Hq/cp, T] of this rank's heads (sequence order) -> lse [Hq, T/cp] of its rows.
  void lse_to_rows(const float* seq, float* local) {
    const float* ranked = seq;
    if (needs_reorder(p)) {
      cuda::reorder_rows(seq, w.lse_ranked, sizeof(float), q_heads, cuda::RowOrder::kGathered, layout, cp, stream);
      ranked = w.lse_ranked;
    }
    // Block j: rows [j T/cp, (j+1) T/cp) of each of this rank's heads; what rank j receives
    // as the heads [r Hq/cp, (r+1) Hq/cp) of its lse.
    const size_t row = static_cast<size_t>(local_rows) * sizeof(float);
    const size_t block = static_cast<size_t>(q_heads) * row;
    for (int j = 0; j < cp; ++j) {
      THDCP_CHECK_CUDA(cudaMemcpy2DAsync(w.send + static_cast<size_t>(j) * block, row, ranked + j * local_rows,
                                         static_cast<size_t>(rows) * sizeof(float), row,
                                         static_cast<size_t>(q_heads), cudaMemcpyDeviceToDevice, stream));
    }
    comm.all_to_all(w.send, local, block, stream);
  }

  // The inverse: lse [Hq, T/cp] of this rank's rows -> [Hq/cp, T] of its heads, at `seq`.
  void lse_to_heads(const float* local, float* seq) {
    const size_t row = static_cast<size_t>(local_rows) * sizeof(float);
    const size_t block = static_cast<size_t>(q_heads) * row;
    comm.all_to_all(local, w.recv, block, stream);  // block j of lse: rank j's heads
    float* ranked = needs_reorder(p) ? w.lse_ranked : seq;
    for (int i = 0; i < cp; ++i) {
      THDCP_CHECK_CUDA(cudaMemcpy2DAsync(ranked + i * local_rows, static_cast<size_t>(rows) * sizeof(float),
                                         w.recv + static_cast<size_t>(i) * block, row, row,
                                         static_cast<size_t>(q_heads), cudaMemcpyDeviceToDevice, stream));
    }
    if (needs_reorder(p)) {
      cuda::reorder_rows(w.lse_ranked, seq, sizeof(float), q_heads, cuda::RowOrder::kSequence, layout, cp, stream);
    }
  }

  ThdTensor dense(void* data, DType dtype, int64_t heads, int64_t head_dim) const {
    return ThdTensor{data, dtype, rows, heads, head_dim};
  }

  // What both passes start with: the step's layout and stream, and the single-device table
  // (attention runs over whole documents), timed as the table phase; the exchanges of the
  // inputs follow.
  cuda::DeviceSegmentTable start(const DeviceLayout& step_layout, cudaStream_t step_stream, const PhaseMark& mark) {
    layout = step_layout;
    stream = step_stream;
    mark(Phase::kTable);
    const cuda::DeviceSegmentTable built = table.run(layout, w.segments, stream);
    mark(Phase::kGather);
    return built;
  }
};

size_t CudaAllToAll::workspace_size(const Problem& problem, const AttentionOptions& options) {
  WorkspaceCarver sizing;
  carve(sizing, problem, options);
  return sizing.bytes();
}

CudaAllToAll::CudaAllToAll(DeviceCommunicator& comm, const Problem& problem, const AttentionOptions& options,
                           void* workspace, size_t workspace_bytes) {
  THDCP_CHECK(problem.comm == CpComm::kAllToAll, "CudaAllToAll: comm=" << cp_comm_name(problem.comm));
  const size_t needed = workspace_size(problem, options);
  THDCP_CHECK(workspace_bytes >= needed,
              "workspace has " << workspace_bytes << " bytes; cuda_workspace_size gives " << needed);
  WorkspaceCarver carver(workspace);
  s_ = std::make_unique<State>(comm, problem, carve(carver, problem, options));
  const cuda::AttentionShape shape = head_shape(problem);
  // The plans check dtype, head dims, kernel family and their workspaces.
  s_->forward = std::make_unique<cuda::ForwardPlan>(shape, options, s_->w.forward, s_->w.forward_bytes);
  s_->backward = std::make_unique<cuda::BackwardPlan>(shape, options, s_->w.backward, s_->w.backward_bytes);
}

CudaAllToAll::~CudaAllToAll() = default;

void CudaAllToAll::forward(const DeviceLayout& layout, const ForwardTensors& t, cudaStream_t stream,
                           const PhaseMark& mark) {
  State& s = *s_;
  const Parts& w = s.w;
  const cuda::DeviceSegmentTable table = s.start(layout, stream, mark);
  const ConstThdTensor q = s.to_heads(t.q, w.q), k = s.to_heads(t.k, w.k), v = s.to_heads(t.v, w.v);
  mark(Phase::kAttention);
  const ThdTensor out = s.dense(w.out, s.p.dtype, s.q_heads, s.p.value_head_dim());
  const int64_t first_head = s.comm.rank() * s.q_heads;
  s.forward->run(table,
                 ForwardTensors{q, k, v, out, w.lse, t.max_logit ? w.max_logit : nullptr,
                                t.sinks ? t.sinks + first_head : nullptr},
                 stream);
  mark(Phase::kReduce);
  s.to_rows(out, t.out);
  s.lse_to_rows(w.lse, t.lse);
  // Each head's max_logit is whole on the rank that holds it: gathered in head order.
  if (t.max_logit) s.comm.all_gather(w.max_logit, t.max_logit, static_cast<size_t>(s.q_heads) * sizeof(float), stream);
  mark(Phase::kCount);
}

void CudaAllToAll::backward(const DeviceLayout& layout, const BackwardTensors& t, cudaStream_t stream,
                            const PhaseMark& mark) {
  State& s = *s_;
  const Problem& p = s.p;
  const Parts& w = s.w;
  const cuda::DeviceSegmentTable table = s.start(layout, stream, mark);
  const int64_t kv_heads = p.kv_heads / p.cp, dv = p.value_head_dim();
  BackwardTensors h{s.to_heads(t.q, w.q),
                    s.to_heads(t.k, w.k),
                    s.to_heads(t.v, w.v),
                    s.to_heads(t.out, w.out),
                    s.to_heads(t.dout, w.dout),
                    w.lse,
                    s.dense(w.dq, DType::kFloat32, s.q_heads, p.head_dim),
                    s.dense(w.dk, DType::kFloat32, kv_heads, p.head_dim),
                    s.dense(w.dv, DType::kFloat32, kv_heads, dv)};
  s.lse_to_heads(t.lse, w.lse);
  h.sinks = t.sinks ? t.sinks + s.comm.rank() * s.q_heads : nullptr;
  h.dsinks = t.dsinks ? w.dsinks : nullptr;
  mark(Phase::kAttention);
  s.backward->run(table, h, stream);
  mark(Phase::kReduce);
  s.to_rows(h.dq, t.dq);
  s.to_rows(h.dk, t.dk);
  s.to_rows(h.dv, t.dv);
  // Each head's d(sink) is whole on the rank that holds it: every rank gets the same bits.
  if (t.dsinks) s.comm.all_gather(w.dsinks, t.dsinks, static_cast<size_t>(s.q_heads) * sizeof(float), stream);
  mark(Phase::kCount);
}

}  // namespace thdcp::cp::detail
