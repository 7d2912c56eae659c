// CPU reference forward: one work item per (query head, segment).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention_common.h"
#include "thread_pool.h"
#include "thdcp/core/softmax_scale.h"

namespace thdcp::cpu {

namespace {

template <typename Acc>
struct ForwardScratch {
  std::vector<Acc> keys_by_dim;
  std::vector<Acc> values_by_row;
  std::vector<Acc> query;
  std::vector<Acc> scores;
  std::vector<Acc> acc_out;
};

template <typename Acc>
void forward_impl(const SegmentTable& table, const ConstThdTensor& q, const ConstThdTensor& k,
                  const ConstThdTensor& v, const ThdTensor& out, float* lse, float* max_logit, const float* sinks,
                  const AttentionOptions& options) {
  const int64_t q_heads = q.heads;
  const int64_t group = q.heads / k.heads;
  const int64_t dim = q.head_dim;     // D_qk
  const int64_t v_dim = v.head_dim;  // D_v
  const int64_t num_segments = static_cast<int64_t>(table.segments.size());
  const Acc scale = static_cast<Acc>(resolve_softmax_scale(options.softmax_scale, dim));
  const int threads = resolve_num_threads(options.num_threads);
  const float neg_inf = -std::numeric_limits<float>::infinity();

  // Outputs start as what an untouched row must hold, so padding rows and rows that see
  // no key are correct without a separate pass.
  detail::zero_view(out);
  std::fill_n(lse, static_cast<size_t>(q_heads * table.q_rows), neg_inf);
  std::vector<Acc> item_max(static_cast<size_t>(q_heads * num_segments), -std::numeric_limits<Acc>::infinity());
  std::vector<ForwardScratch<Acc>> scratch(static_cast<size_t>(threads));

  parallel_for(q_heads * num_segments, threads, [&](int64_t item, int worker) {
    const int64_t head = item / num_segments;
    const Segment& seg = table.segments[static_cast<size_t>(item % num_segments)];
    if (seg.q_len == 0 || seg.k_len == 0) return;
    ForwardScratch<Acc>& s = scratch[static_cast<size_t>(worker)];
    const int64_t kv_head = head / group;
    detail::load_head_rows<Acc>(k, kv_head, seg.k_row, seg.k_len, nullptr, &s.keys_by_dim);
    detail::load_head_rows<Acc>(v, kv_head, seg.k_row, seg.k_len, &s.values_by_row, nullptr);
    s.query.resize(static_cast<size_t>(dim));
    s.scores.resize(static_cast<size_t>(seg.k_len));
    s.acc_out.resize(static_cast<size_t>(v_dim));
    Acc running_max = -std::numeric_limits<Acc>::infinity();
    const Acc sink = sinks ? static_cast<Acc>(sinks[head]) : -std::numeric_limits<Acc>::infinity();
    for (int64_t t = 0; t < seg.q_len; ++t) {
      const PositionRange keys = segment_visible_keys(seg, table.mask, t);
      if (keys.size() == 0) {
        // Only the sink: the denominator is exp(sink), out stays 0.
        if (sinks) lse[head * table.q_rows + seg.q_row + t] = static_cast<float>(sink);
        continue;
      }
      const int64_t begin = keys.begin - seg.k_pos;
      const int64_t end = keys.end - seg.k_pos;
      const int64_t row = seg.q_row + t;
      for (int64_t d = 0; d < dim; ++d) s.query[d] = detail::load<Acc>(q, row, head, d);
      detail::scaled_scores(s.query.data(), s.keys_by_dim.data(), seg.k_len, dim, begin, end, scale,
                            s.scores.data());
      const Acc score_max = *std::max_element(s.scores.begin() + begin, s.scores.begin() + end);
      running_max = std::max(running_max, score_max);  // max_logit: q.k scores only
      const Acc row_max = std::max(score_max, sink);
      Acc denominator = sinks ? std::exp(sink - row_max) : Acc(0);
      for (int64_t j = begin; j < end; ++j) {
        s.scores[j] = std::exp(s.scores[j] - row_max);
        denominator += s.scores[j];
      }
      detail::weighted_sum(s.scores.data(), s.values_by_row.data(), v_dim, begin, end, s.acc_out.data());
      const Acc inv = Acc(1) / denominator;
      const size_t out_base = static_cast<size_t>(out.offset(row, head, 0));
      for (int64_t d = 0; d < v_dim; ++d) {
        store_from_float(out.data, out.dtype, out_base + d, static_cast<float>(s.acc_out[d] * inv));
      }
      lse[head * table.q_rows + row] = static_cast<float>(row_max + std::log(denominator));
    }
    item_max[static_cast<size_t>(item)] = running_max;
  });

  if (max_logit) {
    for (int64_t head = 0; head < q_heads; ++head) {
      Acc m = -std::numeric_limits<Acc>::infinity();
      for (int64_t s = 0; s < num_segments; ++s) m = std::max(m, item_max[head * num_segments + s]);
      max_logit[head] = static_cast<float>(m);
    }
  }
}

}  // namespace

void attention_forward(const SegmentTable& table, const ForwardTensors& t, const AttentionOptions& options) {
  detail::check_qkv(table, t.q, t.k, t.v);
  detail::check_tensor("out", t.out, detail::out_shape(table, t.q, t.v), t.q.dtype);
  check_outputs_apart({{"out", t.out}}, {{"q", t.q}, {"k", t.k}, {"v", t.v}});
  THDCP_CHECK(t.lse != nullptr, "lse must point to Hq * q_rows = " << t.q.heads * table.q_rows << " floats");
  detail::check_sinks(t.sinks, t.q.heads);
  resolve_softmax_scale(options.softmax_scale, t.q.head_dim);
  if (options.accumulate == Accumulate::kFloat64) {
    forward_impl<double>(table, t.q, t.k, t.v, t.out, t.lse, t.max_logit, t.sinks, options);
  } else {
    forward_impl<float>(table, t.q, t.k, t.v, t.out, t.lse, t.max_logit, t.sinks, options);
  }
}

void attention_forward(const SegmentTable& table, ConstThdTensor q, ConstThdTensor k, ConstThdTensor v,
                       ThdTensor out, float* lse, float* max_logit, const AttentionOptions& options) {
  attention_forward(table, ForwardTensors{q, k, v, out, lse, max_logit}, options);
}

}  // namespace thdcp::cpu
