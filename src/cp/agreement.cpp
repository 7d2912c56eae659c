#include "agreement.h"

#include <cstring>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "thdcp/core/error.h"
#include "thdcp/core/overlap.h"

namespace thdcp::cp::detail {

namespace {

// What one rank sends: plain data of a fixed size, the same on every platform of a job.
struct Descriptor {
  int32_t ok;
  int32_t cp;
  int32_t max_seqs;
  int32_t dtype;
  int64_t max_tokens;
  int32_t window_left, window_right;
  int32_t layout, comm, kv_gather, a2a_size, reduce_dtype, head_slices;
  int64_t q_heads, kv_heads, head_dim, v_head_dim;
  uint64_t options_fingerprint;
  uint64_t layout_fingerprint;
  int64_t local_rows[3];
  char message[400];
};

// The a2a_size values that would do for `p`: divisors of cp (that divide both head counts).
std::string a2a_sizes_for(const Problem& p, bool heads_too) {
  std::string list;
  for (int a = 1; a <= p.cp; ++a) {
    if (p.cp % a != 0 || (heads_too && (p.q_heads % a != 0 || p.kv_heads % a != 0))) continue;
    list += (list.empty() ? "" : ", ") + std::to_string(a);
  }
  return "{" + list + "}";
}

// a2a+ag factors cp into a2a_size * ag_size; other comms leave a2a_size at 1.
void check_a2a_size(const Problem& p) {
  if (p.comm != CpComm::kA2aAg) {
    THDCP_CHECK(p.a2a_size == 1, "a2a_size=" << p.a2a_size << " with comm=" << cp_comm_name(p.comm)
                                             << ": a2a_size is the all-to-all group of comm=a2a+ag; use comm=a2a+ag, "
                                                "or leave a2a_size=1");
    return;
  }
  THDCP_CHECK(p.a2a_size >= 1 && p.cp >= 1 && p.cp % p.a2a_size == 0,
              "a2a+ag with a2a_size=" << p.a2a_size << " and cp=" << p.cp
                                      << ": the group sizes do not multiply to cp (cp = a2a_size * ag_size ranks); "
                                         "use an a2a_size that divides cp: "
                                      << a2a_sizes_for(p, false));
}

// Head slices: all_to_all's (a divisor of both head counts per rank) and all_gather's (a
// divisor of both head counts; the whole gather).
void check_head_slices(const Problem& p) {
  THDCP_CHECK(p.head_slices >= 1, "head_slices=" << p.head_slices << " must be >= 1 (1: every head at once)");
  if (p.head_slices == 1) return;
  THDCP_CHECK(p.comm == CpComm::kAllToAll || p.comm == CpComm::kAllGather,
              "head_slices=" << p.head_slices << " with comm=" << cp_comm_name(p.comm)
                             << ": slices are all_to_all's and all_gather's; leave head_slices=1");
  THDCP_CHECK(p.comm == CpComm::kAllToAll || p.kv_gather != KvGather::kHalo,
              "head_slices=" << p.head_slices
                             << " with kv_gather=halo: all_gather's slices gather the whole K/V, a slice of heads "
                                "at a time; use kv_gather=whole or auto (which then gathers the whole), or "
                                "head_slices=1");
  // Heads per rank under all_to_all, every head under all_gather.
  const bool per_rank = p.comm == CpComm::kAllToAll;
  const int64_t q = per_rank ? p.q_heads / p.cp : p.q_heads, kv = per_rank ? p.kv_heads / p.cp : p.kv_heads;
  const char* q_name = per_rank ? "q_heads/cp" : "q_heads";
  const char* kv_name = per_rank ? "kv_heads/cp" : "kv_heads";
  std::ostringstream fits;
  for (int64_t s = 1; s <= kv; ++s) {
    if (q % s == 0 && kv % s == 0) fits << (s == 1 ? "" : ", ") << s;
  }
  THDCP_CHECK(q % p.head_slices == 0 && kv % p.head_slices == 0,
              "head_slices=" << p.head_slices << " with " << q_name << "=" << q << " and " << kv_name << "=" << kv
                             << (per_rank ? " heads per rank" : " heads")
                             << ": each slice takes as many of both; use one of " << fits.str());
}

// Each rank of an all-to-all group takes heads/a2a_size of the query and of the key heads.
void check_a2a_heads(const Problem& p) {
  for (auto [name, heads] : {std::make_pair("q_heads", p.q_heads), std::make_pair("kv_heads", p.kv_heads)}) {
    THDCP_CHECK(heads % p.a2a_size == 0,
                "a2a+ag with " << name << "=" << heads << " and a2a_size=" << p.a2a_size << ": " << name
                               << " must be a multiple of a2a_size (each rank of an all-to-all group takes " << name
                               << "/a2a_size heads); use an a2a_size that divides cp=" << p.cp
                               << ", q_heads=" << p.q_heads << " and kv_heads=" << p.kv_heads << ": "
                               << a2a_sizes_for(p, true) << ", or comm=all_gather");
  }
}

}  // namespace

void validate_problem(const Problem& p) {
  THDCP_CHECK(p.cp >= 1, "cp=" << p.cp << " must be >= 1");
  THDCP_CHECK(p.capacity.max_seqs >= 1,
              "capacity.max_seqs=" << p.capacity.max_seqs << " must be >= 1 (layouts have max_seqs + 1 entries)");
  THDCP_CHECK(p.layout == CpLayout::kDualChunk || p.layout == CpLayout::kContiguous,
              "layout=" << static_cast<int>(p.layout) << " is not a CP layout: use dual_chunk or contiguous");
  THDCP_CHECK(p.comm == CpComm::kAllGather || p.comm == CpComm::kAllToAll || p.comm == CpComm::kA2aAg,
              "comm=" << static_cast<int>(p.comm)
                      << " is not a CP communication: use all_gather, all_to_all or a2a+ag");
  THDCP_CHECK(p.kv_gather == KvGather::kAuto || p.kv_gather == KvGather::kWhole || p.kv_gather == KvGather::kHalo,
              "kv_gather=" << static_cast<int>(p.kv_gather) << " is not a K/V gather: use auto, whole or halo");
  THDCP_CHECK(p.kv_gather != KvGather::kHalo || p.comm != CpComm::kAllToAll,
              "kv_gather=halo with comm=" << cp_comm_name(p.comm)
                                          << ": all_to_all moves heads, not K/V rows, so there is no halo to gather; "
                                             "use kv_gather=auto or whole, or comm=all_gather or a2a+ag");
  check_a2a_size(p);
  THDCP_CHECK(p.reduce_dtype == DType::kFloat32 || p.reduce_dtype == p.dtype,
              "reduce_dtype=" << dtype_name(p.reduce_dtype) << " with dtype=" << dtype_name(p.dtype)
                              << ": dK/dV partial sums cross ranks in fp32 (the default, the tightest) or in the "
                                 "problem's dtype (half the bytes); use reduce_dtype=fp32 or "
                              << dtype_name(p.dtype));
  if (p.layout == CpLayout::kDualChunk) {
    THDCP_CHECK(p.capacity.max_tokens >= 0 && p.capacity.max_tokens % (2 * static_cast<int64_t>(p.cp)) == 0,
                "capacity.max_tokens=" << p.capacity.max_tokens << " is not a multiple of 2*cp="
                                       << 2 * static_cast<int64_t>(p.cp)
                                       << " (layout=dual_chunk): pad the batch to a multiple of 2*cp rows, or use "
                                          "layout=contiguous, which needs only a multiple of cp");
  } else {
    THDCP_CHECK(p.capacity.max_tokens >= 0 && p.capacity.max_tokens % p.cp == 0,
                "capacity.max_tokens=" << p.capacity.max_tokens << " is not a multiple of cp=" << p.cp
                                       << " (layout=contiguous cuts the rows into cp equal pieces): pad the batch "
                                          "to a multiple of cp rows");
  }
  THDCP_CHECK(p.capacity.max_tokens <= INT32_MAX, "capacity.max_tokens=" << p.capacity.max_tokens
                                                                         << " must fit int32 offsets");
  THDCP_CHECK(p.mask.window_left >= -1 && p.mask.window_right >= -1,
              "mask (" << p.mask.window_left << "," << p.mask.window_right
                       << ") is invalid: each window is >= 0, or -1 for unbounded");
  check_head_shape(p);
  if (p.comm == CpComm::kA2aAg) check_a2a_heads(p);
  if (p.comm == CpComm::kAllToAll) {
    for (auto [name, heads] : {std::make_pair("q_heads", p.q_heads), std::make_pair("kv_heads", p.kv_heads)}) {
      THDCP_CHECK(heads % p.cp == 0, "all_to_all with " << name << "=" << heads << " and cp=" << p.cp << ": " << name
                                                        << " must be a multiple of cp (each rank takes " << name
                                                        << "/cp heads); use comm=all_gather, or a cp that divides "
                                                           "q_heads and kv_heads");
    }
  }
  check_head_slices(p);
}

namespace {

// The shapes of a rank's tensors: q and dq, out and dout (D_v), k and dk, v and dv (D_v).
ThdShape local_q(const Problem& p) { return ThdShape{p.local_rows(), "T/cp", p.q_heads, "q_heads", p.head_dim}; }
ThdShape local_out(const Problem& p) {
  return ThdShape{p.local_rows(), "T/cp", p.q_heads, "q_heads", p.value_head_dim(), "v_head_dim"};
}
ThdShape local_k(const Problem& p) { return ThdShape{p.local_rows(), "T/cp", p.kv_heads, "kv_heads", p.head_dim}; }
ThdShape local_v(const Problem& p) {
  return ThdShape{p.local_rows(), "T/cp", p.kv_heads, "kv_heads", p.value_head_dim(), "v_head_dim"};
}

void check_local(const char* name, const ConstThdTensor& t, const ThdShape& shape, DType dtype, bool or_fp32 = false) {
  check_thd_shape(name, t, shape);
  check_thd_dtype(name, t.dtype, dtype, or_fp32);
}

}  // namespace

void check_forward_tensors(const Problem& p, const ForwardTensors& t) {
  check_local("q", t.q, local_q(p), p.dtype);
  check_local("k", t.k, local_k(p), p.dtype);
  check_local("v", t.v, local_v(p), p.dtype);
  check_local("out", t.out, local_out(p), p.dtype);
  THDCP_CHECK(t.lse != nullptr || p.local_rows() * p.q_heads == 0, "lse is a null pointer: pass Hq * T/cp floats");
  check_outputs_apart({{"out", t.out}}, {{"q", t.q}, {"k", t.k}, {"v", t.v}});
}

void check_backward_tensors(const Problem& p, const BackwardTensors& t) {
  check_local("q", t.q, local_q(p), p.dtype);
  check_local("k", t.k, local_k(p), p.dtype);
  check_local("v", t.v, local_v(p), p.dtype);
  check_local("out", t.out, local_out(p), p.dtype);
  check_local("dout", t.dout, local_out(p), p.dtype);
  check_local("dq", t.dq, local_q(p), p.dtype, /*or_fp32=*/true);
  check_local("dk", t.dk, local_k(p), p.dtype, /*or_fp32=*/true);
  check_local("dv", t.dv, local_v(p), p.dtype, /*or_fp32=*/true);
  THDCP_CHECK(t.lse != nullptr || p.local_rows() * p.q_heads == 0,
              "lse is a null pointer: pass the forward's Hq * T/cp floats");
  THDCP_CHECK(t.dkv_rows == nullptr, "dkv_rows is set: a CP plan maps the gradients' rows itself; leave it null");
  check_outputs_apart({{"dq", t.dq}, {"dk", t.dk}, {"dv", t.dv}},
                      {{"q", t.q}, {"k", t.k}, {"v", t.v}, {"out", t.out}, {"dout", t.dout}});
}

uint64_t layout_fingerprint(const LayoutView& layout) {
  uint64_t h = 1469598103934665603ull;
  for (int b = 0; b <= layout.num_seqs; ++b) {
    for (int32_t x : {layout.cu_seqlens[b], layout.cu_seqlens_padded[b]}) {
      h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
    }
  }
  return h;
}

void agree(const AgreementInput& in, const std::function<void()>& local_checks, const ExchangeBytes& exchange) {
  Descriptor mine{};
  mine.ok = 1;
  try {
    validate_problem(in.problem);
    if (local_checks) local_checks();
  } catch (const Error& e) {
    mine.ok = 0;
    std::strncpy(mine.message, e.what(), sizeof(mine.message) - 1);
  }
  const Problem& p = in.problem;
  mine.cp = p.cp;
  mine.max_seqs = p.capacity.max_seqs;
  mine.dtype = static_cast<int32_t>(p.dtype);
  mine.max_tokens = p.capacity.max_tokens;
  mine.window_left = p.mask.window_left;
  mine.window_right = p.mask.window_right;
  mine.layout = static_cast<int32_t>(p.layout);
  mine.comm = static_cast<int32_t>(p.comm);
  mine.kv_gather = static_cast<int32_t>(p.kv_gather);
  mine.a2a_size = p.a2a_size;
  mine.reduce_dtype = static_cast<int32_t>(p.reduce_dtype);
  mine.head_slices = p.head_slices;
  mine.q_heads = p.q_heads;
  mine.kv_heads = p.kv_heads;
  mine.head_dim = p.head_dim;
  mine.v_head_dim = p.value_head_dim();
  mine.options_fingerprint = in.options_fingerprint;
  mine.layout_fingerprint = in.layout_fingerprint;
  for (int i = 0; i < 3; ++i) mine.local_rows[i] = in.local_rows[i];

  std::vector<Descriptor> all(static_cast<size_t>(in.size));
  exchange(&mine, all.data(), sizeof(Descriptor));
  for (int r = 0; r < in.size; ++r) {
    // The failing rank's message carries its location; the others say whose it is.
    if (!all[r].ok) throw Error((r == in.rank ? "" : "rank " + std::to_string(r) + ": ") + all[r].message);
  }
  const Descriptor& ref = all[0];
  const char* fix =
      ": every rank must plan the same problem (cp, capacity, mask, heads, head_dim, v_head_dim, dtype, layout, comm, "
      "kv_gather, a2a_size, reduce_dtype, head_slices, options)";
  for (int r = 1; r < in.size; ++r) {
    const Descriptor& d = all[r];
    THDCP_CHECK(d.cp == ref.cp, "rank " << r << " passed cp=" << d.cp << " but rank 0 passed cp=" << ref.cp << fix);
    THDCP_CHECK(d.layout == ref.layout && d.comm == ref.comm,
                "rank " << r << " passed layout=" << cp_layout_name(static_cast<CpLayout>(d.layout))
                        << " comm=" << cp_comm_name(static_cast<CpComm>(d.comm)) << " but rank 0 passed layout="
                        << cp_layout_name(static_cast<CpLayout>(ref.layout))
                        << " comm=" << cp_comm_name(static_cast<CpComm>(ref.comm)) << fix);
    THDCP_CHECK(d.kv_gather == ref.kv_gather,
                "rank " << r << " passed kv_gather=" << kv_gather_name(static_cast<KvGather>(d.kv_gather))
                        << " but rank 0 passed kv_gather=" << kv_gather_name(static_cast<KvGather>(ref.kv_gather))
                        << fix);
    THDCP_CHECK(d.a2a_size == ref.a2a_size,
                "rank " << r << " passed a2a_size=" << d.a2a_size << " but rank 0 passed a2a_size=" << ref.a2a_size
                        << fix);
    THDCP_CHECK(d.reduce_dtype == ref.reduce_dtype,
                "rank " << r << " passed reduce_dtype=" << dtype_name(static_cast<DType>(d.reduce_dtype))
                        << " but rank 0 passed reduce_dtype=" << dtype_name(static_cast<DType>(ref.reduce_dtype))
                        << fix);
    THDCP_CHECK(d.head_slices == ref.head_slices, "rank " << r << " passed head_slices=" << d.head_slices
                                                          << " but rank 0 passed head_slices=" << ref.head_slices
                                                          << fix);
    THDCP_CHECK(d.layout_fingerprint == ref.layout_fingerprint,
                "rank " << r << " passed a different layout than rank 0"
                        << ": every rank must pass the same global cu_seqlens and cu_seqlens_padded");
    THDCP_CHECK(d.max_seqs == ref.max_seqs && d.max_tokens == ref.max_tokens,
                "rank " << r << " passed capacity (max_seqs=" << d.max_seqs << ", max_tokens=" << d.max_tokens
                        << ") but rank 0 passed (" << ref.max_seqs << ", " << ref.max_tokens << ")" << fix);
    THDCP_CHECK(d.window_left == ref.window_left && d.window_right == ref.window_right,
                "rank " << r << " passed mask (" << d.window_left << "," << d.window_right << ") but rank 0 passed ("
                        << ref.window_left << "," << ref.window_right << ")" << fix);
    THDCP_CHECK(d.q_heads == ref.q_heads && d.kv_heads == ref.kv_heads && d.head_dim == ref.head_dim,
                "rank " << r << " passed heads " << d.q_heads << ":" << d.kv_heads << " head_dim " << d.head_dim
                        << " but rank 0 passed " << ref.q_heads << ":" << ref.kv_heads << " head_dim " << ref.head_dim
                        << fix);
    THDCP_CHECK(d.v_head_dim == ref.v_head_dim, "rank " << r << " passed v_head_dim " << d.v_head_dim
                                                        << " but rank 0 passed " << ref.v_head_dim << fix);
    THDCP_CHECK(d.dtype == ref.dtype, "rank " << r << " passed dtype " << dtype_name(static_cast<DType>(d.dtype))
                                              << " but rank 0 passed " << dtype_name(static_cast<DType>(ref.dtype))
                                              << fix);
    THDCP_CHECK(d.options_fingerprint == ref.options_fingerprint,
                "rank " << r << " passed other attention options than rank 0 (softmax_scale, deterministic)" << fix);
    THDCP_CHECK(d.local_rows[0] == ref.local_rows[0] && d.local_rows[1] == ref.local_rows[1] &&
                    d.local_rows[2] == ref.local_rows[2],
                "rank " << r << " passed q/k/v of " << d.local_rows[0] << "/" << d.local_rows[1] << "/"
                        << d.local_rows[2] << " rows but rank 0 passed " << ref.local_rows[0] << "/"
                        << ref.local_rows[1] << "/" << ref.local_rows[2]);
  }
}

Problem a2a_ag_across(const Problem& p) {
  Problem across = p;
  across.cp = p.cp / p.a2a_size;
  across.q_heads = p.q_heads / p.a2a_size;
  across.kv_heads = p.kv_heads / p.a2a_size;
  across.comm = CpComm::kAllGather;
  across.a2a_size = 1;
  return across;
}

}  // namespace thdcp::cp::detail
