// The CUDA step set of AllGather CP and the CudaPlan: host code that enqueues device work.
#include <algorithm>
#include <functional>
#include <optional>
#include <cstring>
#include <string>
#include <vector>

#include "a2a_ag_cuda.h"
#include "agreement.h"
#include "allgather_steps.h"
#include "alltoall_cuda.h"
#include "head_views.h"
#include "kv_ledger.h"
#include "window_cuda.h"
#include "thdcp/comm_device/nccl.h"
#include "thdcp/core/error.h"
#include "thdcp/cp/cuda.h"
#include "thdcp/cuda/check.h"
#include "thdcp/cuda/reorder.h"

namespace thdcp::cp {

namespace {

constexpr double kPlanExchangeTimeoutSeconds = 300;
constexpr int kMaxPhaseMarks = 64;
constexpr int kMaxTimelineMarks = 96;

using detail::Lane;
using detail::Ready;
using detail::SequenceGrads;
using detail::Slot;

int index_of(Slot slot) { return slot == Slot::kK ? 0 : 1; }

// The head dim of a slot's tensor: D_qk for K (and dK), D_v for V (and dV).
int64_t dim_of(const Problem& p, Slot slot) { return slot == Slot::kK ? p.head_dim : p.value_head_dim(); }

// The halo gather of the CUDA step set (kv_gather halo, or auto where it moves fewer rows):
// under the contiguous layout with a window on both sides, a rank's queries reach at most
// window_left rows before its piece and window_right rows after it; those edges come from its neighbours (an all-gather of every
// rank's edges), the mask alone fixes their size (so any batch of the capacity fits), and in
// the backward their dK/dV go back the same way and are added in rank order.
struct Edges {
  bool on = false;
  int64_t left = 0, right = 0;  // rows before and after the rank's piece
};

// auto takes the halo where it fits (the contiguous layout, a window on both sides) and moves
// fewer rows: every other rank's edges, (cp - 1)(left + right) rows, against the whole
// gather's (cp - 1) T/cp. The mask alone decides it, so every batch of the plan runs the same.
bool auto_takes_halo(const Problem& p) {
  return p.kv_gather == KvGather::kAuto && p.cp > 1 && p.comm == CpComm::kAllGather && p.head_slices == 1 &&
         p.layout == CpLayout::kContiguous && p.mask.window_left >= 0 && p.mask.window_right >= 0 &&
         int64_t{p.mask.window_left} + p.mask.window_right < p.local_rows();
}

Edges edges_of(const Problem& p) {
  Edges e;
  if (p.kv_gather != KvGather::kHalo && !auto_takes_halo(p)) return e;
  e.on = true;
  e.left = p.mask.window_left;
  e.right = p.mask.window_right;
  return e;
}

// What the CUDA halo gather takes; throws naming the value and the alternatives.
void check_halo(const Problem& p) {
  if (p.kv_gather != KvGather::kHalo) return;
  THDCP_CHECK(p.layout == CpLayout::kContiguous,
              "kv_gather=halo with layout=dual_chunk: the CUDA backend gathers a halo under the contiguous layout "
              "only; use layout=contiguous, kv_gather=auto or whole, or the CPU backend (cp::CpuPlan)");
  THDCP_CHECK(p.mask.window_left >= 0 && p.mask.window_right >= 0,
              "kv_gather=halo with window (" << p.mask.window_left << ", " << p.mask.window_right
                                             << "): the CUDA halo gather needs a window on both sides (a causal "
                                                "window is (W, 0)); use kv_gather=auto or whole");
  THDCP_CHECK(p.mask.window_left <= p.local_rows() && p.mask.window_right <= p.local_rows(),
              "kv_gather=halo with window (" << p.mask.window_left << ", " << p.mask.window_right << ") and "
                                             << p.local_rows()
                                             << " rows per rank: the CUDA halo gather takes its edges from the "
                                                "neighbouring ranks only, so each side must be at most the rows "
                                                "per rank; use kv_gather=whole, or fewer ranks");
}

// Rows of the K/V the attention reads: every row, or (halo) the rank's with its edges.
int64_t key_rows(const Problem& p) {
  const Edges e = edges_of(p);
  return e.on ? e.left + p.local_rows() + e.right : p.capacity.max_tokens;
}

// The rank's table (its shape and size are the same for every rank).
cuda::TablePlan table_plan(const Problem& p, int rank = 0) {
  const Edges e = edges_of(p);
  if (e.on) return cuda::TablePlan::contiguous_halo_cp(p.capacity, p.cp, rank, p.mask, e.left, e.right);
  return cuda::TablePlan::all_gather_cp(p.capacity, p.cp, rank, p.mask, p.layout);
}

// The gathered K/V in rank order are in sequence order already under the contiguous layout
// (rank r holds the r-th piece of the packed rows); the dual-chunk layout needs a reorder.
bool needs_reorder(const Problem& p) { return p.layout == CpLayout::kDualChunk; }

// Whether the K/V in sequence order are a buffer of their own: where the layout needs a
// reorder, and where the forward gathers slices of heads (each slice's gathered rows then go
// to its heads of that buffer).
bool sequence_copy(const Problem& p) { return needs_reorder(p) || p.head_slices > 1; }

// The attention of the rank's queries over the gathered keys; `slices`: of the heads (the
// forward's, Problem::head_slices).
cuda::AttentionShape attention_shape(const Problem& p, int slices = 1) {
  cuda::AttentionShape s;
  static_cast<HeadShape&>(s) = p.heads();
  s.q_heads /= slices;
  s.kv_heads /= slices;
  s.table = table_plan(p).table();
  s.dtype = p.dtype;
  s.dq_dtype = p.dtype;
  s.dkv_dtype = DType::kFloat32;  // partial sums of every gathered row, reduce-scattered in fp32
  return s;
}

// The parts of the workspace: the table, the rank-order rows of every key, the packed K/V
// (strided inputs), the gathered K/V in rank order and in sequence order ([T, Hkv, D] each;
// the last two only where the layout needs a reorder), the fp32 dK/dV of every gathered row
// and of the rank's rows, the attention plans' workspaces. `carver` without memory sizes the
// workspace.
struct Parts {
  Segment* segments = nullptr;
  int32_t* rank_rows = nullptr;
  unsigned char* packed[2] = {};
  unsigned char* gathered[2] = {};
  unsigned char* sequence[2] = {};
  float* grad_ranked[2] = {};
  float* grad_local = nullptr;
  float* sink_local = nullptr;  // [Hq]: d(sink) of this rank's query rows
  float* sink_parts = nullptr;  // [cp, Hq]: every rank's, all-gathered
  unsigned char* edges_send = nullptr;  // halo gathers: this rank's edges (K/V rows, or fp32 dK/dV)
  unsigned char* edges_recv = nullptr;  // every rank's
  unsigned char* narrow_ranked = nullptr;  // reduce_dtype below fp32: the partials of every row in it
  unsigned char* narrow_local = nullptr;   // and this rank's rows of their sum
  void* forward = nullptr;
  void* backward = nullptr;
  size_t forward_bytes = 0, backward_bytes = 0;
};

Parts carve_parts(WorkspaceCarver& carver, const Problem& p, const AttentionOptions& options) {
  detail::validate_problem(p);
  check_halo(p);
  Parts w;
  // Every K/V buffer has room for the wider of D_qk and D_v; the gathered ones for the key
  // rows: every row, or (halo) the rank's rows with their edges.
  const size_t row_elements = static_cast<size_t>(p.kv_heads * std::max(p.head_dim, p.value_head_dim()));
  const size_t local_elements = static_cast<size_t>(p.local_rows()) * row_elements;
  const size_t elements = static_cast<size_t>(key_rows(p)) * row_elements;
  w.segments = carver.take<Segment>(table_plan(p).workspace_size());
  const size_t reordered = needs_reorder(p) ? 1 : 0;
  w.rank_rows = carver.take_array<int32_t>(reordered * static_cast<size_t>(p.capacity.max_tokens));
  for (unsigned char*& part : w.packed) part = carver.take<unsigned char>(local_elements * dtype_size(p.dtype));
  for (unsigned char*& part : w.gathered) part = carver.take<unsigned char>(elements * dtype_size(p.dtype));
  const size_t sequence = sequence_copy(p) ? 1 : 0;
  for (unsigned char*& part : w.sequence) part = carver.take<unsigned char>(sequence * elements * dtype_size(p.dtype));
  // fp32 dK/dV of every gathered row, accumulated by the attention backward straight in rank
  // order (BackwardTensors::dkv_rows), so the reduce-scatter takes them as they are.
  for (float*& part : w.grad_ranked) part = carver.take_array<float>(elements);
  w.grad_local = carver.take_array<float>(local_elements);
  w.sink_local = carver.take_array<float>(static_cast<size_t>(p.q_heads));
  w.sink_parts = carver.take_array<float>(static_cast<size_t>(p.q_heads) * static_cast<size_t>(p.cp));
  const Edges e = edges_of(p);
  const size_t edge_bytes =
      static_cast<size_t>((e.left + e.right) * p.kv_heads * std::max(p.head_dim, p.value_head_dim())) * sizeof(float);
  w.edges_send = carver.take<unsigned char>(edge_bytes);
  w.edges_recv = carver.take<unsigned char>(edge_bytes * static_cast<size_t>(p.cp));
  // The whole gather's reduce-scatter in reduce_dtype (the halo's edges cross in fp32).
  const size_t narrow = p.reduce_dtype != DType::kFloat32 && !e.on ? dtype_size(p.reduce_dtype) : 0;
  w.narrow_ranked = carver.take<unsigned char>(elements * narrow);
  w.narrow_local = carver.take<unsigned char>(local_elements * narrow);
  w.forward_bytes = cuda::ForwardPlan::workspace_size(attention_shape(p, p.head_slices));
  w.backward_bytes = cuda::BackwardPlan::workspace_size(attention_shape(p), options);
  w.forward = carver.take(w.forward_bytes);
  w.backward = carver.take(w.backward_bytes);
  return w;
}

uint64_t options_fingerprint(const AttentionOptions& options) {
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &options.softmax_scale, sizeof(scale_bits));
  return (static_cast<uint64_t>(scale_bits) << 8) | (options.deterministic ? 1u : 0u);
}

}  // namespace

