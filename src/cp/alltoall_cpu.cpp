#include "alltoall_cpu.h"

#include <cstring>

#include "phase_clock.h"
#include "thdcp/core/error.h"
#include "thdcp/plan/rank_split.h"
#include "thdcp/plan/segment_table.h"

namespace thdcp::cp::detail {

namespace {

template <typename T>
T* grown(std::vector<T>& buffer, size_t count) {
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

// The exchanges between the ranks' rows and their heads. Block r of a send buffer is what
// rank r receives; rows move in the order of rank r's local rows (rank_row_map), so the
// receiver places them by that rank's map.
class HeadExchange {
 public:
  HeadExchange(Communicator& comm, const Problem& p, AllToAllBuffers& buffers, const LayoutView& layout)
      : comm_(comm), cp_(p.cp), local_rows_(p.local_rows()), rows_(p.capacity.max_tokens), b_(buffers) {
    for (int r = 0; r < cp_; ++r) maps_.push_back(rank_row_map(layout, cp_, r, p.layout));
  }

  // This rank's rows of `local` ([T/cp, H, D], any view) -> every row of this rank's H/cp
  // heads, dense [T, H/cp, D] in sequence order at `seq`, in local's dtype.
  ConstThdTensor to_heads(const ConstThdTensor& local, std::vector<unsigned char>& seq) {
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

  // The inverse of to_heads: this rank's heads `seq` ([T, H/cp, D] dense, sequence order, in
  // local's dtype or fp32) -> this rank's rows of every head, into `local` (any view), rounded
  // once to local's dtype.
  void to_rows(const ConstThdTensor& seq, ThdTensor local) {
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

  // lse [Hq, T/cp] of this rank's rows -> [Hq/cp, T] of this rank's heads, sequence order.
  // Block r of the local lse (heads [r Hq/cp, (r+1) Hq/cp)) is already what rank r receives.
  const float* lse_to_heads(const float* local, int64_t q_heads, std::vector<float>& seq) {
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

  // The inverse: [Hq/cp, T] of this rank's heads -> lse [Hq, T/cp] of this rank's rows.
  void lse_to_rows(const float* seq, int64_t q_heads, float* local) {
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

 private:
  // One all-to-all of `heads` heads of head_dim elements per row: a block per rank of the
  // local rows, and the send and receive buffers sized for cp blocks.
  struct Blocks {
    size_t head_bytes, row_bytes, block;
    unsigned char *send, *recv;
  };
  Blocks blocks(int64_t heads, int64_t head_dim, size_t element) {
    const size_t head_bytes = static_cast<size_t>(head_dim) * element;
    const size_t row_bytes = static_cast<size_t>(heads) * head_bytes;
    const size_t block = static_cast<size_t>(local_rows_) * row_bytes;
    return Blocks{head_bytes, row_bytes, block, grown(b_.send, block * cp_), grown(b_.recv, block * cp_)};
  }

  Communicator& comm_;
  int cp_;
  int64_t local_rows_, rows_;
  AllToAllBuffers& b_;
  std::vector<std::vector<int32_t>> maps_;
};

ThdTensor dense(std::vector<unsigned char>& storage, DType dtype, int64_t rows, int64_t heads, int64_t head_dim) {
  return ThdTensor{grown(storage, static_cast<size_t>(rows * heads * head_dim) * dtype_size(dtype)), dtype, rows,
                   heads, head_dim};
}

ThdTensor dense(std::vector<float>& storage, int64_t rows, int64_t heads, int64_t head_dim) {
  return ThdTensor{grown(storage, static_cast<size_t>(rows * heads * head_dim)), DType::kFloat32, rows, heads,
                   head_dim};
}

// What both passes start with, timed as the table phase: the exchange, the single-device
// table (attention runs over whole documents), this rank's query heads and the first of them.
struct Pass {
  Pass(Communicator& comm, const Problem& p, AllToAllBuffers& b, const LayoutView& layout, Timings* timings)
      : clock(started(timings)),
        exchange(comm, p, b, layout),
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
  BackwardTensors s{exchange.to_heads(t.q, b.q),
                    exchange.to_heads(t.k, b.k),
                    exchange.to_heads(t.v, b.v),
                    exchange.to_heads(t.out, b.out),
                    exchange.to_heads(t.dout, b.dout),
                    exchange.lse_to_heads(t.lse, p.q_heads, b.lse),
                    dense(b.dq, rows, heads, p.head_dim),
                    dense(b.dk, rows, kv_heads, p.head_dim),
                    dense(b.dv, rows, kv_heads, p.value_head_dim())};
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
