#include <algorithm>
#include <chrono>
#include <functional>
#include <cstring>
#include <string>
#include <vector>

#include "thdcp/cp/cp.h"
#include "thdcp/plan/rank_split.h"
#include "thdcp/core/error.h"
#include "thdcp/plan/segment_table.h"

namespace thdcp::cp {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// What every rank must agree on, exchanged before any data moves.
struct RankDescriptor {
  int32_t ok;
  int32_t dtype;
  int64_t total_rows;
  int64_t num_seqs;
  int64_t layout_hash;
  int64_t q_tokens, k_tokens, v_tokens;
  int64_t q_heads, kv_heads, head_dim;
  int32_t window_left, window_right;
  char message[384];
};

int64_t hash_layout(const LayoutView& layout) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over both offset arrays
  for (int b = 0; b <= layout.num_seqs; ++b) {
    for (int32_t x : {layout.cu_seqlens[b], layout.cu_seqlens_padded[b]}) {
      h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
    }
  }
  return static_cast<int64_t>(h);
}

// Runs `local_checks` on this rank, exchanges the outcome and the shapes with every rank,
// and throws on all ranks alike if any rank failed or the ranks disagree.
void check_collectively(Communicator& comm, const LayoutView& layout, const Mask& mask, const ConstThdTensor& q,
                        const ConstThdTensor& k, const ConstThdTensor& v, const std::function<void()>& local_checks) {
  RankDescriptor mine{};
  mine.ok = 1;
  try {
    THDCP_CHECK(layout.cu_seqlens != nullptr && layout.cu_seqlens_padded != nullptr && layout.num_seqs >= 1,
                "the layout needs cu_seqlens and cu_seqlens_padded with at least 2 entries");
    validate_layout(layout, layout.total_rows(), comm.size());
    local_checks();
    mine.total_rows = layout.total_rows();
    mine.num_seqs = layout.num_seqs;
    mine.layout_hash = hash_layout(layout);
  } catch (const Error& e) {
    mine.ok = 0;
    std::strncpy(mine.message, e.what(), sizeof(mine.message) - 1);
  }
  mine.dtype = static_cast<int32_t>(q.dtype);
  mine.q_tokens = q.tokens;
  mine.k_tokens = k.tokens;
  mine.v_tokens = v.tokens;
  mine.q_heads = q.heads;
  mine.kv_heads = k.heads;
  mine.head_dim = q.head_dim;
  mine.window_left = mask.window_left;
  mine.window_right = mask.window_right;

  std::vector<RankDescriptor> all(static_cast<size_t>(comm.size()));
  comm.all_gather(&mine, all.data(), sizeof(RankDescriptor));
  for (int r = 0; r < comm.size(); ++r) {
    // The failing rank's message already carries its location; the others say whose it is.
    if (!all[r].ok) throw Error((r == comm.rank() ? "" : "rank " + std::to_string(r) + ": ") + all[r].message);
  }
  const RankDescriptor& ref = all[0];
  for (int r = 1; r < comm.size(); ++r) {
    const RankDescriptor& d = all[r];
    THDCP_CHECK(d.total_rows == ref.total_rows && d.num_seqs == ref.num_seqs && d.layout_hash == ref.layout_hash,
                "rank " << r << " passed a different layout than rank 0 (T=" << d.total_rows << " vs " << ref.total_rows
                        << ", " << d.num_seqs << " vs " << ref.num_seqs
                        << " sequences): every rank must pass the same global cu_seqlens and cu_seqlens_padded");
    THDCP_CHECK(d.q_tokens == ref.q_tokens && d.k_tokens == ref.k_tokens && d.v_tokens == ref.v_tokens &&
                    d.q_heads == ref.q_heads && d.kv_heads == ref.kv_heads && d.head_dim == ref.head_dim &&
                    d.dtype == ref.dtype,
                "rank " << r << " passed tensors of another shape or dtype than rank 0 (q " << d.q_tokens << "x"
                        << d.q_heads << "x" << d.head_dim << " vs " << ref.q_tokens << "x" << ref.q_heads << "x"
                        << ref.head_dim << "): every rank must pass its T/cp local rows of the same tensors");
    THDCP_CHECK(d.window_left == ref.window_left && d.window_right == ref.window_right,
                "rank " << r << " passed mask (" << d.window_left << "," << d.window_right << ") but rank 0 passed ("
                        << ref.window_left << "," << ref.window_right << "): every rank must use the same mask");
  }
}

