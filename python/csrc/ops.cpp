// The thdcp operators of the PyTorch package: their schemas (TORCH_LIBRARY), the CPU
// implementations (the reference backend, thdcp::cpu) and the host-only helpers. The CUDA
// implementations are in ops_cuda.cpp; the fake (meta) implementations and the autograd
// formulas in python/thdcp/ops.py.
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "common.h"
#include "thdcp/cpu/attention.h"
#include "thdcp/cpu/rope.h"
#include "thdcp/plan/capacity.h"
#include "thdcp/plan/layout.h"
#include "thdcp/plan/layout_balance.h"
#include "thdcp/plan/planner.h"
#include "thdcp/plan/rank_split.h"
#include "thdcp/plan/segment_table.h"

namespace thdcp::torch_ops {
namespace {

using Outputs3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using Outputs4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// The layout of host metadata, checked against a tensor of total_rows rows (cp = 0: no
// alignment rule, a single-device call).
LayoutView host_layout(const at::Tensor& cu_seqlens, const at::Tensor& cu_seqlens_padded, int64_t total_rows,
                       int cp) {
  TORCH_CHECK_VALUE(cu_seqlens.numel() == cu_seqlens_padded.numel(), "thdcp: cu_seqlens has ", cu_seqlens.numel(),
                    " entries but cu_seqlens_padded has ", cu_seqlens_padded.numel(), "; pass one per sequence + 1");
  LayoutView layout;
  layout.cu_seqlens = cu_seqlens.data_ptr<int32_t>();
  layout.cu_seqlens_padded = cu_seqlens_padded.data_ptr<int32_t>();
  layout.num_seqs = static_cast<int>(cu_seqlens.numel() - 1);
  validate_layout(layout, total_rows, cp);
  return layout;
}

Outputs3 attention_forward_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& cu_seqlens, const at::Tensor& cu_seqlens_padded, int64_t window_left,
                               int64_t window_right, double softmax_scale, bool return_max_logit,
                               const std::optional<at::Tensor>& sinks) {
  return translate_errors("attention", [&] {
    const at::Device device = q.device();
    check_same_device(k, "k", device);
    check_same_device(v, "v", device);
    check_metadata(cu_seqlens, "cu_seqlens", device);
    check_metadata(cu_seqlens_padded, "cu_seqlens_padded", device);
    const Mask mask = window_mask(window_left, window_right);
    // Views (packed QKV, head-major K/V) are read as they are.
    const at::Tensor qc = thd_input(q), kc = thd_input(k), vc = thd_input(v);
    const ConstThdTensor qv = const_view(qc, "q"), kv = const_view(kc, "k"), vv = const_view(vc, "v");
    const float* sink_logits = sinks_data(sinks, q);
    const LayoutView layout = host_layout(cu_seqlens, cu_seqlens_padded, q.size(0), 0);
    const SegmentTable table = build_segment_table(layout, mask);
    // out has v's head dim (D_v, MLA's 128 beside D_qk 192).
    at::Tensor out = at::empty({q.size(0), q.size(1), v.size(2)}, q.options());
    at::Tensor lse = at::empty({q.size(1), q.size(0)}, q.options().dtype(at::kFloat));
    at::Tensor max_logit = at::empty({return_max_logit ? q.size(1) : 0}, q.options().dtype(at::kFloat));
    AttentionOptions options;
    options.softmax_scale = static_cast<float>(softmax_scale);
    cpu::attention_forward(table,
                           ForwardTensors{qv, kv, vv, view(out, "out"), lse.data_ptr<float>(),
                                          return_max_logit ? max_logit.data_ptr<float>() : nullptr, sink_logits},
                           options);
    return Outputs3{out, lse, max_logit};
  });
}

Outputs4 attention_backward_cpu(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& out, const at::Tensor& lse, const at::Tensor& cu_seqlens,
                                const at::Tensor& cu_seqlens_padded, int64_t window_left, int64_t window_right,
                                double softmax_scale, bool /*deterministic: the CPU backend always is*/,
                                const std::optional<at::Tensor>& sinks) {
  return translate_errors("attention backward", [&] {
    const at::Device device = q.device();
    for (auto [t, name] : {std::pair{&dout, "dout"}, {&k, "k"}, {&v, "v"}, {&out, "out"}, {&lse, "lse"}}) {
      check_same_device(*t, name, device);
    }
    check_metadata(cu_seqlens, "cu_seqlens", device);
    check_metadata(cu_seqlens_padded, "cu_seqlens_padded", device);
    TORCH_CHECK_VALUE(lse.scalar_type() == at::kFloat && lse.is_contiguous() &&
                          lse.numel() == q.size(0) * q.size(1),
                      "thdcp: lse must be the forward's float32 [heads, tokens] tensor; got ", lse.scalar_type(), " ",
                      lse.sizes());
    const Mask mask = window_mask(window_left, window_right);
    const LayoutView layout = host_layout(cu_seqlens, cu_seqlens_padded, q.size(0), 0);
    const SegmentTable table = build_segment_table(layout, mask);
    const at::Tensor qc = thd_input(q), kc = thd_input(k), vc = thd_input(v), oc = thd_input(out),
                     dc = thd_input(dout);
    BackwardTensors t;
    t.q = const_view(qc, "q");
    t.k = const_view(kc, "k");
    t.v = const_view(vc, "v");
    t.out = const_view(oc, "out");
    t.dout = const_view(dc, "dout");
    t.lse = lse.data_ptr<float>();
    t.sinks = sinks_data(sinks, q);
    at::Tensor dq = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
    at::Tensor dk = at::empty(k.sizes(), k.options().memory_format(at::MemoryFormat::Contiguous));
    at::Tensor dv = at::empty(v.sizes(), v.options().memory_format(at::MemoryFormat::Contiguous));
    at::Tensor dsinks = dsinks_output(sinks, q);
    t.dq = view(dq, "dq");
    t.dk = view(dk, "dk");
    t.dv = view(dv, "dv");
    t.dsinks = sinks ? dsinks.data_ptr<float>() : nullptr;
    AttentionOptions options;
    options.softmax_scale = static_cast<float>(softmax_scale);
    cpu::attention_backward(table, t, options);
    return Outputs4{dq, dk, dv, dsinks};
  });
}

at::Tensor rope_cpu(const at::Tensor& x, const at::Tensor& cu_seqlens, const at::Tensor& cu_seqlens_padded,
                    const std::optional<at::Tensor>& start_offsets, int64_t cp, int64_t rank, double theta,
                    int64_t rotary_dim, bool interleaved, bool backward, const std::string& layout_name) {
  return translate_errors("rope", [&] {
    check_rope_arguments(x, cu_seqlens, cu_seqlens_padded, start_offsets, cp, rank);
    const CpLayout cp_layout = cp_layout_argument(layout_name);
    // cp = 1 takes any padding (the position is the row minus its sequence start); the
    // contiguous layout any padding with T a multiple of cp.
    const bool any_padding = cp == 1 || cp_layout == CpLayout::kContiguous;
    const LayoutView layout =
        host_layout(cu_seqlens, cu_seqlens_padded, x.size(0) * cp, any_padding ? 0 : static_cast<int>(cp));
    const RopeConfig config = rope_config(theta, rotary_dim, interleaved);
    at::Tensor y = x.clone(at::MemoryFormat::Contiguous);
    const int32_t* offsets = start_offsets ? start_offsets->data_ptr<int32_t>() : nullptr;
    (backward ? cpu::rope_backward : cpu::rope_forward)(layout, static_cast<int>(cp), static_cast<int>(rank), config,
                                                        view(y, "x"), offsets, RopeTable{}, cp_layout);
    return y;
  });
}

// A layout as the layout ops return it: cu_seqlens then cu_seqlens_padded, in one list.
std::vector<int64_t> offsets_back_to_back(const BatchLayout& layout) {
  std::vector<int64_t> both(layout.cu_seqlens.begin(), layout.cu_seqlens.end());
  both.insert(both.end(), layout.cu_seqlens_padded.begin(), layout.cu_seqlens_padded.end());
  return both;
}

// The names of the CP layouts, the default first.
std::vector<std::string> cp_layouts_op() {
  std::vector<std::string> names;
  for (const CpLayout layout : kCpLayouts) names.emplace_back(cp_layout_name(layout));
  return names;
}

// (max_tokens, max_seqs) of the zero-fallback capacity for a global batch of max_tokens
// rows at CP size cp (thdcp/plan/capacity.h).
std::vector<int64_t> default_capacity_op(int64_t max_tokens, int64_t cp) {
  return translate_errors("default_capacity", [&] {
    const Capacity c = default_capacity(max_tokens, to_int(cp, "cp"));
    return std::vector<int64_t>{c.max_tokens, c.max_seqs};
  });
}

// Whether documents of `lengths` fit a capacity at CP size cp: 0 fits, 1 too many
// sequences, 2 too many tokens (thdcp::Fit).
int64_t check_fit_op(const std::vector<int64_t>& lengths, int64_t cp, int64_t max_tokens, int64_t max_seqs) {
  return translate_errors("check_fit", [&] {
    Capacity c;
    c.max_tokens = max_tokens;
    c.max_seqs = to_int(max_seqs, "max_seqs");
    return static_cast<int64_t>(check_fit(lengths, to_int(cp, "cp"), c));
  });
}

// The capacity a graph bank runs a batch at (thdcp/plan/capacity.h, choose_capacity): of the
// buckets (max_tokens[i], max_seqs[i]) at CP size cp, [bucket max_tokens, bucket max_seqs,
// run max_tokens, run max_seqs, fallback 0/1].
std::vector<int64_t> choose_capacity_op(const std::vector<int64_t>& lengths, int64_t cp,
                                        const std::vector<int64_t>& max_tokens, const std::vector<int64_t>& max_seqs) {
  return translate_errors("choose_capacity", [&] {
    TORCH_CHECK_VALUE(max_tokens.size() == max_seqs.size(), "thdcp.choose_capacity: ", max_tokens.size(),
                      " max_tokens but ", max_seqs.size(), " max_seqs; pass one of each per bucket");
    std::vector<Capacity> buckets;
    for (size_t i = 0; i < max_tokens.size(); ++i) {
      const std::string name = "max_seqs[" + std::to_string(i) + "]";
      buckets.push_back(Capacity{to_int(max_seqs[i], name.c_str()), max_tokens[i]});
    }
    const CapacityChoice c = choose_capacity(buckets, lengths, to_int(cp, "cp"));
    return std::vector<int64_t>{c.bucket.max_tokens, c.bucket.max_seqs, c.run.max_tokens, c.run.max_seqs,
                                c.fallback ? 1 : 0};
  });
}

// The capacity-form layout of `lengths` (cu_seqlens then cu_seqlens_padded, max_seqs + 1
// entries each) at CP size cp.
// The capacity form of a batch under the CP layout named `layout` (dual chunk: documents
// padded to 2*cp, zero-length ones dropped; contiguous: no padding but the last
// placeholder's).
std::vector<int64_t> capacity_layout_op(const std::vector<int64_t>& lengths, int64_t cp, int64_t max_tokens,
                                        int64_t max_seqs, const std::string& layout) {
  return translate_errors("capacity_layout", [&] {
    Capacity c;
    c.max_tokens = max_tokens;
    c.max_seqs = to_int(max_seqs, "max_seqs");
    const int ranks = to_int(cp, "cp");
    return offsets_back_to_back(cp_layout_argument(layout) == CpLayout::kContiguous
                                    ? make_contiguous_layout(lengths, ranks, c)
                                    : capacity_layout(lengths, ranks, c));
  });
}

// Global padded row of every local row of `rank` of `cp` (int64 [T / cp], local order) under
// the CP layout named `layout`, from the global layout's cu_seqlens_padded (CPU int32; dual
// chunk: every P_b a multiple of 2*cp; contiguous: T a multiple of cp).
at::Tensor cp_rank_rows_op(const at::Tensor& cu_seqlens_padded, int64_t cp, int64_t rank,
                           const std::string& layout) {
  return translate_errors("cp_rank_rows", [&] {
    TORCH_CHECK_VALUE(cu_seqlens_padded.device().is_cpu(), "thdcp: cu_seqlens_padded is on ",
                      cu_seqlens_padded.device(), "; cp_rank_rows reads it on the host: pass a CPU tensor");
    check_metadata(cu_seqlens_padded, "cu_seqlens_padded", at::Device(at::kCPU));
    TORCH_CHECK_VALUE(cp >= 1 && cp <= INT32_MAX && rank >= 0 && rank < cp, "thdcp: cp=", cp, ", rank=", rank,
                      "; pass cp in [1, ", INT32_MAX, "] and a rank in [0, cp)");
    const CpLayout cp_layout = cp_layout_argument(layout);
    LayoutView offsets;
    offsets.cu_seqlens = cu_seqlens_padded.data_ptr<int32_t>();  // only the padded offsets matter here
    offsets.cu_seqlens_padded = cu_seqlens_padded.data_ptr<int32_t>();
    offsets.num_seqs = static_cast<int>(cu_seqlens_padded.numel() - 1);
    // rank_row_map checks the offsets against the layout's rule (validate_cp_layout).
    const std::vector<int32_t> map =
        rank_row_map(offsets, static_cast<int>(cp), static_cast<int>(rank), cp_layout);
    at::Tensor rows = at::empty({static_cast<int64_t>(map.size())}, at::TensorOptions().dtype(at::kLong));
    int64_t* out = rows.data_ptr<int64_t>();
    for (size_t i = 0; i < map.size(); ++i) out[i] = map[i];
    return rows;
  });
}

// The planner's recommendation (thdcp plan) for batches of documents: `lengths` holds every
// batch's document lengths back to back, `batch_sizes` how many belong to each batch.
// Returns (max_seqs, fallback_fraction, reason) of the recommended capacity at CP size cp.
std::tuple<int64_t, double, std::string> plan_capacity_op(const std::vector<int64_t>& lengths,
                                                          const std::vector<int64_t>& batch_sizes, int64_t tokens,
                                                          int64_t cp, double fallback_budget) {
  return translate_errors("plan_capacity", [&] {
    DocumentBatches batches;
    batches.source = "thdcp.plan_capacity";
    size_t next = 0;
    for (size_t b = 0; b < batch_sizes.size(); ++b) {
      TORCH_CHECK_VALUE(batch_sizes[b] >= 0 && next + static_cast<size_t>(batch_sizes[b]) <= lengths.size(),
                        "thdcp.plan_capacity: batch ", b, " has ", batch_sizes[b], " documents but only ",
                        lengths.size() - next, " lengths are left");
      batches.batches.emplace_back(lengths.begin() + static_cast<std::ptrdiff_t>(next),
                                   lengths.begin() + static_cast<std::ptrdiff_t>(next + batch_sizes[b]));
      next += static_cast<size_t>(batch_sizes[b]);
    }
    TORCH_CHECK_VALUE(next == lengths.size(), "thdcp.plan_capacity: ", lengths.size() - next,
                      " lengths belong to no batch; batch sizes must add up to the lengths given");
    PlanOptions options;
    options.tokens = tokens;
    options.cp_sizes = {to_int(cp, "cp")};
    options.fallback_budget = fallback_budget;
    const CapacityPlan plan = plan_capacity(batches, options);
    const CpPlan& per_cp = plan.per_cp.at(0);
    const CapacityCandidate& chosen = per_cp.candidates.at(static_cast<size_t>(per_cp.recommended));
    return std::tuple<int64_t, double, std::string>{chosen.max_seqs, chosen.fallback_fraction,
                                                    chosen.label + ": " + per_cp.reason};
  });
}

// The layout of documents of `lengths` packed back to back for the CP layout named `layout`
// (cu_seqlens then cu_seqlens_padded, B + 1 entries each): dual chunk, each padded to a
// multiple of 2*cp (make_layout); contiguous, no padding of their own, the last one padded so
// that the rows are a multiple of cp (make_contiguous_layout).
std::vector<int64_t> make_layout_op(const std::vector<int64_t>& lengths, int64_t cp, const std::string& layout) {
  return translate_errors("make_layout", [&] {
    const int ranks = to_int(cp, "cp");
    return offsets_back_to_back(cp_layout_argument(layout) == CpLayout::kContiguous
                                    ? make_contiguous_layout(lengths, ranks)
                                    : make_layout(lengths, ranks));
  });
}

int64_t choose_cp_size_op(const std::vector<int64_t>& lengths, const std::vector<int64_t>& sizes,
                          int64_t rows_per_rank) {
  return translate_errors("choose_cp_size", [&] {
    std::vector<int> s;
    for (size_t i = 0; i < sizes.size(); ++i) {
      s.push_back(to_int(sizes[i], ("sizes[" + std::to_string(i) + "]").c_str()));
    }
    return static_cast<int64_t>(choose_cp_size(lengths, s, rows_per_rank));
  });
}

}  // namespace
}  // namespace thdcp::torch_ops

