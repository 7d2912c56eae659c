#include "alltoall_cpu.h"

#include <cstring>
#include <utility>

#include "phase_clock.h"
#include "thdcp/core/error.h"
#include "thdcp/plan/rank_split.h"
#include "thdcp/plan/segment_table.h"

namespace thdcp::cp::detail {

HeadExchange::HeadExchange(Communicator& comm, AllToAllBuffers& buffers, int64_t local_rows, int64_t rows,
                           std::vector<std::vector<int32_t>> maps)
    : comm_(comm), cp_(comm.size()), local_rows_(local_rows), rows_(rows), b_(buffers), maps_(std::move(maps)) {}

ConstThdTensor HeadExchange::to_heads(const ConstThdTensor& local, std::vector<unsigned char>& seq) {
  const int64_t heads = local.heads / cp_;
  const size_t element = dtype_size(local.dtype);
  const auto [head_bytes, row_bytes, block, send, recv] = blocks(heads, local.head_dim, element);
  const auto* from = static_cast<const unsigned char*>(local.data);
  for (int r = 0; r < cp_; ++r) {
    for (int64_t row = 0; row < local_rows_; ++row) {
      for (int64_t h = 0; h < heads; ++h) {
        std::memcpy(send + r * block + static_cast<size_t>(row * heads + h) * head_bytes,
                    from + static_cast<size_t>(local.offset(row, r * heads + h, 0)) * element, head_bytes);
      }
    }
  }
  comm_.all_to_all(send, recv, block);
  unsigned char* ordered = grown(seq, static_cast<size_t>(rows_) * row_bytes);
  for (int r = 0; r < cp_; ++r) scatter_rows(recv + r * block, ordered, maps_[static_cast<size_t>(r)], row_bytes);
  return ConstThdTensor(ordered, local.dtype, rows_, heads, local.head_dim);
}

void HeadExchange::to_rows(const ConstThdTensor& seq, ThdTensor local) {
  THDCP_CHECK(seq.dtype == local.dtype || seq.dtype == DType::kFloat32, "to_rows: an fp32 or same-dtype source");
  const int64_t heads = seq.heads;
  const auto [head_bytes, row_bytes, block, send, recv] = blocks(heads, seq.head_dim, dtype_size(seq.dtype));
  for (int r = 0; r < cp_; ++r) gather_rows(seq.data, send + r * block, maps_[static_cast<size_t>(r)], row_bytes);
  comm_.all_to_all(send, recv, block);
  const size_t local_element = dtype_size(local.dtype);
  for (int from = 0; from < cp_; ++from) {
    for (int64_t row = 0; row < local_rows_; ++row) {
      for (int64_t h = 0; h < heads; ++h) {
        const unsigned char* src = recv + from * block + static_cast<size_t>(row * heads + h) * head_bytes;
        const int64_t to = local.offset(row, from * heads + h, 0);
        if (seq.dtype == local.dtype) {
          std::memcpy(static_cast<unsigned char*>(local.data) + static_cast<size_t>(to) * local_element, src,
                      head_bytes);
        } else {
          const auto* values = reinterpret_cast<const float*>(src);
          for (int64_t d = 0; d < seq.head_dim; ++d) {
            store_from_float(local.data, local.dtype, static_cast<size_t>(to + d), values[d]);
          }
        }
      }
    }
  }
}

const float* HeadExchange::lse_to_heads(const float* local, int64_t q_heads, std::vector<float>& seq) {
  const int64_t heads = q_heads / cp_;
  const size_t block = static_cast<size_t>(heads * local_rows_);
  auto* recv = reinterpret_cast<float*>(grown(b_.recv, block * cp_ * sizeof(float)));
  comm_.all_to_all(local, recv, block * sizeof(float));
  float* ordered = grown(seq, static_cast<size_t>(heads * rows_));
  for (int from = 0; from < cp_; ++from) {
    for (int64_t h = 0; h < heads; ++h) {
      scatter_rows(recv + from * block + h * local_rows_, ordered + h * rows_, maps_[static_cast<size_t>(from)],
                   sizeof(float));
    }
  }
  return ordered;
}

void HeadExchange::lse_to_rows(const float* seq, int64_t q_heads, float* local) {
  const int64_t heads = q_heads / cp_;
  const size_t block = static_cast<size_t>(heads * local_rows_);
  auto* send = reinterpret_cast<float*>(grown(b_.send, block * cp_ * sizeof(float)));
  for (int r = 0; r < cp_; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      gather_rows(seq + h * rows_, send + r * block + h * local_rows_, maps_[static_cast<size_t>(r)], sizeof(float));
    }
  }
  comm_.all_to_all(send, local, block * sizeof(float));
}

HeadExchange::Blocks HeadExchange::blocks(int64_t heads, int64_t head_dim, size_t element) {
  const size_t head_bytes = static_cast<size_t>(head_dim) * element;
  const size_t row_bytes = static_cast<size_t>(heads) * head_bytes;
  const size_t block = static_cast<size_t>(local_rows_) * row_bytes;
  return Blocks{head_bytes, row_bytes, block, grown(b_.send, block * cp_), grown(b_.recv, block * cp_)};
}