void check_local(const char* name, const ConstThdTensor& t, int64_t rows) {
  THDCP_CHECK(t.tokens == rows, name << " has " << t.tokens << " rows but this rank holds T/cp=" << rows
                                     << " rows of the layout: pass the rank's local tensor (thdcp::split_for_rank)");
}

// Gathers a local [T/cp, H, D] tensor from every rank and reorders it into sequence order
// ([T, H, D], the global padded layout).
std::vector<unsigned char> gather_in_sequence_order(Communicator& comm, const ConstThdTensor& local,
                                                    const std::vector<std::vector<int32_t>>& maps, Timings* timings) {
  const size_t row_bytes = local.row_bytes();
  const size_t local_bytes = static_cast<size_t>(local.tokens) * row_bytes;
  std::vector<unsigned char> gathered(local_bytes * comm.size());
  auto start = Clock::now();
  comm.all_gather(local.data, gathered.data(), local_bytes);
  if (timings) timings->gather += seconds_since(start);
  start = Clock::now();
  std::vector<unsigned char> ordered(gathered.size());
  for (int r = 0; r < comm.size(); ++r) scatter_rows(gathered.data() + r * local_bytes, ordered.data(), maps[r], row_bytes);
  if (timings) timings->reorder += seconds_since(start);
  return ordered;
}

std::vector<std::vector<int32_t>> all_rank_maps(const LayoutView& layout, int cp) {
  std::vector<std::vector<int32_t>> maps;
  for (int r = 0; r < cp; ++r) maps.push_back(rank_row_map(layout, cp, r));
  return maps;
}

}  // namespace

void forward(Communicator& comm, const LayoutView& layout, const Mask& mask, ConstThdTensor q, ConstThdTensor k,
             ConstThdTensor v, ThdTensor out, float* lse, float* max_logit, const AttentionOptions& options,
             Timings* timings) {
  auto start = Clock::now();
  const int cp = comm.size();
  check_collectively(comm, layout, mask, q, k, v, [&] {
    const int64_t local_rows = layout.total_rows() / cp;
    check_local("q", q, local_rows);
    check_local("k", k, local_rows);
    check_local("v", v, local_rows);
    check_local("out", out, local_rows);
    THDCP_CHECK(lse != nullptr, "lse must point to Hq * T/cp floats");
  });
  const std::vector<std::vector<int32_t>> maps = all_rank_maps(layout, cp);
  const SegmentTable table = build_cp_segment_table(layout, cp, comm.rank(), mask);
  if (timings) timings->check += seconds_since(start);

  const std::vector<unsigned char> k_seq = gather_in_sequence_order(comm, k, maps, timings);
  const std::vector<unsigned char> v_seq = gather_in_sequence_order(comm, v, maps, timings);
  const ConstThdTensor k_full(k_seq.data(), k.dtype, layout.total_rows(), k.heads, k.head_dim);
  const ConstThdTensor v_full(v_seq.data(), v.dtype, layout.total_rows(), v.heads, v.head_dim);

  start = Clock::now();
  cpu::attention_forward(table, q, k_full, v_full, out, lse, max_logit, options);
  if (timings) timings->attention += seconds_since(start);

  if (max_logit) {
    start = Clock::now();
    comm.all_reduce_max(max_logit, static_cast<size_t>(q.heads));
    if (timings) timings->reduce += seconds_since(start);
  }
}

