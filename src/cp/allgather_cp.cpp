// The CPU step set of AllGather CP, the CpuPlan (which runs all-to-all CP from
// alltoall_cpu.cpp) and the one-shot calls.
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "a2a_ag_cpu.h"
#include "agreement.h"
#include "allgather_steps.h"
#include "alltoall_cpu.h"
#include "halo_exchange.h"
#include "phase_clock.h"
#include "thdcp/core/error.h"
#include "thdcp/cp/cp.h"
#include "thdcp/plan/rank_split.h"
#include "thdcp/plan/segment_table.h"

namespace thdcp::cp {

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kTable: return "table";
    case Phase::kGather: return "gather";
    case Phase::kReorder: return "reorder";
    case Phase::kAttention: return "attention";
    case Phase::kReduce: return "reduce";
    case Phase::kCast: return "cast";
    case Phase::kCount: break;
  }
  return "?";
}

const char* cp_comm_name(CpComm comm) {
  switch (comm) {
    case CpComm::kAllGather: return "all_gather";
    case CpComm::kAllToAll: return "all_to_all";
    case CpComm::kA2aAg: return "a2a+ag";
  }
  return "?";
}

const char* kv_gather_name(KvGather gather) {
  switch (gather) {
    case KvGather::kAuto: return "auto";
    case KvGather::kWhole: return "whole";
    case KvGather::kHalo: return "halo";
  }
  return "?";
}

double Timings::total() const {
  double sum = 0;
  for (double s : seconds) sum += s;
  return sum;
}

// Host buffers of a plan, sized by its capacity once.
struct CpuPlan::Buffers {
  std::vector<unsigned char> packed[2];                 // K, V: a strided local view's rows, dense (sized on first use)
  std::vector<unsigned char> gathered[2], sequence[2];  // K, V: rank order, sequence order
  std::vector<float> grad_seq[2], grad_ranked[2], grad_local[2];
  std::vector<unsigned char> halo_send[2];  // halo gathers: the rows this rank sends (grown on use)
  std::vector<float> halo_returned[2];      // halo gathers: the dK/dV rows the others return
  detail::AllToAllBuffers all_to_all;
  std::unique_ptr<detail::A2aAgCpu> a2a_ag;  // comm=a2a+ag: its groups and AllGather plan
};

struct CpuPlan::OneShot {
  uint64_t layout_fingerprint = 0;
  int64_t local_rows[3] = {};
  std::function<void()> local_checks;
};

namespace {

using Clock = std::chrono::steady_clock;
using detail::SequenceGrads;
using detail::Slot;

int index_of(Slot slot) { return slot == Slot::kK ? 0 : 1; }

// Elements of the whole batch's K (slot 0: D_qk) or V (slot 1: D_v) at the plan's capacity.
size_t slot_elements(const Problem& p, int slot) {
  const int64_t dim = slot == 0 ? p.head_dim : p.value_head_dim();
  return static_cast<size_t>(p.capacity.max_tokens * p.kv_heads * dim);
}

uint64_t options_fingerprint(const AttentionOptions& options) {
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &options.softmax_scale, sizeof(scale_bits));
  return (static_cast<uint64_t>(scale_bits) << 8) | static_cast<uint64_t>(options.accumulate);
}

// The halo exchange a step of `layout` runs, or none (the whole gather): kv_gather halo, or
// auto where the halo rows of every rank add up to fewer than the whole gather's. Both moves
// of a step (K/V out, dK/dV back) carry those rows, so fewer rows is fewer bytes both ways.
std::optional<detail::HaloExchange> halo_for(const LayoutView& layout, const Problem& p, int rank) {
  // Head slices gather the whole K/V, a slice of heads at a time (kv_gather=halo with
  // head_slices > 1 is refused when the plan is made).
  if (p.comm != CpComm::kAllGather || p.kv_gather == KvGather::kWhole || p.head_slices > 1) return std::nullopt;
  detail::HaloExchange halo(layout, p, rank);
  const int64_t whole = static_cast<int64_t>(p.cp) * (p.cp - 1) * p.local_rows();
  if (p.kv_gather == KvGather::kAuto && halo.total_halo_rows() >= whole) return std::nullopt;
  return halo;
}

