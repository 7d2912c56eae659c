// CPU reference backward.
//
// dK/dV of a key row collect contributions from every query head of its KV group and, under
// CP, from both segments of a sequence. To keep that race-free and deterministic, segments
// whose key ranges overlap are merged into key groups, and one work item owns one
// (KV head, key group): it accumulates that block of dK/dV in Acc and writes it once.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention_common.h"
#include "thread_pool.h"
#include "thdcp/core/softmax_scale.h"

namespace thdcp::cpu {

namespace {

struct KeyGroup {
  int64_t first_row = 0;  // key rows [first_row, end_row)
  int64_t end_row = 0;
  std::vector<int32_t> segments;
};

// Segments that do any work, grouped by overlapping key rows (sorted by key row).
std::vector<KeyGroup> key_groups(const SegmentTable& table) {
  std::vector<int32_t> order;
  for (size_t i = 0; i < table.segments.size(); ++i) {
    const Segment& s = table.segments[i];
    if (s.q_len > 0 && s.k_len > 0) order.push_back(static_cast<int32_t>(i));
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return table.segments[a].k_row < table.segments[b].k_row; });
  std::vector<KeyGroup> groups;
  for (int32_t i : order) {
    const Segment& s = table.segments[i];
    const int64_t end = static_cast<int64_t>(s.k_row) + s.k_len;
    if (groups.empty() || s.k_row >= groups.back().end_row) {
      groups.push_back(KeyGroup{s.k_row, end, {}});
    }
    groups.back().end_row = std::max(groups.back().end_row, end);
    groups.back().segments.push_back(i);
  }
  return groups;
}

// For keys j in [begin, end):
//   dquery += dS_j * K_j,  dK_j += scale * dS_j * q  (D_qk = dim),  dV_j += P_j * dO  (D_v = v_dim).
// Restrict-qualified so the three D-loops vectorise.
template <typename Acc>
void accumulate_row_gradients(int64_t begin, int64_t end, int64_t dim, int64_t v_dim, Acc scale, const Acc* __restrict dscores,
                              const Acc* __restrict probs, const Acc* __restrict keys_by_row,
                              const Acc* __restrict query, const Acc* __restrict dout, Acc* __restrict dquery,
                              Acc* __restrict dkeys, Acc* __restrict dvalues) {
  for (int64_t j = begin; j < end; ++j) {
    const Acc ds = dscores[j];
    const Acc scaled_ds = scale * ds;
    const Acc p = probs[j];
    const Acc* __restrict key = keys_by_row + j * dim;
    Acc* __restrict dkey = dkeys + j * dim;
    Acc* __restrict dvalue = dvalues + j * v_dim;
    for (int64_t d = 0; d < dim; ++d) dquery[d] += ds * key[d];
    for (int64_t d = 0; d < dim; ++d) dkey[d] += scaled_ds * query[d];
    for (int64_t d = 0; d < v_dim; ++d) dvalue[d] += p * dout[d];
  }
}

template <typename Acc>
struct BackwardScratch {
  std::vector<Acc> keys_by_row, keys_by_dim, values_by_dim;
  std::vector<Acc> dkeys, dvalues;
  std::vector<Acc> query, dout, scores, probs, dscores, dquery;
};

template <typename Acc>
void backward_impl(const SegmentTable& table, const ConstThdTensor& q, const ConstThdTensor& k,
                   const ConstThdTensor& v, const ConstThdTensor& out, const ConstThdTensor& dout,
                   const float* lse, const ThdTensor& dq, const ThdTensor& dk, const ThdTensor& dv,
                   const float* sinks, float* dsinks, const AttentionOptions& options) {
  const int64_t q_heads = q.heads;
  const int64_t kv_heads = k.heads;
  const int64_t group_size = q_heads / kv_heads;
  const int64_t dim = q.head_dim;     // D_qk
  const int64_t v_dim = v.head_dim;  // D_v
  const Acc scale = static_cast<Acc>(resolve_softmax_scale(options.softmax_scale, dim));
  const int threads = resolve_num_threads(options.num_threads);
  const std::vector<KeyGroup> groups = key_groups(table);
  const int64_t num_groups = static_cast<int64_t>(groups.size());

  for (const ThdTensor* t : {&dq, &dk, &dv}) detail::zero_view(*t);
  std::vector<BackwardScratch<Acc>> scratch(static_cast<size_t>(threads));
  // d(sink) per (query head, key group): each query row of a head lies in one segment, so in
  // one key group; the groups' shares are added in group order below (deterministic).
  std::vector<Acc> group_dsink(dsinks ? static_cast<size_t>(q_heads * num_groups) : 0, Acc(0));

  parallel_for(kv_heads * num_groups, threads, [&](int64_t item, int worker) {
    const int64_t kv_head = item / num_groups;
    const KeyGroup& kg = groups[static_cast<size_t>(item % num_groups)];
    const int64_t span = kg.end_row - kg.first_row;
    BackwardScratch<Acc>& s = scratch[static_cast<size_t>(worker)];
    detail::load_head_rows<Acc>(k, kv_head, kg.first_row, span, &s.keys_by_row, &s.keys_by_dim);
    detail::load_head_rows<Acc>(v, kv_head, kg.first_row, span, nullptr, &s.values_by_dim);
    s.dkeys.assign(static_cast<size_t>(span * dim), Acc(0));
    s.dvalues.assign(static_cast<size_t>(span * v_dim), Acc(0));
    for (auto* buf : {&s.query, &s.dquery}) buf->resize(static_cast<size_t>(dim));
    s.dout.resize(static_cast<size_t>(v_dim));
    for (auto* buf : {&s.scores, &s.probs, &s.dscores}) buf->resize(static_cast<size_t>(span));

    for (int64_t head = kv_head * group_size; head < (kv_head + 1) * group_size; ++head) {
      for (int32_t seg_index : kg.segments) {
        const Segment& seg = table.segments[static_cast<size_t>(seg_index)];
        // Key position p of this segment sits at index (seg.k_row - first_row) + (p - k_pos).
        const int64_t key_offset = seg.k_row - kg.first_row - seg.k_pos;
        for (int64_t t = 0; t < seg.q_len; ++t) {
          const PositionRange keys = segment_visible_keys(seg, table.mask, t);
          const int64_t row = seg.q_row + t;
          const Acc row_lse = static_cast<Acc>(lse[head * table.q_rows + row]);
          // A row that saw no key has lse = -inf and contributes nothing.
          if (keys.size() == 0 || !std::isfinite(row_lse)) continue;
          const int64_t begin = keys.begin + key_offset;
          const int64_t end = keys.end + key_offset;
          Acc delta = 0;  // dO . O, the softmax-gradient correction of this row
          for (int64_t d = 0; d < dim; ++d) s.query[d] = detail::load<Acc>(q, row, head, d);
          for (int64_t d = 0; d < v_dim; ++d) {
            s.dout[d] = detail::load<Acc>(dout, row, head, d);
            delta += s.dout[d] * detail::load<Acc>(out, row, head, d);
          }
          detail::scaled_scores(s.query.data(), s.keys_by_dim.data(), span, dim, begin, end, scale, s.scores.data());
          for (int64_t j = begin; j < end; ++j) s.probs[j] = std::exp(s.scores[j] - row_lse);
          // The sink's gradient. With z_h the sink and L = log(sum_j exp(s_j) + exp(z_h)) the
          // row's lse, P_j = exp(s_j - L) and P_sink = exp(z_h - L), so dP_j/dz_h = -P_j P_sink.
          // O = sum_j P_j V_j gives d(loss)/dz_h = sum_j (dO . V_j)(-P_j P_sink)
          // = -P_sink (dO . O) = -P_sink * delta: the same delta as dS below, which is
          // unchanged by the sink (the sink has no value, so its dP is 0).
          if (dsinks) {
            group_dsink[static_cast<size_t>(head * num_groups + item % num_groups)] -=
                std::exp(static_cast<Acc>(sinks[head]) - row_lse) * delta;
          }
          // dP = dO . V, then dS = P * (dP - delta).
          detail::scaled_scores(s.dout.data(), s.values_by_dim.data(), span, v_dim, begin, end, Acc(1),
                                s.dscores.data());
          for (int64_t j = begin; j < end; ++j) s.dscores[j] = s.probs[j] * (s.dscores[j] - delta);
          std::fill(s.dquery.begin(), s.dquery.end(), Acc(0));
          accumulate_row_gradients(begin, end, dim, v_dim, scale, s.dscores.data(), s.probs.data(), s.keys_by_row.data(),
                                   s.query.data(), s.dout.data(), s.dquery.data(), s.dkeys.data(), s.dvalues.data());
          const size_t base = static_cast<size_t>(dq.offset(row, head, 0));
          for (int64_t d = 0; d < dim; ++d) {
            store_from_float(dq.data, dq.dtype, base + d, static_cast<float>(scale * s.dquery[d]));
          }
        }
      }
    }
    for (int64_t j = 0; j < span; ++j) {
      const size_t dk_base = static_cast<size_t>(dk.offset(kg.first_row + j, kv_head, 0));
      const size_t dv_base = static_cast<size_t>(dv.offset(kg.first_row + j, kv_head, 0));
      for (int64_t d = 0; d < dim; ++d) {
        store_from_float(dk.data, dk.dtype, dk_base + d, static_cast<float>(s.dkeys[j * dim + d]));
      }
      for (int64_t d = 0; d < v_dim; ++d) {
        store_from_float(dv.data, dv.dtype, dv_base + d, static_cast<float>(s.dvalues[j * v_dim + d]));
      }
    }
  });
  if (dsinks) {
    for (int64_t head = 0; head < q_heads; ++head) {
      Acc sum = 0;
      for (int64_t g = 0; g < num_groups; ++g) sum += group_dsink[static_cast<size_t>(head * num_groups + g)];
      dsinks[head] = static_cast<float>(sum);
    }
  }
}

}  // namespace