struct CudaPlan::Workspace {
  const void* base = nullptr;  // the caller's workspace: this plan's entry in the K/V ledger
  // A copy-engine communicator's window over the workspace (first: deregistered last).
  std::unique_ptr<DeviceCommunicator::Window> window;
  std::unique_ptr<detail::CudaAllToAll> all_to_all;  // comm all_to_all: the whole step; else null
  std::unique_ptr<detail::CudaA2aAg> a2a_ag;         // comm a2a+ag: the whole step; else null
  Parts parts;
  std::optional<cuda::TablePlan> table;  // this rank's
  std::unique_ptr<cuda::ForwardPlan> forward;
  std::unique_ptr<cuda::BackwardPlan> backward;
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

  // Subsequent work on `stream` belongs to `next` (a repeated phase adds no mark).
  void mark(Phase next, cudaStream_t stream) {
    if (recorded >= kMaxPhaseMarks) return;
    if (recorded > 0 && phases[recorded - 1] == next) return;
    phases[recorded] = next;
    THDCP_CHECK_CUDA(cudaEventRecord(marks[recorded++], stream));
  }
};

// A timeline's marks: each an event on the stream of a lane, where that lane's next phase
// starts (`close` false) or where the lane leaves its current phase (`close` true: it switches
// lanes, waits for the other, or the step ends).
struct CudaPlan::Timeline {
  struct Mark {
    Phase phase = Phase::kTable;
    bool collectives = false;
    bool close = false;
  };
  cudaEvent_t events[kMaxTimelineMarks] = {};
  Mark marks[kMaxTimelineMarks];
  int recorded = 0;