// The CPU step set. With a halo exchange (kv_gather), gather brings this rank's rows and its
// halo instead of every rank's, and reduce_scatter returns the halo's dK/dV to their ranks;
// the segment table and the sequence-order buffers are the whole gather's either way.
class CpuSteps {
 public:
  CpuSteps(Communicator& comm, const Problem& problem, const AttentionOptions& options, CpuPlan::Buffers& buffers,
           const LayoutView& layout, Timings* timings)
      : comm_(comm), p_(problem), options_(options), b_(buffers), layout_(layout), clock_(timings) {}

  // Everything runs in program order on the calling thread: one lane.
  void fork() {}
  void join() {}
  void use(detail::Lane) {}
  void signal(detail::Ready) {}
  void await(detail::Ready) {}

  void phase(Phase next) { clock_.phase(next); }

  void build_table() {
    table_ = build_cp_segment_table(layout_, p_.cp, comm_.rank(), p_.mask, p_.layout);
    maps_.clear();
    for (int r = 0; r < p_.cp; ++r) maps_.push_back(rank_row_map(layout_, p_.cp, r, p_.layout));
    halo_ = halo_for(layout_, p_, comm_.rank());
  }

  // `local`: this rank's K or V, any view; a strided one is packed into dense rows first.
  ConstThdTensor gather(const ConstThdTensor& local, Slot slot) {
    std::vector<unsigned char>& gathered = b_.gathered[index_of(slot)];
    const size_t local_bytes = static_cast<size_t>(local.tokens) * local.row_bytes();
    const void* send = local.data;
    if (!local.contiguous()) {
      std::vector<unsigned char>& packed = b_.packed[index_of(slot)];
      packed.resize(local_bytes);  // once: the local rows are fixed by the plan
      pack(local, packed.data());
      send = packed.data();
    }
    if (halo_) {
      halo_->gather(comm_, static_cast<const unsigned char*>(send), local.row_bytes(), b_.halo_send[index_of(slot)],
                    gathered.data());
      return ConstThdTensor(gathered.data(), local.dtype, local.tokens + halo_->halo_rows(comm_.rank()), local.heads,
                            local.head_dim);
    }
    comm_.all_gather(send, gathered.data(), local_bytes);
    return ConstThdTensor(gathered.data(), local.dtype, local.tokens * p_.cp, local.heads, local.head_dim);
  }

  // `gathered` holds the heads [first_head, first_head + gathered.heads) of every row.
  ConstThdTensor to_sequence_order(const ConstThdTensor& gathered, Slot slot, int64_t first_head) {
    std::vector<unsigned char>& ordered = b_.sequence[index_of(slot)];
    const size_t row_bytes = gathered.row_bytes();
    if (halo_) {  // every head at once (no slices with a halo)
      halo_->to_sequence_order(static_cast<const unsigned char*>(gathered.data), row_bytes,
                               maps_[static_cast<size_t>(comm_.rank())], ordered.data());
      return sequence_order(slot);
    }
    const ConstThdTensor whole = sequence_order(slot);
    const size_t pitch = whole.row_bytes();
    const size_t offset = static_cast<size_t>(first_head * gathered.head_dim) * dtype_size(gathered.dtype);
    const auto* src = static_cast<const unsigned char*>(gathered.data);
    for (int r = 0; r < p_.cp; ++r) {
      const std::vector<int32_t>& map = maps_[static_cast<size_t>(r)];
      const unsigned char* rows = src + static_cast<size_t>(r * p_.local_rows()) * row_bytes;
      for (size_t i = 0; i < map.size(); ++i) {
        std::memcpy(ordered.data() + static_cast<size_t>(map[i]) * pitch + offset, rows + i * row_bytes, row_bytes);
      }
    }
    return detail::heads_of(whole, first_head, gathered.heads);
  }

  ConstThdTensor sequence_order(Slot slot) const {
    return ConstThdTensor(b_.sequence[index_of(slot)].data(), p_.dtype, p_.capacity.max_tokens, p_.kv_heads,
                          slot == Slot::kK ? p_.head_dim : p_.value_head_dim());
  }