void attention_backward(const SegmentTable& table, const BackwardTensors& t, const AttentionOptions& options) {
  detail::check_qkv(table, t.q, t.k, t.v);
  const ThdShape out_side = detail::out_shape(table, t.q, t.v);
  const DType dtype = t.q.dtype;
  detail::check_tensor("out", t.out, out_side, dtype);
  detail::check_tensor("dout", t.dout, out_side, dtype);
  detail::check_tensor("dq", t.dq, detail::q_shape(table, t.q), dtype, /*or_fp32=*/true);
  detail::check_tensor("dk", t.dk, detail::k_shape(table, t.q, t.k), dtype, /*or_fp32=*/true);
  detail::check_tensor("dv", t.dv, detail::v_shape(table, t.k, t.v), dtype, /*or_fp32=*/true);
  check_outputs_apart({{"dq", t.dq}, {"dk", t.dk}, {"dv", t.dv}},
                      {{"q", t.q}, {"k", t.k}, {"v", t.v}, {"out", t.out}, {"dout", t.dout}});
  THDCP_CHECK(t.lse != nullptr,
              "lse must point to the forward's Hq * q_rows = " << t.q.heads * table.q_rows << " floats");
  THDCP_CHECK(t.dkv_rows == nullptr, "dkv_rows is set: the CPU reference writes dk/dv in row order; leave it null");
  THDCP_CHECK(t.dsinks == nullptr || t.sinks != nullptr,
              "dsinks is set but sinks is null: pass the forward's sinks to get their gradient");
  detail::check_sinks(t.sinks, t.q.heads);
  resolve_softmax_scale(options.softmax_scale, t.q.head_dim);
  if (options.accumulate == Accumulate::kFloat64) {
    backward_impl<double>(table, t.q, t.k, t.v, t.out, t.dout, t.lse, t.dq, t.dk, t.dv, t.sinks, t.dsinks, options);
  } else {
    backward_impl<float>(table, t.q, t.k, t.v, t.out, t.dout, t.lse, t.dq, t.dk, t.dv, t.sinks, t.dsinks, options);
  }
}

void attention_backward(const SegmentTable& table, ConstThdTensor q, ConstThdTensor k, ConstThdTensor v,
                        ConstThdTensor out, ConstThdTensor dout, const float* lse, ThdTensor dq, ThdTensor dk,
                        ThdTensor dv, const AttentionOptions& options) {
  attention_backward(table, BackwardTensors{q, k, v, out, dout, lse, dq, dk, dv}, options);
}

}  // namespace thdcp::cpu