void backward(Communicator& comm, const LayoutView& layout, const Mask& mask, ConstThdTensor q, ConstThdTensor k,
              ConstThdTensor v, ConstThdTensor out, ConstThdTensor dout, const float* lse, ThdTensor dq, ThdTensor dk,
              ThdTensor dv, const AttentionOptions& options, Timings* timings) {
  auto start = Clock::now();
  const int cp = comm.size();
  check_collectively(comm, layout, mask, q, k, v, [&] {
    const int64_t local_rows = layout.total_rows() / cp;
    check_local("q", q, local_rows);
    check_local("k", k, local_rows);
    check_local("v", v, local_rows);
    check_local("out", out, local_rows);
    check_local("dout", dout, local_rows);
    check_local("dq", dq, local_rows);
    check_local("dk", dk, local_rows);
    check_local("dv", dv, local_rows);
    THDCP_CHECK(dk.heads == k.heads && dk.head_dim == k.head_dim && dv.heads == k.heads && dv.head_dim == k.head_dim,
                "dk/dv must have k's shape [T/cp, " << k.heads << ", " << k.head_dim << "]");
    THDCP_CHECK((dk.dtype == k.dtype || dk.dtype == DType::kFloat32) &&
                    (dv.dtype == k.dtype || dv.dtype == DType::kFloat32),
                "dk/dv must have k's dtype (" << dtype_name(k.dtype) << ") or fp32");
    THDCP_CHECK(lse != nullptr, "lse must point to the forward's Hq * T/cp floats");
  });
  const std::vector<std::vector<int32_t>> maps = all_rank_maps(layout, cp);
  const SegmentTable table = build_cp_segment_table(layout, cp, comm.rank(), mask);
  if (timings) timings->check += seconds_since(start);

  const std::vector<unsigned char> k_seq = gather_in_sequence_order(comm, k, maps, timings);
  const std::vector<unsigned char> v_seq = gather_in_sequence_order(comm, v, maps, timings);
  const int64_t total = layout.total_rows();
  const ConstThdTensor k_full(k_seq.data(), k.dtype, total, k.heads, k.head_dim);
  const ConstThdTensor v_full(v_seq.data(), v.dtype, total, v.heads, v.head_dim);

  // Partial dK/dV of this rank for every gathered row, in fp32.
  const size_t full_count = static_cast<size_t>(total * k.heads * k.head_dim);
  std::vector<float> dk_partial(full_count), dv_partial(full_count);
  start = Clock::now();
  cpu::attention_backward(table, q, k_full, v_full, out, dout, lse, dq,
                          ThdTensor{dk_partial.data(), DType::kFloat32, total, k.heads, k.head_dim},
                          ThdTensor{dv_partial.data(), DType::kFloat32, total, k.heads, k.head_dim}, options);
  if (timings) timings->attention += seconds_since(start);

  const size_t local_count = full_count / cp;
  const size_t row_bytes = static_cast<size_t>(k.heads * k.head_dim) * sizeof(float);
  std::vector<float> rank_ordered(full_count);
  std::vector<float> reduced(local_count);
  for (auto [partial, grad] : {std::make_pair(&dk_partial, &dk), std::make_pair(&dv_partial, &dv)}) {
    start = Clock::now();
    for (int r = 0; r < cp; ++r) gather_rows(partial->data(), rank_ordered.data() + r * local_count, maps[r], row_bytes);
    if (timings) timings->reorder += seconds_since(start);
    start = Clock::now();
    comm.reduce_scatter_sum(rank_ordered.data(), reduced.data(), local_count);
    for (size_t i = 0; i < local_count; ++i) store_from_float(grad->data, grad->dtype, i, reduced[i]);
    if (timings) timings->reduce += seconds_since(start);
  }
}

}  // namespace thdcp::cp