  // Attention sinks of this step (null: none). A rank's query rows see every key they may
  // see (the gathered K/V), so each row's softmax is complete here and counts its head's sink
  // once: there is no merge of partial rows across ranks that could count it twice.
  void use_sinks(const float* sinks, float* dsinks) {
    sinks_ = sinks;
    dsinks_ = dsinks;
  }

  void attention_forward(const ConstThdTensor& q, const ConstThdTensor& k, const ConstThdTensor& v, ThdTensor out,
                         float* lse, float* max_logit, int64_t first_q_head) {
    const float* sinks = sinks_ ? sinks_ + first_q_head : nullptr;
    cpu::attention_forward(table_, ForwardTensors{q, k, v, out, lse, max_logit, sinks}, options_);
  }

  void max_reduce(float* max_logit, size_t count) { comm_.all_reduce_max(max_logit, count); }

  // The reference backward computes dQ with dK/dV: the query pass has nothing left to do.
  SequenceGrads attention_backward_keys(const ConstThdTensor& q, const ConstThdTensor& k, const ConstThdTensor& v,
                                        const ConstThdTensor& out, const ConstThdTensor& dout, const float* lse,
                                        ThdTensor dq) {
    const SequenceGrads grads{fp32_view(b_.grad_seq[0], k), fp32_view(b_.grad_seq[1], v)};
    BackwardTensors t{q, k, v, out, dout, lse, dq, grads.dk, grads.dv};
    t.sinks = sinks_;
    t.dsinks = dsinks_;  // this rank's rows only; CpuPlan::backward sums over the ranks
    cpu::attention_backward(table_, t, options_);
    return grads;
  }

  void attention_backward_queries() {}

  ThdTensor to_rank_order(const ThdTensor& seq, Slot slot) {
    std::vector<float>& ranked = b_.grad_ranked[index_of(slot)];
    const size_t row_bytes = seq.row_bytes();
    if (halo_) {
      halo_->pack_gradients(static_cast<const float*>(seq.data), seq.heads * seq.head_dim,
                            maps_[static_cast<size_t>(comm_.rank())], ranked.data());
      return ThdTensor{ranked.data(), DType::kFloat32, p_.local_rows() + halo_->halo_rows(comm_.rank()), seq.heads,
                       seq.head_dim};
    }
    const size_t local_count = static_cast<size_t>(p_.local_rows() * seq.heads * seq.head_dim);
    for (int r = 0; r < p_.cp; ++r) gather_rows(seq.data, ranked.data() + r * local_count, maps_[r], row_bytes);
    return fp32_view(ranked, seq);
  }

  ThdTensor reduce_scatter(const ThdTensor& ranked, Slot slot) {
    std::vector<float>& local = b_.grad_local[index_of(slot)];
    const int64_t rows = p_.local_rows();
    if (halo_) {
      halo_->sum_gradients(comm_, static_cast<const float*>(ranked.data), ranked.heads * ranked.head_dim,
                           b_.halo_returned[index_of(slot)], local.data());
      return ThdTensor{local.data(), DType::kFloat32, rows, ranked.heads, ranked.head_dim};
    }
    const size_t count = static_cast<size_t>(rows * ranked.heads * ranked.head_dim);
    // Problem::reduce_dtype below fp32: the partials rounded once before they cross ranks,
    // summed (here in fp32, rank order), the sum rounded once more (as the collective leaves it).
    const bool rounded = p_.reduce_dtype != DType::kFloat32;
    if (rounded) round_through(p_.reduce_dtype, static_cast<float*>(ranked.data), count * static_cast<size_t>(p_.cp));
    comm_.reduce_scatter_sum(static_cast<const float*>(ranked.data), local.data(), count);
    if (rounded) round_through(p_.reduce_dtype, local.data(), count);
    return ThdTensor{local.data(), DType::kFloat32, rows, ranked.heads, ranked.head_dim};
  }

