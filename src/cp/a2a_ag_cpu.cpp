#include "a2a_ag_cpu.h"

#include <utility>

#include "agreement.h"
#include "phase_clock.h"
#include "thdcp/core/error.h"
#include "thdcp/plan/rank_split.h"

namespace thdcp::cp::detail {

A2aAgCpu::A2aAgCpu(Communicator& comm, const Problem& problem, const AttentionOptions& options)
    : problem_(problem), group_(comm.rank() / problem.a2a_size), member_(comm.rank() % problem.a2a_size) {
  a2a_ = comm.split(/*color=*/group_, /*key=*/member_);
  ag_ = comm.split(/*color=*/member_, /*key=*/group_);
  across_ = std::make_unique<CpuPlan>(*ag_, a2a_ag_across(problem), options);
}

HeadExchange A2aAgCpu::exchange(const LayoutView& layout) {
  const Problem& p = problem_;
  const int a2a_size = p.a2a_size, ag_size = p.cp / p.a2a_size;
  // Where each global row sits among the group's rows (rank group_ of the layout at ag_size).
  const std::vector<int32_t> group_rows = rank_row_map(layout, ag_size, group_, p.layout);
  std::vector<int32_t> position(static_cast<size_t>(p.capacity.max_tokens), -1);
  for (size_t i = 0; i < group_rows.size(); ++i) position[static_cast<size_t>(group_rows[i])] = static_cast<int32_t>(i);
  std::vector<std::vector<int32_t>> maps;
  for (int m = 0; m < a2a_size; ++m) {
    const int rank = group_ * a2a_size + m;
    std::vector<int32_t> map = rank_row_map(layout, p.cp, rank, p.layout);
    for (int32_t& row : map) {
      const int32_t global_row = row;
      row = position[static_cast<size_t>(global_row)];
      THDCP_CHECK(row >= 0, "a2a+ag: global row " << global_row << " of rank " << rank << " is not among the rows of "
                                                  << "its group " << group_ << " (a bug in the layout's rank map)");
    }
    maps.push_back(std::move(map));
  }
  return HeadExchange(*a2a_, buffers_, p.local_rows(), static_cast<int64_t>(group_rows.size()), std::move(maps));
}

void A2aAgCpu::forward(const LayoutView& layout, const ForwardTensors& t, Timings* timings) {
  const Problem& p = problem_;
  AllToAllBuffers& b = buffers_;
  const int64_t rows = p.capacity.max_tokens / (p.cp / p.a2a_size), heads = p.q_heads / p.a2a_size;
  PhaseClock clock(timings);
  clock.phase(Phase::kTable);
  HeadExchange group = exchange(layout);
  clock.phase(Phase::kGather);
  const ConstThdTensor q = group.to_heads(t.q, b.q), k = group.to_heads(t.k, b.k), v = group.to_heads(t.v, b.v);
  clock.phase(Phase::kCount);  // the AllGather plan times its own phases
  const ThdTensor out = dense(b.out, p.dtype, rows, heads, p.value_head_dim());
  float* lse = grown(b.lse, static_cast<size_t>(heads * rows));
  float* max_logit = t.max_logit ? grown(b.max_logit, static_cast<size_t>(heads)) : nullptr;
  const float* sinks = t.sinks ? t.sinks + member_ * heads : nullptr;
  across_->forward(layout, ForwardTensors{q, k, v, out, lse, max_logit, sinks}, timings);
  clock.phase(Phase::kReduce);
  group.to_rows(out, t.out);
  group.lse_to_rows(lse, p.q_heads, t.lse);
  // Each head's max_logit is whole (max-reduced over the groups) on the member that owns it.
  if (t.max_logit) a2a_->all_gather(max_logit, t.max_logit, static_cast<size_t>(heads) * sizeof(float));
  clock.phase(Phase::kCount);
}

void A2aAgCpu::backward(const LayoutView& layout, const BackwardTensors& t, Timings* timings) {
  const Problem& p = problem_;
  AllToAllBuffers& b = buffers_;
  const int64_t rows = p.capacity.max_tokens / (p.cp / p.a2a_size), heads = p.q_heads / p.a2a_size,
                kv_heads = p.kv_heads / p.a2a_size;
  PhaseClock clock(timings);
  clock.phase(Phase::kTable);
  HeadExchange group = exchange(layout);
  clock.phase(Phase::kGather);
  // dq, dk, dv in fp32: rounded once, on the way back (the AllGather plan reduce-scatters dk
  // and dv in fp32 and its fp32 cast is exact).
  BackwardTensors s = backward_to_heads(group, t, p, b, rows, heads, kv_heads);
  s.sinks = t.sinks ? t.sinks + member_ * heads : nullptr;
  s.dsinks = t.dsinks ? grown(b.dsinks, static_cast<size_t>(heads)) : nullptr;
  clock.phase(Phase::kCount);
  across_->backward(layout, s, timings);
  clock.phase(Phase::kReduce);
  group.to_rows(s.dq, t.dq);
  group.to_rows(s.dk, t.dk);
  group.to_rows(s.dv, t.dv);
  // Each head's d(sink) is whole (summed over the groups) on the member that owns it.
  if (t.dsinks) a2a_->all_gather(s.dsinks, t.dsinks, static_cast<size_t>(heads) * sizeof(float));
  clock.phase(Phase::kCount);
}

KvTraffic A2aAgCpu::kv_traffic(const LayoutView& layout) const {
  const KvTraffic across = across_->kv_traffic(layout);
  KvTraffic traffic;
  traffic.gather = across.gather;
  for (int rank = 0; rank < problem_.cp; ++rank) {
    const size_t group = static_cast<size_t>(rank / problem_.a2a_size);
    traffic.forward_bytes.push_back(across.forward_bytes[group]);
    traffic.backward_bytes.push_back(across.backward_bytes[group]);
  }
  return traffic;
}

}  // namespace thdcp::cp::detail