  Timeline() {
    for (cudaEvent_t& e : events) THDCP_CHECK_CUDA(cudaEventCreate(&e));
  }
  ~Timeline() {
    for (cudaEvent_t e : events) {
      if (e) cudaEventDestroy(e);
    }
  }
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Marks past the last event are dropped (the spans then end early, never wrongly).
  void record(cudaStream_t stream, Phase phase, bool collectives, bool close) {
    if (recorded >= kMaxTimelineMarks) return;
    marks[recorded] = Mark{phase, collectives, close};
    THDCP_CHECK_CUDA(cudaEventRecord(events[recorded++], stream));
  }
};

// The collectives lane: a stream of the highest priority, so that the block scheduler gives
// a collective's blocks the next free SMs while attention kernels fill the GPU, and the
// events that order the lanes (made at plan time; recorded and waited for, also inside a
// capture, by every step).
struct CudaPlan::Lanes {
  cudaStream_t collectives = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  cudaEvent_t ready[2] = {};  // [Ready]
  Lanes() {
    int least = 0, greatest = 0;
    THDCP_CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    THDCP_CHECK_CUDA(cudaStreamCreateWithPriority(&collectives, cudaStreamNonBlocking, greatest));
    for (cudaEvent_t* e : {&fork, &join}) THDCP_CHECK_CUDA(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    for (cudaEvent_t& e : ready) THDCP_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  ~Lanes() {
    for (cudaEvent_t e : {ready[0], ready[1], fork, join}) {
      if (e) cudaEventDestroy(e);
    }
    if (collectives) cudaStreamDestroy(collectives);
  }
  Lanes(const Lanes&) = delete;
  Lanes& operator=(const Lanes&) = delete;
};

namespace {

class CudaSteps {
 public:
  // With phase timing (`events`) every call enqueues on `stream` in program order, so each
  // phase's events bracket its own work; otherwise the collectives go to lanes.collectives.
  CudaSteps(DeviceCommunicator& comm, const Problem& problem, const CudaPlan::Workspace& w,
            const CudaPlan::Lanes& lanes, CudaPlan::Events* events, CudaPlan::Timeline* timeline,
            const DeviceLayout& layout, cudaStream_t stream)
      : comm_(comm),
        p_(problem),
        w_(w),
        lanes_(lanes),
        events_(events),
        timeline_(timeline),
        layout_(layout),
        stream_(stream),
        overlap_(events == nullptr),
        current_(stream),
        edges_(edges_of(problem)) {
    if (events_) events_->recorded = 0;
  }

  void fork() {
    if (!overlap_) return;
    THDCP_CHECK_CUDA(cudaEventRecord(lanes_.fork, stream_));
    THDCP_CHECK_CUDA(cudaStreamWaitEvent(lanes_.collectives, lanes_.fork, 0));
  }

  void join() {
    if (!overlap_) return;
    if (timeline_) timeline_->record(lanes_.collectives, Phase::kCount, true, true);
    THDCP_CHECK_CUDA(cudaEventRecord(lanes_.join, lanes_.collectives));
    THDCP_CHECK_CUDA(cudaStreamWaitEvent(stream_, lanes_.join, 0));
  }

  void use(Lane lane) {
    if (timeline_ && lane != lane_) close_lane();
    lane_ = lane;
    current_ = overlap_ && lane == Lane::kCollectives ? lanes_.collectives : stream_;
  }

  void signal(Ready what) {
    if (overlap_) THDCP_CHECK_CUDA(cudaEventRecord(ready(what), current_));
  }

  void await(Ready what) {
    if (timeline_) close_lane();  // what the lane did before it waits
    if (overlap_) THDCP_CHECK_CUDA(cudaStreamWaitEvent(current_, ready(what), 0));
  }

  void phase(Phase next) {
    if (events_) events_->mark(next, current_);
    if (timeline_) timeline_->record(current_, next, lane_ == Lane::kCollectives, next == Phase::kCount);
  }

  void build_table() { table_ = w_.table->run(layout_, w_.parts.segments, current_); }

  // `local`: this rank's K or V, any view, packed into dense rows in the workspace first
  // unless it is contiguous: with one 2-D copy where the heads of a row are adjacent (views
  // of a packed QKV), else by cuda::pack_rows (head-major views, padded heads).
  ConstThdTensor gather(const ConstThdTensor& local, Slot slot) {
    const int i = index_of(slot);
    const size_t row_bytes = local.row_bytes();
    const size_t local_bytes = static_cast<size_t>(local.tokens) * row_bytes;
    const void* send = local.data;
    if (!local.contiguous() && local.numel() > 0) {
      unsigned char* packed = w_.parts.packed[i];
      const bool adjacent_heads = (local.heads == 1 || local.head_step() == local.head_dim) &&
                                  (local.tokens == 1 || local.row_step() >= local.heads * local.head_dim);
      if (adjacent_heads) {
        const size_t pitch = local.tokens == 1 ? row_bytes : static_cast<size_t>(local.row_step()) * dtype_size(local.dtype);
        THDCP_CHECK_CUDA(cudaMemcpy2DAsync(packed, row_bytes, local.data, pitch, row_bytes,
                                           static_cast<size_t>(local.tokens), cudaMemcpyDeviceToDevice, current_));
      } else {
        cuda::pack_rows(local, packed, current_);
      }
      send = packed;
    }
    unsigned char* gathered = w_.parts.gathered[i];
    if (edges_.on) return gather_edges(static_cast<const unsigned char*>(send), local, gathered);
    comm_.all_gather(send, gathered, local_bytes, current_);
    return ConstThdTensor(gathered, local.dtype, local.tokens * p_.cp, local.heads, local.head_dim);
  }

  // The halo gather: this rank's rows (dense at `own`) between its left and right edges, the
  // neighbours' rows from an all-gather of every rank's edges (its first `right` rows, which
  // are the previous rank's right edge, and its last `left` rows, the next rank's left edge).
  // The first rank's left edge and the last rank's right edge stay unread (no query reaches
  // them).
  ConstThdTensor gather_edges(const unsigned char* own, const ConstThdTensor& local, unsigned char* keys) {
    const size_t row = local.row_bytes();
    const int64_t rows = local.tokens, left = edges_.left, right = edges_.right;
    const int rank = comm_.rank();
    copy(keys + static_cast<size_t>(left) * row, own, static_cast<size_t>(rows) * row);
    copy(w_.parts.edges_send, own, static_cast<size_t>(right) * row);
    copy(w_.parts.edges_send + static_cast<size_t>(right) * row, own + static_cast<size_t>(rows - left) * row,
         static_cast<size_t>(left) * row);
    const size_t block = static_cast<size_t>(left + right) * row;
    comm_.all_gather(w_.parts.edges_send, w_.parts.edges_recv, block, current_);
    if (rank > 0) {
      copy(keys, w_.parts.edges_recv + static_cast<size_t>(rank - 1) * block + static_cast<size_t>(right) * row,
           static_cast<size_t>(left) * row);
    }
    if (rank + 1 < p_.cp) {
      copy(keys + static_cast<size_t>(left + rows) * row, w_.parts.edges_recv + static_cast<size_t>(rank + 1) * block,
           static_cast<size_t>(right) * row);
    }
    return ConstThdTensor(keys, local.dtype, key_rows(p_), local.heads, local.head_dim);
  }

  void copy(void* to, const void* from, size_t bytes) {
    if (bytes > 0) THDCP_CHECK_CUDA(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, current_));
  }

  // `gathered` holds the heads [first_head, first_head + gathered.heads) of every row; the
  // view returned is those heads of sequence_order(slot).
  ConstThdTensor to_sequence_order(const ConstThdTensor& gathered, Slot slot, int64_t first_head) {
    const ConstThdTensor whole = sequence_order(slot);
    const ConstThdTensor ordered = detail::heads_of(whole, first_head, gathered.heads);
    void* into = const_cast<void*>(ordered.data);
    if (needs_reorder(p_)) {
      cuda::gathered_to_sequence_order(gathered.data, into, gathered.row_bytes(), layout_, p_.cp, current_,
                                       whole.row_bytes());
    } else if (sequence_copy(p_) && gathered.numel() > 0) {  // rows in order already: the heads into place
      THDCP_CHECK_CUDA(cudaMemcpy2DAsync(into, whole.row_bytes(), gathered.data, gathered.row_bytes(),
                                         gathered.row_bytes(), static_cast<size_t>(gathered.tokens),
                                         cudaMemcpyDeviceToDevice, current_));
    }
    return ordered;
  }

  // The K or V in sequence order: its own buffer (sequence_copy), or (contiguous, every head
  // at once) the gathered rows.
  ConstThdTensor sequence_order(Slot slot) const {
    const int i = index_of(slot);
    return ConstThdTensor(sequence_copy(p_) ? w_.parts.sequence[i] : w_.parts.gathered[i], p_.dtype, key_rows(p_),
                          p_.kv_heads, dim_of(p_, slot));
  }

  // Attention sinks of this step (null: none). A rank's query rows see every gathered key
  // they may see, so each row's softmax is whole here and counts its head's sink once; the
  // key pass writes the d(sink) of this rank's rows into the workspace (sink_local).
  void use_sinks(const float* sinks, bool gradient) {
    sinks_ = sinks;
    sink_gradient_ = gradient;
  }

  void attention_forward(const ConstThdTensor& q, const ConstThdTensor& k, const ConstThdTensor& v, ThdTensor out,
                         float* lse, float* max_logit, int64_t first_q_head) {
    const float* sinks = sinks_ ? sinks_ + first_q_head : nullptr;
    w_.forward->run(table_, ForwardTensors{q, k, v, out, lse, max_logit, sinks}, current_);
  }

  void max_reduce(float* max_logit, size_t count) { comm_.all_reduce_max(max_logit, count, current_); }

  SequenceGrads attention_backward_keys(const ConstThdTensor& q, const ConstThdTensor& k, const ConstThdTensor& v,
                                        const ConstThdTensor& out, const ConstThdTensor& dout, const float* lse,
                                        ThdTensor dq) {
    // Each key row's gradient goes to its rank-order row: a map under the dual-chunk layout,
    // the same row under the contiguous one.
    int32_t* rank_rows = needs_reorder(p_) ? w_.parts.rank_rows : nullptr;
    if (rank_rows) cuda::gathered_rows_of_sequence(layout_, p_.cp, rank_rows, current_);
    const SequenceGrads grads{fp32(w_.parts.grad_ranked[0], key_rows(p_), Slot::kK),
                              fp32(w_.parts.grad_ranked[1], key_rows(p_), Slot::kV)};
    backward_ = BackwardTensors{q, k, v, out, dout, lse, dq, grads.dk, grads.dv};
    backward_.dkv_rows = rank_rows;
    backward_.sinks = sinks_;
    backward_.dsinks = sink_gradient_ ? w_.parts.sink_local : nullptr;
    w_.backward->run_keys(table_, backward_, current_);
    return grads;
  }

  void attention_backward_queries() {
    w_.backward->run_queries(table_, backward_, current_);
  }

  // attention_backward_keys already accumulated the gradients in rank order.
  ThdTensor to_rank_order(const ThdTensor& grads, Slot) { return grads; }

  // One buffer serves both of K and V: the collectives lane reduces and casts them one after
  // the other.
  ThdTensor reduce_scatter(const ThdTensor& ranked, Slot slot) {
    const ThdTensor local = fp32(w_.parts.grad_local, p_.local_rows(), slot);
    if (edges_.on) {
      return_edges(static_cast<const float*>(ranked.data), local);
      return local;
    }
    if (p_.reduce_dtype != DType::kFloat32) {
      // Each partial rounded once to reduce_dtype, summed in it, widened (exactly) for the cast.
      cuda::convert_from_fp32(static_cast<const float*>(ranked.data), w_.parts.narrow_ranked, p_.reduce_dtype,
                              ranked.numel(), current_);
      comm_.reduce_scatter_sum(w_.parts.narrow_ranked, w_.parts.narrow_local, static_cast<size_t>(local.numel()),
                               p_.reduce_dtype, current_);
      cuda::convert_to_fp32(w_.parts.narrow_local, p_.reduce_dtype, static_cast<float*>(local.data), local.numel(),
                            current_);
      return local;
    }
    comm_.reduce_scatter_sum(static_cast<const float*>(ranked.data), static_cast<float*>(local.data),
                             static_cast<size_t>(local.numel()), current_);
    return local;
  }

  // The halo gather's backward: this rank's rows of `keyed` (fp32 dK or dV of its key rows:
  // left edge, own rows, right edge) into `local`, plus what its neighbours hold for its
  // rows (the previous rank's right edge, the next rank's left edge), all-gathered and added
  // in rank order: (previous + own) + next.
  void return_edges(const float* keyed, const ThdTensor& local) {
    const int64_t width = local.heads * local.head_dim;  // floats per row
    const int64_t rows = local.tokens, left = edges_.left, right = edges_.right;
    const int rank = comm_.rank();
    auto* out = static_cast<float*>(local.data);
    auto* send = reinterpret_cast<float*>(w_.parts.edges_send);
    const auto* recv = reinterpret_cast<const float*>(w_.parts.edges_recv);
    const size_t row = static_cast<size_t>(width) * sizeof(float);
    copy(out, keyed + left * width, static_cast<size_t>(rows) * row);
    copy(send, keyed, static_cast<size_t>(left) * row);
    copy(send + left * width, keyed + (left + rows) * width, static_cast<size_t>(right) * row);
    const int64_t block = (left + right) * width;
    comm_.all_gather(send, w_.parts.edges_recv, static_cast<size_t>(block) * sizeof(float), current_);
    if (rank > 0) cuda::accumulate(recv + (rank - 1) * block + left * width, out, right * width, true, current_);
    if (rank + 1 < p_.cp) {
      cuda::accumulate(recv + (rank + 1) * block, out + (rows - left) * width, left * width, false, current_);
    }
  }

  void cast(const ThdTensor& local, ThdTensor grad) {
    if (grad.contiguous()) {
      cuda::convert_from_fp32(static_cast<const float*>(local.data), grad.data, grad.dtype, local.numel(), current_);
    } else {
      cuda::convert_from_fp32(static_cast<const float*>(local.data), grad, current_);
    }
  }

 private:
  ThdTensor fp32(float* data, int64_t rows, Slot slot) const {
    return ThdTensor{data, DType::kFloat32, rows, p_.kv_heads, dim_of(p_, slot)};
  }

  cudaEvent_t ready(Ready what) const { return lanes_.ready[what == Ready::kKv ? 0 : 1]; }

  void close_lane() { timeline_->record(current_, Phase::kCount, lane_ == Lane::kCollectives, true); }

  DeviceCommunicator& comm_;
  const Problem& p_;
  const CudaPlan::Workspace& w_;
  const CudaPlan::Lanes& lanes_;
  CudaPlan::Events* events_;
  CudaPlan::Timeline* timeline_;
  Lane lane_ = Lane::kCompute;
  DeviceLayout layout_;
  cudaStream_t stream_;
  bool overlap_;
  cudaStream_t current_;
  Edges edges_;  // the halo gather's (off: the whole gather)
  cuda::DeviceSegmentTable table_;
  BackwardTensors backward_;  // the key pass's, for the query pass
  const float* sinks_ = nullptr;
  bool sink_gradient_ = false;
};

void check_layout(const DeviceLayout& layout, const Problem& p) {
  THDCP_CHECK(layout.cu_seqlens != nullptr && layout.cu_seqlens_padded != nullptr,
              "layout.cu_seqlens and layout.cu_seqlens_padded must be device arrays of max_seqs + 1 int32 entries");
  THDCP_CHECK(reinterpret_cast<uintptr_t>(layout.cu_seqlens) % alignof(int32_t) == 0 &&
                  reinterpret_cast<uintptr_t>(layout.cu_seqlens_padded) % alignof(int32_t) == 0,
              "layout arrays must be 4-byte aligned int32 arrays");
  THDCP_CHECK(layout.capacity.max_seqs == p.capacity.max_seqs && layout.capacity.max_tokens == p.capacity.max_tokens,
              "layout.capacity (max_seqs=" << layout.capacity.max_seqs << ", max_tokens=" << layout.capacity.max_tokens
                                           << ") differs from the plan's (max_seqs=" << p.capacity.max_seqs
                                           << ", max_tokens=" << p.capacity.max_tokens
                                           << "): pass the global layout in the plan's capacity form");
}

// Host arithmetic only: what every step checks against the plan (shapes, dtypes, strides,
// overlap), and what the CUDA step set needs besides: dsinks with sinks, and dk/dv of one
// dtype. K/V of any strides are packed before the gather; q, out, dout and dq meet the
// attention plans' checks.
void check_forward_tensors(const Problem& p, const ForwardTensors& t) { detail::check_forward_tensors(p, t); }

void check_backward_tensors(const Problem& p, const BackwardTensors& t) {
  detail::check_backward_tensors(p, t);
  THDCP_CHECK(t.dsinks == nullptr || t.sinks != nullptr,
              "dsinks is set but sinks is null: pass the forward's sinks to get their gradient");
  THDCP_CHECK(t.dv.dtype == t.dk.dtype, "dk has dtype " << dtype_name(t.dk.dtype) << " but dv has "
                                                        << dtype_name(t.dv.dtype) << ": pass both in one dtype");
  // dq is whole on each rank (no reduction), written by the attention in the problem's dtype;
  // only all_to_all's exchange rounds it from fp32 on the way back and so takes either.
  THDCP_CHECK(t.dq.dtype == p.dtype || p.comm == CpComm::kAllToAll,
              "dq has dtype " << dtype_name(t.dq.dtype) << " but the CUDA " << cp_comm_name(p.comm)
                              << " CP writes dq in " << dtype_name(p.dtype)
                              << ": pass dq in the problem's dtype, or use cp_comm all_to_all or the CPU backend "
                                 "for an fp32 dq");
}

}  // namespace

size_t cuda_workspace_size(const Problem& problem, const AttentionOptions& options) {
  if (problem.comm == CpComm::kAllToAll) {
    detail::validate_problem(problem);
    return detail::CudaAllToAll::workspace_size(problem, options);
  }
  if (problem.comm == CpComm::kA2aAg) {
    detail::validate_problem(problem);
    return detail::CudaA2aAg::workspace_size(problem, options);
  }
  WorkspaceCarver sizing;
  carve_parts(sizing, problem, options);
  return sizing.bytes();
}

namespace {

// The cross-rank check over a device communicator: a small buffer and a stream of its own,
// waited for on the host. Plan time only.
void agree_on_device(DeviceCommunicator& comm, const Problem& problem, const AttentionOptions& options,
                     const std::function<void()>& local_checks) {
  detail::AgreementInput in;
  in.problem = problem;
  in.rank = comm.rank();
  in.size = comm.size();
  in.options_fingerprint = options_fingerprint(options);
  int device = -1;
  THDCP_CHECK_CUDA(cudaGetDevice(&device));
  THDCP_CHECK(device == comm.device(), "the current device is " << device << " but the communicator's rank "
                                                                << comm.rank() << " uses device " << comm.device()
                                                                << ": call cudaSetDevice(" << comm.device() << ")");
  cudaStream_t stream = nullptr;
  THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* buffer = nullptr;
  try {
    detail::agree(in, local_checks, [&](const void* send, void* recv, size_t bytes) {
      THDCP_CHECK_CUDA(cudaMalloc(&buffer, bytes * static_cast<size_t>(comm.size() + 1)));
      auto* device_send = static_cast<unsigned char*>(buffer);
      unsigned char* device_recv = device_send + bytes;
      THDCP_CHECK_CUDA(cudaMemcpyAsync(device_send, send, bytes, cudaMemcpyHostToDevice, stream));
      comm.all_gather(device_send, device_recv, bytes, stream);
      THDCP_CHECK_CUDA(cudaMemcpyAsync(recv, device_recv, bytes * static_cast<size_t>(comm.size()),
                                       cudaMemcpyDeviceToHost, stream));
      comm.synchronize(stream, kPlanExchangeTimeoutSeconds);
    });
  } catch (...) {
    if (buffer) cudaFree(buffer);
    cudaStreamDestroy(stream);
    throw;
  }
  cudaFree(buffer);
  THDCP_CHECK_CUDA(cudaStreamDestroy(stream));
}

// `pointer` is device memory of `device`; null where the tensor may be absent is the run
// checks' business.
void check_on_device(const char* name, const void* pointer, int device) {
  if (pointer != nullptr) cuda::check_device_pointer(name, pointer, device, 1);
}

}  // namespace

CudaPlan::CudaPlan(DeviceCommunicator& comm, const Problem& problem, const AttentionOptions& options, void* workspace,
                   size_t workspace_bytes)
    : comm_(comm), problem_(problem), options_(options), workspace_(std::make_unique<Workspace>()) {
  agree_on_device(comm, problem, options, [&] {
    THDCP_CHECK(problem.cp == comm.size(),
                "problem.cp=" << problem.cp << " but the communicator has " << comm.size() << " ranks");
    check_halo(problem);
    const size_t needed = cuda_workspace_size(problem, options);
    THDCP_CHECK(workspace_bytes >= needed,
                "workspace has " << workspace_bytes << " bytes; cuda_workspace_size gives " << needed);
    if (problem.comm == CpComm::kA2aAg) return;  // made below, once every rank agreed: it splits `comm`
    if (problem.comm == CpComm::kAllToAll) {
      workspace_->all_to_all =
          std::make_unique<detail::CudaAllToAll>(comm, problem, options, workspace, workspace_bytes);
      return;
    }
    WorkspaceCarver carver(workspace);
    workspace_->parts = carve_parts(carver, problem, options);
    workspace_->table = table_plan(problem, comm.rank());
    const Parts& parts = workspace_->parts;
    // The attention plans check dtype, head dim, kernel family and their workspaces.
    workspace_->forward = std::make_unique<cuda::ForwardPlan>(attention_shape(problem, problem.head_slices), options,
                                                              parts.forward, parts.forward_bytes);
    workspace_->backward =
        std::make_unique<cuda::BackwardPlan>(attention_shape(problem), options, parts.backward, parts.backward_bytes);
  });
  if (problem.comm == CpComm::kA2aAg) {
    // Its groups' communicators make their own windows.
    workspace_->a2a_ag = std::make_unique<detail::CudaA2aAg>(comm, problem, options, workspace, workspace_bytes);
  } else {
    workspace_->window = detail::workspace_window(comm, workspace, workspace_bytes);
  }
  lanes_ = std::make_unique<Lanes>();
  workspace_->base = workspace;
  detail::ledger_enter(workspace);
}

void CudaPlan::check_tensors(const DeviceLayout& layout, const ForwardTensors* forward,
                             const BackwardTensors* backward) const {
  agree_on_device(comm_, problem_, options_, [&] {
    const int device = comm_.device();
    check_layout(layout, problem_);
    check_on_device("layout.cu_seqlens", layout.cu_seqlens, device);
    check_on_device("layout.cu_seqlens_padded", layout.cu_seqlens_padded, device);
    if (forward) {
      check_forward_tensors(problem_, *forward);
      for (auto [name, pointer] : {std::make_pair("q", forward->q.data), std::make_pair("k", forward->k.data),
                                   std::make_pair("v", forward->v.data),
                                   std::make_pair("out", static_cast<const void*>(forward->out.data)),
                                   std::make_pair("lse", static_cast<const void*>(forward->lse)),
                                   std::make_pair("max_logit", static_cast<const void*>(forward->max_logit)),
                                   std::make_pair("sinks", static_cast<const void*>(forward->sinks))}) {
        check_on_device(name, pointer, device);
      }
    }
    if (backward) {
      check_backward_tensors(problem_, *backward);
      for (auto [name, pointer] :
           {std::make_pair("q", backward->q.data), std::make_pair("k", backward->k.data),
            std::make_pair("v", backward->v.data), std::make_pair("out", backward->out.data),
            std::make_pair("dout", backward->dout.data), std::make_pair("lse", static_cast<const void*>(backward->lse)),
            std::make_pair("dq", static_cast<const void*>(backward->dq.data)),
            std::make_pair("dk", static_cast<const void*>(backward->dk.data)),
            std::make_pair("dv", static_cast<const void*>(backward->dv.data)),
            std::make_pair("sinks", static_cast<const void*>(backward->sinks)),
            std::make_pair("dsinks", static_cast<const void*>(backward->dsinks))}) {
        check_on_device(name, pointer, device);
      }
    }
  });
}

CudaPlan::~CudaPlan() {
  if (workspace_ && workspace_->base) detail::ledger_leave(workspace_->base);
}

std::shared_ptr<void> cuda_workspace_memory(const DeviceCommunicator& comm, size_t bytes) {
  if (comm.wants_windows()) return nccl::window_memory(bytes);
  void* data = nullptr;
  THDCP_CHECK_CUDA(cudaMalloc(&data, std::max<size_t>(bytes, 1)));
  return std::shared_ptr<void>(data, [](void* p) { (void)cudaFree(p); });
}

namespace {

// The phase marks of an all-to-all step: events where timing is on, else nothing.
detail::PhaseMark phase_marks(CudaPlan::Events* events, cudaStream_t stream) {
  return [events, stream](Phase next) {
    if (events) {
      if (next == Phase::kTable) events->recorded = 0;
      events->mark(next, stream);
    }
  };
}

}  // namespace

void CudaPlan::forward(const DeviceLayout& layout, const ForwardTensors& t, cudaStream_t stream) {
  check_layout(layout, problem_);
  check_forward_tensors(problem_, t);
  detail::ledger_forward(workspace_->base, detail::stamp_of(this, layout, t, stream));
  if (workspace_->all_to_all) {
    workspace_->all_to_all->forward(layout, t, stream, phase_marks(events_.get(), stream));
    return;
  }
  if (workspace_->a2a_ag) {
    workspace_->a2a_ag->forward(layout, t, stream, phase_marks(events_.get(), stream));
    return;
  }
  CudaSteps steps(comm_, problem_, *workspace_, *lanes_, events_.get(), timeline_.get(), layout, stream);
  steps.use_sinks(t.sinks, false);
  detail::run_forward(steps, t, problem_.head_slices);
}

void CudaPlan::backward(const DeviceLayout& layout, const BackwardTensors& t, cudaStream_t stream, KvSource kv) {
  check_layout(layout, problem_);
  check_backward_tensors(problem_, t);
  const bool forward_kept = detail::ledger_backward(workspace_->base, detail::stamp_of(this, layout, t, stream));
  if (kv == KvSource::kAuto) kv = forward_kept ? KvSource::kFromForward : KvSource::kGather;
  if (workspace_->all_to_all) {
    workspace_->all_to_all->backward(layout, t, stream, kv, phase_marks(events_.get(), stream));
    return;
  }
  if (workspace_->a2a_ag) {
    workspace_->a2a_ag->backward(layout, t, stream, kv, phase_marks(events_.get(), stream));
    return;
  }
  CudaSteps steps(comm_, problem_, *workspace_, *lanes_, events_.get(), timeline_.get(), layout, stream);
  steps.use_sinks(t.sinks, t.dsinks != nullptr);
  detail::run_backward(steps, t, kv == KvSource::kGather);
  if (t.dsinks) {
    // Each rank's d(sink) covers its own query rows; the whole is their sum in rank order on
    // every rank (an all-gather, not a reduction of unspecified order): the same bits on
    // every rank and run, as CpuPlan gives.
    const Parts& parts = workspace_->parts;
    comm_.all_gather(parts.sink_local, parts.sink_parts, sizeof(float) * static_cast<size_t>(problem_.q_heads), stream);
    cuda::sum_rank_parts(parts.sink_parts, problem_.cp, problem_.q_heads, t.dsinks, stream);
  }
}

KvGather CudaPlan::kv_gather() const {
  if (workspace_->a2a_ag) return workspace_->a2a_ag->kv_gather();
  return edges_of(problem_).on ? KvGather::kHalo : KvGather::kWhole;
}

void CudaPlan::enable_phase_timing() {
  if (events_) return;
  events_ = std::make_unique<Events>();
  for (cudaEvent_t& e : events_->marks) THDCP_CHECK_CUDA(cudaEventCreate(&e));
}

void CudaPlan::enable_timeline() {
  if (!timeline_) timeline_ = std::make_unique<Timeline>();
  timeline_->recorded = 0;
}

void CudaPlan::clear_timeline() {
  if (timeline_) timeline_->recorded = 0;
}

void CudaPlan::disable_timeline() { timeline_.reset(); }

std::vector<TimelineSpan> CudaPlan::timeline() const {
  std::vector<TimelineSpan> spans;
  if (!timeline_ || timeline_->recorded == 0) return spans;
  const Timeline& t = *timeline_;
  const auto ms_of = [&](int i) {
    float ms = 0;
    THDCP_CHECK_CUDA(cudaEventElapsedTime(&ms, t.events[0], t.events[i]));
    return static_cast<double>(ms);
  };
  for (const bool collectives : {false, true}) {
    int open = -1;  // the mark that opened the lane's current span
    for (int i = 0; i < t.recorded; ++i) {
      const Timeline::Mark& m = t.marks[i];
      if (m.collectives != collectives) continue;
      // A phase marked again where it already runs goes on in the same span.
      if (!m.close && open >= 0 && t.marks[open].phase == m.phase) continue;
      if (open >= 0) {
        spans.push_back(TimelineSpan{t.marks[open].phase, collectives, ms_of(open), ms_of(i)});
        open = -1;
      }
      if (!m.close) open = i;
    }
  }
  std::sort(spans.begin(), spans.end(),
            [](const TimelineSpan& a, const TimelineSpan& b) { return a.start_ms < b.start_ms; });
  return spans;
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