  // Each of n floats rounded to `dtype` (to nearest even) and kept as a float.
  static void round_through(DType dtype, float* x, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      x[i] = dtype == DType::kBFloat16 ? bf16_to_float(float_to_bf16(x[i])) : fp16_to_float(float_to_fp16(x[i]));
    }
  }

  // One rounding of the dense fp32 rows into `grad`, any view.
  void cast(const ThdTensor& local, ThdTensor grad) {
    const auto* src = static_cast<const float*>(local.data);
    for (int64_t row = 0; row < grad.tokens; ++row) {
      for (int64_t head = 0; head < grad.heads; ++head) {
        const size_t to = static_cast<size_t>(grad.offset(row, head, 0));
        const float* from = src + (row * grad.heads + head) * grad.head_dim;
        for (int64_t d = 0; d < grad.head_dim; ++d) store_from_float(grad.data, grad.dtype, to + d, from[d]);
      }
    }
  }

 private:
  // The view's rows as dense [tokens, heads, head_dim] at `dense`.
  static void pack(const ConstThdTensor& view, unsigned char* dense) {
    const size_t element = dtype_size(view.dtype);
    const size_t head_bytes = static_cast<size_t>(view.head_dim) * element;
    for (int64_t row = 0; row < view.tokens; ++row) {
      for (int64_t head = 0; head < view.heads; ++head) {
        std::memcpy(dense + static_cast<size_t>(row * view.heads + head) * head_bytes,
                    static_cast<const unsigned char*>(view.data) + static_cast<size_t>(view.offset(row, head, 0)) * element,
                    head_bytes);
      }
    }
  }

  ThdTensor fp32_view(std::vector<float>& storage, const ConstThdTensor& like) const {
    return ThdTensor{storage.data(), DType::kFloat32, p_.capacity.max_tokens, like.heads, like.head_dim};
  }

  Communicator& comm_;
  const Problem& p_;
  const AttentionOptions& options_;
  CpuPlan::Buffers& b_;
  LayoutView layout_;
  std::optional<detail::HaloExchange> halo_;  // none: the whole gather
  detail::PhaseClock clock_;
  SegmentTable table_;
  std::vector<std::vector<int32_t>> maps_;
  const float* sinks_ = nullptr;
  float* dsinks_ = nullptr;
};

void check_layout(const LayoutView& layout, const Problem& p) {
  THDCP_CHECK(layout.cu_seqlens != nullptr && layout.cu_seqlens_padded != nullptr && layout.num_seqs >= 1,
              "the layout needs cu_seqlens and cu_seqlens_padded with at least 2 entries");
  THDCP_CHECK(layout.num_seqs <= p.capacity.max_seqs,
              "the layout has " << layout.num_seqs << " sequences but the plan's capacity is max_seqs="
                                << p.capacity.max_seqs);
  validate_cp_layout(layout, p.capacity.max_tokens, p.cp, p.layout);
}

// What a CPU step checks besides every plan's checks (shapes, dtypes, strides, overlap:
// detail::check_backward_tensors): dsinks needs the forward's sinks. Any view is taken: k and
// v are packed before the gather and dk, dv cast through their strides.
void check_cpu_backward(const Problem& p, const BackwardTensors& t) {
  detail::check_backward_tensors(p, t);
  THDCP_CHECK(t.dsinks == nullptr || t.sinks != nullptr,
              "dsinks is set but sinks is null: pass the forward's sinks to get their gradient");
}

}  // namespace

CpuPlan::CpuPlan(Communicator& comm, const Problem& problem, const AttentionOptions& options)
    : CpuPlan(comm, problem, options, nullptr) {}