TORCH_LIBRARY(thdcp, m) {
  using namespace thdcp::torch_ops;
  m.def(
      "attention_forward(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens, Tensor cu_seqlens_padded, "
      "int window_left, int window_right, float softmax_scale, bool return_max_logit, Tensor? sinks=None) "
      "-> (Tensor, Tensor, Tensor)");
  // Returns (dq, dk, dv, dsinks): dsinks float32 [Hq] with sinks, else [0].
  m.def(
      "attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor cu_seqlens, "
      "Tensor cu_seqlens_padded, int window_left, int window_right, float softmax_scale, bool deterministic, "
      "Tensor? sinks=None) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "rope(Tensor x, Tensor cu_seqlens, Tensor cu_seqlens_padded, Tensor? start_offsets, int cp, int rank, "
      "float theta, int rotary_dim, bool interleaved, bool backward, str layout='dual_chunk') -> Tensor");
  m.def(
      "cp_attention_forward(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens, Tensor cu_seqlens_padded, int comm, "
      "int window_left, int window_right, float softmax_scale, bool return_max_logit, Tensor? sinks=None, "
      "str layout='dual_chunk', str cp_comm='all_gather', int a2a_size=1, str reduce_dtype='fp32', "
      "int head_slices=1) -> (Tensor, Tensor, Tensor)");
  // Returns (dq, dk, dv, dsinks) as attention_backward does; dsinks summed over the ranks.
  m.def(
      "cp_attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor cu_seqlens, "
      "Tensor cu_seqlens_padded, int comm, int window_left, int window_right, float softmax_scale, "
      "Tensor? sinks=None, str layout='dual_chunk', str cp_comm='all_gather', int a2a_size=1, "
      "str reduce_dtype='fp32', int head_slices=1) -> (Tensor, Tensor, Tensor, Tensor)");
  // Host helpers (called outside compiled regions; no tensors on the device).
  m.def("default_capacity(int max_tokens, int cp) -> int[]", &default_capacity_op);
  m.def("check_fit(int[] lengths, int cp, int max_tokens, int max_seqs) -> int", &check_fit_op);
  m.def("capacity_layout(int[] lengths, int cp, int max_tokens, int max_seqs, str layout='dual_chunk') -> int[]",
        &capacity_layout_op);
  m.def("choose_capacity(int[] lengths, int cp, int[] max_tokens, int[] max_seqs) -> int[]", &choose_capacity_op);
  m.def("cp_layouts() -> str[]", &cp_layouts_op);
  m.def("cp_rank_rows(Tensor cu_seqlens_padded, int cp, int rank, str layout='dual_chunk') -> Tensor",
        &cp_rank_rows_op);
  m.def("plan_capacity(int[] lengths, int[] batch_sizes, int tokens, int cp, float fallback_budget) "
        "-> (int, float, str)",
        &plan_capacity_op);
  m.def("make_layout(int[] lengths, int cp, str layout='dual_chunk') -> int[]", &make_layout_op);
  m.def("choose_cp_size(int[] lengths, int[] sizes, int rows_per_rank) -> int", &choose_cp_size_op);
  m.def("built_with_cuda() -> bool", [] {
#ifdef THDCP_TORCH_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
}

TORCH_LIBRARY_IMPL(thdcp, CPU, m) {
  using namespace thdcp::torch_ops;
  m.impl("attention_forward", &attention_forward_cpu);
  m.impl("attention_backward", &attention_backward_cpu);
  m.impl("rope", &rope_cpu);
}