BackwardTensors backward_to_heads(HeadExchange& exchange, const BackwardTensors& t, const Problem& p,
                                  AllToAllBuffers& b, int64_t rows, int64_t heads, int64_t kv_heads) {
  return BackwardTensors{exchange.to_heads(t.q, b.q),
                         exchange.to_heads(t.k, b.k),
                         exchange.to_heads(t.v, b.v),
                         exchange.to_heads(t.out, b.out),
                         exchange.to_heads(t.dout, b.dout),
                         exchange.lse_to_heads(t.lse, p.q_heads, b.lse),
                         dense(b.dq, rows, heads, p.head_dim),
                         dense(b.dk, rows, kv_heads, p.head_dim),
                         dense(b.dv, rows, kv_heads, p.value_head_dim())};
}

namespace {

// Every rank's local rows, by their global rows: the head-sharded tensors are in sequence order.
std::vector<std::vector<int32_t>> rank_maps(const LayoutView& layout, const Problem& p) {
  std::vector<std::vector<int32_t>> maps;
  for (int r = 0; r < p.cp; ++r) maps.push_back(rank_row_map(layout, p.cp, r, p.layout));
  return maps;
}

// What both passes start with, timed as the table phase: the exchange, the single-device
// table (attention runs over whole documents), this rank's query heads and the first of them.
struct Pass {
  Pass(Communicator& comm, const Problem& p, AllToAllBuffers& b, const LayoutView& layout, Timings* timings)
      : clock(started(timings)),
        exchange(comm, b, p.local_rows(), p.capacity.max_tokens, rank_maps(layout, p)),
        table(build_segment_table(layout, p.mask)),
        heads(p.q_heads / p.cp),
        first_head(comm.rank() * heads) {}

  static PhaseClock started(Timings* timings) {
    PhaseClock clock(timings);
    clock.phase(Phase::kTable);
    return clock;
  }

  PhaseClock clock;
  HeadExchange exchange;
  SegmentTable table;
  int64_t heads, first_head;
};

}  // namespace

void all_to_all_forward(Communicator& comm, const Problem& p, const AttentionOptions& options, AllToAllBuffers& b,
                        const LayoutView& layout, const ForwardTensors& t, Timings* timings) {
  Pass pass(comm, p, b, layout, timings);
  auto& [clock, exchange, table, heads, first_head] = pass;
  const int64_t rows = p.capacity.max_tokens;
  clock.phase(Phase::kGather);
  const ConstThdTensor q = exchange.to_heads(t.q, b.q), k = exchange.to_heads(t.k, b.k),
                       v = exchange.to_heads(t.v, b.v);
  clock.phase(Phase::kAttention);
  const ThdTensor out = dense(b.out, p.dtype, rows, heads, p.value_head_dim());
  float* lse = grown(b.lse, static_cast<size_t>(heads * rows));
  float* max_logit = t.max_logit ? grown(b.max_logit, static_cast<size_t>(heads)) : nullptr;
  const float* sinks = t.sinks ? t.sinks + first_head : nullptr;
  cpu::attention_forward(table, ForwardTensors{q, k, v, out, lse, max_logit, sinks}, options);
  clock.phase(Phase::kReduce);
  exchange.to_rows(out, t.out);
  exchange.lse_to_rows(lse, p.q_heads, t.lse);
  // Each head's max_logit is whole on the rank that owns it: gathered in head order.
  if (t.max_logit) comm.all_gather(max_logit, t.max_logit, static_cast<size_t>(heads) * sizeof(float));
  clock.phase(Phase::kCount);
}

void all_to_all_backward(Communicator& comm, const Problem& p, const AttentionOptions& options, AllToAllBuffers& b,
                         const LayoutView& layout, const BackwardTensors& t, Timings* timings) {
  Pass pass(comm, p, b, layout, timings);
  auto& [clock, exchange, table, heads, first_head] = pass;
  const int64_t kv_heads = p.kv_heads / p.cp, rows = p.capacity.max_tokens;
  clock.phase(Phase::kGather);
  BackwardTensors s = backward_to_heads(exchange, t, p, b, rows, heads, kv_heads);
  s.sinks = t.sinks ? t.sinks + first_head : nullptr;
  s.dsinks = t.dsinks ? grown(b.dsinks, static_cast<size_t>(heads)) : nullptr;
  clock.phase(Phase::kAttention);
  cpu::attention_backward(table, s, options);
  clock.phase(Phase::kReduce);
  exchange.to_rows(s.dq, t.dq);
  exchange.to_rows(s.dk, t.dk);
  exchange.to_rows(s.dv, t.dv);
  // Each head's d(sink) is whole on the rank that owns it: every rank gets the same bits.
  if (t.dsinks) comm.all_gather(s.dsinks, t.dsinks, static_cast<size_t>(heads) * sizeof(float));
  clock.phase(Phase::kCount);
}

}  // namespace thdcp::cp::detail