CpuPlan::CpuPlan(Communicator& comm, const Problem& problem, const AttentionOptions& options, const OneShot* one_shot)
    : comm_(comm), problem_(problem), options_(options) {
  detail::AgreementInput in;
  in.problem = problem;
  in.rank = comm.rank();
  in.size = comm.size();
  in.options_fingerprint = options_fingerprint(options);
  if (one_shot) {
    in.layout_fingerprint = one_shot->layout_fingerprint;
    for (int i = 0; i < 3; ++i) in.local_rows[i] = one_shot->local_rows[i];
  }
  detail::agree(
      in,
      [&] {
        THDCP_CHECK(problem.cp == comm.size(), "problem.cp=" << problem.cp << " but the communicator has "
                                                             << comm.size() << " ranks");
        check_cpu_head_dims(problem);
        if (one_shot && one_shot->local_checks) one_shot->local_checks();
      },
      [&](const void* send, void* recv, size_t bytes) { comm.all_gather(send, recv, bytes); });

  buffers_ = std::make_shared<Buffers>();
  if (problem.comm == CpComm::kA2aAg) buffers_->a2a_ag = std::make_unique<detail::A2aAgCpu>(comm, problem, options);
  if (problem.comm != CpComm::kAllGather) return;  // their buffers grow on first use
  for (int i = 0; i < 2; ++i) {
    const size_t bytes = slot_elements(problem, i) * dtype_size(problem.dtype);
    buffers_->gathered[i].resize(bytes);
    buffers_->sequence[i].resize(bytes);
  }
}

void CpuPlan::forward(const LayoutView& layout, const ForwardTensors& tensors, Timings* timings) {
  check_layout(layout, problem_);
  detail::check_forward_tensors(problem_, tensors);
  if (problem_.comm == CpComm::kAllToAll) {
    detail::all_to_all_forward(comm_, problem_, options_, buffers_->all_to_all, layout, tensors, timings);
    return;
  }
  if (problem_.comm == CpComm::kA2aAg) {
    buffers_->a2a_ag->forward(layout, tensors, timings);
    return;
  }
  CpuSteps steps(comm_, problem_, options_, *buffers_, layout, timings);
  steps.use_sinks(tensors.sinks, nullptr);
  detail::run_forward(steps, tensors, problem_.head_slices);
}

void CpuPlan::backward(const LayoutView& layout, const BackwardTensors& tensors, Timings* timings) {
  check_layout(layout, problem_);
  check_cpu_backward(problem_, tensors);
  if (problem_.comm == CpComm::kAllToAll) {
    detail::all_to_all_backward(comm_, problem_, options_, buffers_->all_to_all, layout, tensors, timings);
    return;
  }
  if (problem_.comm == CpComm::kA2aAg) {
    buffers_->a2a_ag->backward(layout, tensors, timings);
    return;
  }
  // The fp32 gradient buffers are the largest; only a backward needs them.
  for (int i = 0; i < 2; ++i) {
    const size_t kv_elements = slot_elements(problem_, i);
    buffers_->grad_seq[i].resize(kv_elements);
    buffers_->grad_ranked[i].resize(kv_elements);
    buffers_->grad_local[i].resize(kv_elements / static_cast<size_t>(problem_.cp));
  }
  CpuSteps steps(comm_, problem_, options_, *buffers_, layout, timings);
  steps.use_sinks(tensors.sinks, tensors.dsinks);
  detail::run_backward(steps, tensors);
  if (tensors.dsinks) {
    // Each rank's d(sink) covers its own query rows; the whole is their sum, added in rank
    // order on every rank (an all-gather, not a reduction of unspecified order), so every
    // rank gets the same bits on every run.
    const size_t heads = static_cast<size_t>(problem_.q_heads);
    std::vector<float> parts(heads * static_cast<size_t>(problem_.cp));
    comm_.all_gather(tensors.dsinks, parts.data(), heads * sizeof(float));
    for (size_t h = 0; h < heads; ++h) {
      double sum = 0;
      for (int r = 0; r < problem_.cp; ++r) sum += parts[static_cast<size_t>(r) * heads + h];
      tensors.dsinks[h] = static_cast<float>(sum);
    }
  }
}

KvTraffic CpuPlan::kv_traffic(const LayoutView& layout) const {
  THDCP_CHECK(problem_.comm != CpComm::kAllToAll,
              "kv_traffic: comm=" << cp_comm_name(problem_.comm) << " gathers no K/V rows (it moves heads); ask a plan "
                                  "of comm=all_gather or a2a+ag");
  check_layout(layout, problem_);
  if (problem_.comm == CpComm::kA2aAg) return buffers_->a2a_ag->kv_traffic(layout);
  const Problem& p = problem_;
  const std::optional<detail::HaloExchange> halo = halo_for(layout, p, comm_.rank());
  const int64_t width = p.kv_heads * (p.head_dim + p.value_head_dim());  // a K row and a V row
  const int64_t kv_row_bytes = width * static_cast<int64_t>(dtype_size(p.dtype));
  const int64_t grad_row_bytes = width * static_cast<int64_t>(sizeof(float));
  KvTraffic traffic;
  traffic.gather = halo ? KvGather::kHalo : KvGather::kWhole;
  for (int r = 0; r < p.cp; ++r) {
    const int64_t others = (p.cp - 1) * p.local_rows();
    const int64_t in = halo ? halo->halo_rows(r) : others, back = halo ? halo->returned_rows(r) : others;
    traffic.forward_bytes.push_back(in * kv_row_bytes);
    traffic.backward_bytes.push_back(in * kv_row_bytes + back * grad_row_bytes);
  }
  return traffic;
}

namespace {

// The problem of a one-shot call: its capacity is the layout itself.
Problem problem_of(const Communicator& comm, const LayoutView& layout, const Mask& mask, const ConstThdTensor& q,
                   const ConstThdTensor& k, const ConstThdTensor& v) {
  Problem p;
  p.cp = comm.size();
  p.capacity.max_seqs = layout.num_seqs;
  p.capacity.max_tokens = (layout.cu_seqlens_padded && layout.num_seqs >= 0) ? layout.total_rows() : 0;
  p.mask = mask;
  p.q_heads = q.heads;
  p.kv_heads = k.heads;
  p.head_dim = q.head_dim;
  p.v_head_dim = v.head_dim;
  p.dtype = q.dtype;
  return p;
}

// A one-shot call: a plan for this call's shapes, whose agreement also covers the layout,
// the rows passed and this rank's argument checks; then one step.
template <typename Tensors, typename Check, typename Step>
void one_shot(Communicator& comm, const LayoutView& layout, const Mask& mask, const Tensors& tensors,
              const AttentionOptions& options, Timings* timings, Check check, Step step) {
  const auto start = Clock::now();
  const Problem problem = problem_of(comm, layout, mask, tensors.q, tensors.k, tensors.v);
  CpuPlan::OneShot agreement;
  agreement.local_rows[0] = tensors.q.tokens;
  agreement.local_rows[1] = tensors.k.tokens;
  agreement.local_rows[2] = tensors.v.tokens;
  agreement.local_checks = [&] {
    check_layout(layout, problem);
    check(problem, tensors);
  };
  if (layout.cu_seqlens && layout.cu_seqlens_padded) agreement.layout_fingerprint = detail::layout_fingerprint(layout);
  CpuPlan plan = CpuPlan::make_one_shot(comm, problem, options, agreement);
  if (timings) (*timings)[Phase::kTable] += std::chrono::duration<double>(Clock::now() - start).count();
  step(plan);
}

}  // namespace

CpuPlan CpuPlan::make_one_shot(Communicator& comm, const Problem& problem, const AttentionOptions& options,
                               const OneShot& agreement) {
  return CpuPlan(comm, problem, options, &agreement);
}

void forward(Communicator& comm, const LayoutView& layout, const Mask& mask, ConstThdTensor q, ConstThdTensor k,
             ConstThdTensor v, ThdTensor out, float* lse, float* max_logit, const AttentionOptions& options,
             Timings* timings) {
  const ForwardTensors tensors{q, k, v, out, lse, max_logit};
  one_shot(comm, layout, mask, tensors, options, timings, detail::check_forward_tensors,
           [&](CpuPlan& plan) { plan.forward(layout, tensors, timings); });
}

void backward(Communicator& comm, const LayoutView& layout, const Mask& mask, ConstThdTensor q, ConstThdTensor k,
              ConstThdTensor v, ConstThdTensor out, ConstThdTensor dout, const float* lse, ThdTensor dq, ThdTensor dk,
              ThdTensor dv, const AttentionOptions& options, Timings* timings) {
  const BackwardTensors tensors{q, k, v, out, dout, lse, dq, dk, dv};
  one_shot(comm, layout, mask, tensors, options, timings, check_cpu_backward,
           [&](CpuPlan& plan) { plan.backward(layout, tensors, timings); });
}

}  // namespace thdcp::cp
