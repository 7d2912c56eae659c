// thdcp bench --scaling --gpus N[,N...]: AllGather CP across GPUs over NCCL against the same
// batch on one GPU (issue 13).
//
// For every batch size T, CP layout (--cp-layout) and mask the same documents (one seeded
// lognormal draw; under the dual-chunk layout every document padded to a multiple of
// 2*lcm(cp sizes), under the contiguous one none, so one layout serves every cp) run
//   - on GPU 0 alone: cuda::Attention over the single-device table, the baseline, and
//   - with AllGather CP over NCCL, cp = N, one process with a thread per GPU (run_in_process
//     and nccl::create, as `thdcp run --gpus N` does): rank r on GPU r.
// Before anything of a (T, mask, cp) is timed, one CP forward + backward is compared with the
// rows of the single-GPU result that each rank owns (out, lse, max_logit, dq, dk, dv; the
// tolerances of the CUDA CP tests, tests/support/gpu_tolerance.h). A mismatch prints FAIL, that
// configuration is not timed, and the command exits 1 at the end.
//
// Timing: CUDA events, warm-up steps, then the median of --iters steps of forward + backward.
//   baseline  the whole batch on GPU 0 (table build, forward, backward);
//   step      every rank waits at a host barrier (its stream idle), records a start event,
//             enqueues forward and backward, records a stop event. A step takes as long as its
//             slowest rank: the max over ranks per step, then the median over steps;
//   phases    CudaPlan::enable_phase_timing, in separate eager steps (the forward's events are
//             read before the backward reuses them, so a host sync sits between the two): per
//             rank the median over steps of forward + backward, then the max over ranks.
// The timed steps overlap: the plan runs its collectives on a second stream, the backward's
// reduce-scatter beside its dQ pass. Phase timing runs a step in program order on one stream instead, so the phases are
// each one's own time (a collective's includes any wait for a slower peer); "beyond
// attention" = step - attention phase is what the overlap left exposed.
// efficiency = baseline / (N * step); targets (target_of): at cp 2 0.90-0.95 by mask, T and
// communication, 0.90 at cp 4, 0.85 at cp 8.
#include "bench/bench_scaling.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "bench/harness.h"
#include "bench/scaling_runs.h"
#include "io/args.h"
#include "io/atomic_file.h"
#include "io/svg.h"
#include "step/cuda_head_dims.h"
#include "step/visible_gpus.h"
#include "thdcp/comm/communicator.h"
#include "thdcp/comm_device/nccl.h"
#include "thdcp/comm_device/shared_gpu.h"
#include "thdcp/core/cuda_check.h"
#include "thdcp/cuda/attention.h"
#include "thdcp/plan/segment_table.h"
#include "thdcp/testing/workload.h"

namespace thdcp::tools {

namespace {

using scaling::kPhases;

const char* kHelp =
    "usage: thdcp bench --scaling --gpus N[,N...] [options]\n"
    "\n"
    "AllGather CP over NCCL with cp = N, one process with a thread per GPU (rank r on GPU r),\n"
    "against the same batch on GPU 0 alone (the baseline). For every --tokens T and --mask:\n"
    "one seeded draw of lognormal documents packed into T rows (each document padded to a\n"
    "multiple of 2*lcm(N...), the same documents for the baseline and every N); one CP\n"
    "forward+backward checked against the single-GPU result's rows of every rank (PASS/FAIL;\n"
    "no timing after a FAIL, exit 1); then CUDA events, warm-up and the median of --iters\n"
    "forward+backward steps: the baseline, the CP step (a host barrier, then every rank's\n"
    "events; the slowest rank's time), and each CP phase (max over ranks). Prints a markdown\n"
    "table: efficiency = baseline / (N x CP step), targets at cp 2: all_gather 0.93 causal, 0.90\n"
    "window at T <= 131072 (0.95, 0.92 above), all_to_all 0.95, a halo's window 0.93; 0.90 at\n"
    "cp 4, 0.85 at cp 8.\n"
    "NCCL_NVLS_ENABLE must be unset (it is then set to 0) or 0: NVLink multicast stays off.\n"
    "\n"
    "  --gpus N[,N...]     CP sizes, each <= the visible GPUs (required)\n"
    "  --cp-layout L[,L...]  CP layouts, each a set of rows (dual_chunk): dual_chunk (documents padded\n"
    "                      to 2*lcm(N...), rank r holding chunks r and 2N-1-r) and/or contiguous (the\n"
    "                      same documents unpadded, rank r holding the r-th of N equal pieces); each\n"
    "                      layout has its own baseline on GPU 0. Every row gives the (query, key)\n"
    "                      pairs of the busiest rank over the mean (the planner's balance), the same\n"
    "                      for the ranks' measured attention time, and the bytes each rank receives\n"
    "                      per step\n"
    "  --tokens T[,T...]   rows per batch, multiples of 2*lcm(N...) (131072,524288)\n"
    "  --mask M[,M...]     causal and/or window (causal,window)\n"
    "  --window L          left window of the windowed mask (4096; right is 0)\n"
    "  --q-heads N         query heads (32)\n"
    "  --kv-heads N        key/value heads (8)\n"
    "  --head-dim N        head dimension of q, k and v (128); the CUDA kernels take\n"
    "                      {cuda head dims}\n"
    "  --dtype T           bf16 or fp16 (bf16)\n"
    "  --median N          median document length (1500)\n"
    "  --max-length N      longest document (32768)\n"
    "  --seed N            seed of lengths and data (1)\n"
    "  --warmup N          untimed steps (3)\n"
    "  --iters N           timed steps; the median is reported (20)\n"
    "  --kv S[,S...]       where the backward takes K/V from, each a row: gather (all-gather them\n"
    "                      again, the default) or kept (the forward's, cp::KvSource::kFromForward;\n"
    "                      all_to_all keeps the forward's head-sharded q, k, v, out and lse)\n"
    "  --head-slices S[,S...]  head slices of the all_to_all and whole-gather all_gather rows, each a\n"
    "                      row (1): cp::Problem::head_slices. all_to_all: each slice's exchange beside\n"
    "                      another's attention (Hq and Hkv multiples of cp x S); all_gather: the\n"
    "                      forward's gather of one slice beside the attention of the slice before\n"
    "                      (Hq and Hkv multiples of S)\n"
    "  --sm-margin M[,M...]  AttentionOptions::sm_margin of the CP plans, each a row (0): SMs the\n"
    "                      persistent Hopper forward leaves to the collectives beside it\n"
    "  --cp-comm C[,C...]  CP communications, each a row (all_gather): all_gather, all_to_all\n"
    "                      (Ulysses: heads sharded for the attention; --q-heads and --kv-heads\n"
    "                      multiples of every N) and/or a2a+ag (all-to-all in groups of\n"
    "                      --cp-a2a-size ranks, AllGather across them)\n"
    "  --cp-a2a-size A     a2a+ag's all-to-all group (2): rows where A does not divide N, or the\n"
    "                      heads, are skipped with the reason\n"
    "  --kv-gather G[,G...]  the K/V rows each rank gathers, each a row (whole): whole (every rank's)\n"
    "                      or halo (its rows with the window's edges from its neighbours; rows of the\n"
    "                      contiguous layout under the window mask only, the others skip it)\n"
    "  --reduce-dtype R[,R...]  the dtype dK/dV partial sums cross ranks in, each a row (fp32): fp32\n"
    "                      and/or the batch's (--dtype: half the reduce-scatter's bytes)\n"
    "  --device-comm D[,D...]  the ranks' device communicator, each a row (nccl): nccl, peer (one\n"
    "                      SharedGpuGroup over the GPUs: all-gathers and all-to-alls as peer copies on\n"
    "                      the copy engines, no SMs; the reductions kernels reading the peers' buffers)\n"
    "                      or nccl-ce (NCCL with nccl::Options::copy_engine: workspaces in symmetric\n"
    "                      windows, all-gathers and all-to-alls on the copy engines; NCCL >= 2.28.3)\n"
    "  --dq-pass B[,B...]  AttentionOptions::separate_dq_pass of the CP plans, each a row (0): 1 = on\n"
    "                      Hopper at head dim 128 without a left window, dQ in a pass of its own,\n"
    "                      beside the reduce-scatter of dK/dV, instead of in the dK/dV pass\n"
    "  --timeline DIR      also one step of each AllGather row as it runs, overlapped: every rank's\n"
    "                      phases on its step stream and on the plan's collectives stream, printed\n"
    "                      and drawn to DIR/timeline-T<T>-<mask>-cp<cp>-<layout>-<row>.svg\n"
    "\n"
    "A configuration whose buffers do not fit the free memory of a GPU (or of the host) is\n"
    "skipped with the reason. Exit codes: 0 every configuration that ran matched, 1 a\n"
    "mismatch, 2 bad input (fewer visible GPUs than N, NCCL missing, NCCL_NVLS_ENABLE != 0).\n";

struct NamedMask {
  std::string name;
  Mask mask;
};

// A row of the CP runs: its size and what its plans are made with.
struct Variant {
  int cp;
  bool kept_kv;
  int sm_margin;
  bool dq_pass;
  bool halo = false;  // cp::KvGather::kHalo: each rank's rows with the window's edges (contiguous layout)
  cp::CpComm comm = cp::CpComm::kAllGather;
  bool peer = false;  // a peer-copy SharedGpuGroup instead of NCCL
  bool narrow_reduce = false;  // cp::Problem::reduce_dtype = the batch's dtype
  int head_slices = 1;         // cp::Problem::head_slices (all_to_all and all_gather rows)
  int a2a_size = 1;            // cp::Problem::a2a_size (a2a+ag rows)
  bool copy_engine = false;    // NCCL with nccl::Options::copy_engine (set by name, after the rest)
};

struct Options {
  std::vector<int> cps;
  std::vector<CpLayout> layouts;
  int64_t align = 1;  // 2*lcm(cps): every document and T are multiples of it
  std::vector<int64_t> tokens_list;
  std::vector<NamedMask> masks;
  StepShape shape;
  LengthDistribution dist;
  uint64_t seed = 0;
  int warmup = 0, iters = 0;
  std::vector<Variant> variants;  // each a row
  std::string timeline_dir;       // --timeline: an SVG of one step's timeline per AllGather row
};

// One row of the final table.
struct Row {
  int64_t tokens = 0;
  std::string mask;
  int cp = 0;
  bool kept_kv = false;  // the backward on the forward's K/V (cp::KvSource::kFromForward)
  int sm_margin = 0;     // AttentionOptions::sm_margin
  size_t documents = 0;
  std::string status;  // "PASS", "FAIL", "skipped"
  double baseline_ms = 0, step_ms = 0, comm_ms = 0, efficiency = 0;
  std::array<double, kPhases> phase_ms{};
  // The collectives alone (the slowest rank, median): all-gathers of K and V, reduce-scatters
  // of fp32 dK and dV, and their bus bandwidths (nccl-tests' busbw: bytes of the whole
  // gathered / reduced tensors x (cp - 1) / cp per second). 0: not measured.
  double gather_ms = 0, reduce_ms = 0, gather_busbw = 0, reduce_busbw = 0;
  // A plain copy of a rank's K and V block to the next GPU, every GPU at once, GB/s per
  // link and direction (scaling::time_link_copies): what busbw is read against. 0: not run.
  double link_gbps = 0;
  bool dq_pass = false;  // AttentionOptions::separate_dq_pass
  CpLayout layout = CpLayout::kDualChunk;
  // Balance over the ranks, busiest over mean: of the (query, key) pairs each rank's table
  // allows (predicted), and of each rank's attention phase (measured, median over steps).
  double pairs_imbalance = 0, attention_imbalance = 0;
  double received_bytes = 0;  // per rank per step: gathered K/V rows and reduce-scattered dK/dV
  bool halo = false;          // the halo gather (cp::KvGather::kHalo)
  cp::CpComm comm = cp::CpComm::kAllGather;
  bool peer = false;          // over a peer-copy SharedGpuGroup, not NCCL
  bool copy_engine = false;   // NCCL's copy-engine collectives
  bool narrow_reduce = false;  // dK/dV reduce-scattered in the batch's dtype
  int head_slices = 1;         // all_to_all's and all_gather's head slices
  int a2a_size = 1;            // a2a+ag's all-to-all group
};

// The bytes a rank receives in one forward + backward step: the other ranks' K/V rows, once
// per gather (the forward's, and the backward's unless it keeps them), and its share of the
// fp32 dK/dV partial sums of the other ranks (the reduce-scatter).
double received_per_rank(const StepShape& s, int64_t tokens, int cp, bool kept_kv, bool narrow_reduce = false) {
  const double others = static_cast<double>(cp - 1) / cp;
  const double kv = others * static_cast<double>(s.bytes(tokens, s.kv_heads) + s.bytes(tokens, s.kv_heads, s.value_head_dim()));
  const double grad_bytes = narrow_reduce ? static_cast<double>(dtype_size(s.dtype)) : sizeof(float);
  const double grads = others * grad_bytes * static_cast<double>(tokens * s.kv_heads) *
                       static_cast<double>(s.head_dim + s.value_head_dim());
  return kv * (kept_kv ? 1 : 2) + grads;
}

// The same under the halo gather: every rank's edges (the window's rows on both sides) from
// the other ranks, once per gather, and their fp32 dK/dV back.
double received_by_halo(const StepShape& s, const Mask& mask, int cp, bool kept_kv) {
  const int64_t edges = std::max<int64_t>(mask.window_left, 0) + std::max<int64_t>(mask.window_right, 0);
  const double others = static_cast<double>(cp - 1);
  const double kv = others * static_cast<double>(s.bytes(edges, s.kv_heads) + s.bytes(edges, s.kv_heads, s.value_head_dim()));
  const double grads = others * sizeof(float) * static_cast<double>(edges * s.kv_heads) *
                       static_cast<double>(s.head_dim + s.value_head_dim());
  return kv * (kept_kv ? 1 : 2) + grads;
}

// The same under all-to-all CP: the other ranks' rows of this rank's heads of q, k, v (and in
// the backward of q, k, v, out, dout), and this rank's rows of the other heads of out (and of
// fp32 dq, dk, dv); the LSE's 4 bytes per row and head not counted.
double received_by_all_to_all(const StepShape& s, int64_t tokens, int cp, bool kept_kv) {
  const double share = static_cast<double>(cp - 1) / cp / cp;  // of a whole [T, H, D] tensor
  const double dqk = static_cast<double>(s.head_dim), dv = static_cast<double>(s.value_head_dim());
  const double hq = static_cast<double>(s.q_heads), hk = static_cast<double>(s.kv_heads);
  const double element = static_cast<double>(dtype_size(s.dtype)), rows = static_cast<double>(tokens);
  const double qkv = rows * (hq * dqk + hk * dqk + hk * dv) * element;
  const double out = rows * hq * dv * element;
  // Forward: q, k, v there and out back. Backward: dout (and q, k, v, out again unless the
  // forward's are kept) there, the gradients back in their own dtype (rounded before the
  // exchange).
  const double backward_in = kept_kv ? out : qkv + 2 * out;
  return share * (qkv + out + backward_in + qkv);
}

// The same under a2a+ag: the all-to-all in groups of a2a_size over the group's rows
// (T a2a_size / cp), then AllGather CP across the cp / a2a_size groups on a2a_size's share of
// the heads.
double received_by_a2a_ag(const StepShape& s, int64_t tokens, int cp, int a2a_size, bool kept_kv, bool narrow_reduce) {
  StepShape share = s;
  share.q_heads = s.q_heads / a2a_size;
  share.kv_heads = s.kv_heads / a2a_size;
  return received_by_all_to_all(s, tokens / (cp / a2a_size), a2a_size, kept_kv) +
         received_per_rank(share, tokens, cp / a2a_size, kept_kv, narrow_reduce);
}

// Busiest rank's allowed (query, key) pairs over the mean, under `layout`.
double pairs_imbalance(const BatchLayout& layout, CpLayout cp_layout, int cp, const Mask& mask) {
  double most = 0, sum = 0;
  for (int r = 0; r < cp; ++r) {
    const double pairs = static_cast<double>(table_pairs(build_cp_segment_table(layout.view(), cp, r, mask, cp_layout)));
    most = std::max(most, pairs);
    sum += pairs;
  }
  return sum > 0 ? most * cp / sum : 1.0;
}

// Where the backward takes K/V from, and (with --dq-pass 1) that dQ had a pass of its own.
std::string backward_form(const Row& r) {
  const std::string over = std::string(r.narrow_reduce ? ", 16-bit reduce" : "") + (r.peer ? ", peer copies" : "") +
                           (r.copy_engine ? ", NCCL copy engine" : "");
  if (r.comm == cp::CpComm::kAllToAll) {
    return std::string("all_to_all") + (r.kept_kv ? ", kept" : "") +
           (r.head_slices > 1 ? ", " + std::to_string(r.head_slices) + " head slices" : "") + over;
  }
  if (r.comm == cp::CpComm::kA2aAg) {
    return "a2a+ag (groups of " + std::to_string(r.a2a_size) + ")" + (r.kept_kv ? ", kept" : "") + over;
  }
  return std::string(r.kept_kv ? "kept" : "gathered") + (r.dq_pass ? ", dQ pass" : "") + (r.halo ? ", halo" : "") +
         (r.head_slices > 1 ? ", " + std::to_string(r.head_slices) + " head slices" : "") + over;
}

// The open issues' targets: cp 2 all_gather 0.93 causal / 0.90 window at T <= 131072, 0.95 /
// 0.92 above (issue 30); all_to_all 0.95, and a halo gather's window 0.93 (issue 31); cp 4 and
// 8: 0.90 and 0.85.
double target_of(const Row& r) {
  switch (r.cp) {
    case 2: {
      if (r.comm == cp::CpComm::kAllToAll) return 0.95;
      const bool window = r.mask != "causal" && r.mask != "full";
      if (window && r.halo) return 0.93;
      const bool longer = r.tokens > 131072;
      return window ? (longer ? 0.92 : 0.90) : (longer ? 0.95 : 0.93);
    }
    case 4: return 0.90;
    case 8: return 0.85;
    default: return 0;
  }
}

std::string target_text(const Row& r) {
  const double target = target_of(r);
  if (target == 0) return "no target";
  if (r.status != "PASS") return format(">= %.2f: not measured", target);
  return format(">= %.2f: %s", target, r.efficiency >= target ? "met" : "not met");
}

std::vector<NamedMask> parse_masks(const std::string& text, int64_t window) {
  std::vector<NamedMask> masks;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    NamedMask m;
    if (item == "causal") {
      m = NamedMask{"causal", Mask::causal()};
    } else if (item == "window") {
      m = NamedMask{"window(" + std::to_string(window) + ",0)", Mask::window(static_cast<int32_t>(window), 0)};
    } else {
      throw UsageError("--mask " + quote_excerpt(item) + ": use causal and/or window, separated by ','");
    }
    for (const NamedMask& seen : masks) {
      if (seen.name == m.name) throw UsageError("--mask " + quote_excerpt(text) + ": " + item + " is given twice");
    }
    masks.push_back(m);
  }
  if (masks.empty() || text.empty() || text.back() == ',') {
    throw UsageError("--mask " + quote_excerpt(text) + ": use causal and/or window, separated by ','");
  }
  return masks;
}

// --gpus: distinct CP sizes.
std::vector<int> parse_cps(const std::string& text) {
  std::vector<int> cps;
  for (int64_t n : parse_int_list("gpus", text, 1, 64)) {
    if (std::find(cps.begin(), cps.end(), static_cast<int>(n)) != cps.end()) {
      throw UsageError("--gpus " + quote_excerpt(text) + ": " + std::to_string(n) + " is given twice");
    }
    cps.push_back(static_cast<int>(n));
  }
  return cps;
}

// --kv: per row, whether the backward takes the forward's K/V.
std::vector<bool> parse_kv(const std::string& text) {
  std::vector<bool> kept;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item != "gather" && item != "kept") {
      throw UsageError("--kv " + quote_excerpt(text) + ": use gather and/or kept, separated by ','");
    }
    kept.push_back(item == "kept");
  }
  if (kept.empty()) throw UsageError("--kv '': use gather and/or kept");
  return kept;
}

// --flag NAME[,NAME...]: names from `choices`, each at most once, as their indices in it.
std::vector<size_t> parse_names(const std::string& flag, const std::string& text,
                                const std::vector<std::string>& choices) {
  std::string options;
  for (size_t c = 0; c < choices.size(); ++c) options += (c == 0 ? "" : " and/or ") + choices[c];
  const std::string usage = "--" + flag + " " + quote_excerpt(text) + ": use " + options + ", separated by ','";
  std::vector<size_t> picked;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    const auto it = std::find(choices.begin(), choices.end(), item);
    if (it == choices.end()) throw UsageError(usage);
    const size_t index = static_cast<size_t>(it - choices.begin());
    if (std::find(picked.begin(), picked.end(), index) != picked.end()) {
      throw UsageError("--" + flag + " " + quote_excerpt(text) + ": " + item + " is given twice");
    }
    picked.push_back(index);
  }
  if (picked.empty() || text.back() == ',') throw UsageError(usage);
  return picked;
}

Options parse_options(const Args& args) {
  if (!args.has("gpus")) throw UsageError("--scaling needs --gpus N (the CP sizes, e.g. --gpus 2 or --gpus 2,4)");
  Options o;
  o.cps = parse_cps(args.get("gpus", ""));
  for (int c : o.cps) o.align = std::lcm(o.align, static_cast<int64_t>(c));
  o.align *= 2;
  o.tokens_list = {131072, 524288};
  if (args.has("tokens")) o.tokens_list = parse_int_list("tokens", args.get("tokens", ""), 2, int64_t{1} << 30);
  for (int64_t t : o.tokens_list) check_tokens_multiple(t, o.align, "2*lcm(cp sizes)=" + std::to_string(o.align));
  const int64_t window = args.get_int("window", 4096, 0, int64_t{1} << 30);
  o.masks = parse_masks(args.get("mask", "causal,window"), window);
  o.shape = parse_bench_shape(args);
  o.dist.median = static_cast<double>(args.get_int("median", 1500, 1, int64_t{1} << 30));
  o.dist.max_length = args.get_int("max-length", 32768, 1, int64_t{1} << 30);
  o.seed = args.get_seed("seed", 1);
  o.warmup = static_cast<int>(args.get_int("warmup", 3, 0, 1000));
  o.iters = static_cast<int>(args.get_int("iters", 20, 1, 10000));
  const std::vector<int64_t> margins = parse_int_list("sm-margin", args.get("sm-margin", "0"), 0, 1024);
  const std::vector<int64_t> dq_passes = parse_int_list("dq-pass", args.get("dq-pass", "0"), 0, 1);
  const std::vector<bool> kv_list = parse_kv(args.get("kv", "gather"));
  const std::vector<size_t> comm_names =
      parse_names("cp-comm", args.get("cp-comm", "all_gather"), {"all_gather", "all_to_all", "a2a+ag"});
  std::vector<cp::CpComm> comms;
  for (size_t n : comm_names) {
    comms.push_back(n == 0 ? cp::CpComm::kAllGather : n == 1 ? cp::CpComm::kAllToAll : cp::CpComm::kA2aAg);
  }
  const int a2a_size = static_cast<int>(args.get_int("cp-a2a-size", 2, 1, 64));
  std::vector<bool> halos;
  for (size_t n : parse_names("kv-gather", args.get("kv-gather", "whole"), {"whole", "halo"})) halos.push_back(n == 1);
  std::vector<size_t> device_comms = parse_names("device-comm", args.get("device-comm", "nccl"), {"nccl", "peer", "nccl-ce"});
  std::vector<bool> narrow;
  const std::string batch_dtype = dtype_name(o.shape.dtype);
  for (size_t n : parse_names("reduce-dtype", args.get("reduce-dtype", "fp32"), {"fp32", batch_dtype})) {
    narrow.push_back(n == 1);
  }
  std::vector<int> slices_list;
  for (int64_t n : parse_int_list("head-slices", args.get("head-slices", "1"), 1, 16)) {
    slices_list.push_back(static_cast<int>(n));
  }
  for (size_t n : parse_names("cp-layout", args.get("cp-layout", "dual_chunk"), {"dual_chunk", "contiguous"})) {
    o.layouts.push_back(n == 0 ? CpLayout::kDualChunk : CpLayout::kContiguous);
  }
  for (int c : o.cps) {
    for (bool kept : kv_list) {
      for (int64_t margin : margins) {
        for (int64_t dq_pass : dq_passes) {
          for (cp::CpComm comm : comms) {
            for (bool halo : halos) {
              // A halo is all_gather's rows' (all-to-all rows have none).
              if (halo && comm != cp::CpComm::kAllGather) continue;
              for (size_t device_comm : device_comms) {
                const bool peer = device_comm == 1;
                for (bool reduce16 : narrow) {
                  // The halo's edges cross in fp32, and all-to-all reduces nothing across ranks.
                  if (reduce16 && (halo || comm == cp::CpComm::kAllToAll)) continue;
                  const int group = comm == cp::CpComm::kA2aAg ? a2a_size : 1;
                  // Head slices are all_to_all's and the whole gather's: other rows take one, once.
                  const std::vector<int> one{1};
                  const bool sliced = comm == cp::CpComm::kAllToAll || (comm == cp::CpComm::kAllGather && !halo);
                  for (int slices : sliced ? slices_list : one) {
                    Variant v{c, kept, static_cast<int>(margin), dq_pass != 0, halo, comm, peer, reduce16, slices, group};
                    v.copy_engine = device_comm == 2;
                    o.variants.push_back(v);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  o.timeline_dir = args.get("timeline", "");
  if (!o.timeline_dir.empty()) {
    std::error_code error;
    if (!std::filesystem::is_directory(o.timeline_dir, error)) {
      throw UsageError("--timeline " + quote_excerpt(o.timeline_dir) + ": not a directory; create it first");
    }
  }
  return o;
}

// The GPUs (every cp needs its own: NCCL refuses two ranks on one device), NCCL, and NVLink
// multicast (NVLS), which must stay off on these hosts; NCCL reads the variable at init.
// Returns what the run says about NCCL_NVLS_ENABLE.
std::string check_environment(const Options& o) {
  std::string why_none;
  const int visible = visible_gpus(&why_none);
  const int most = *std::max_element(o.cps.begin(), o.cps.end());
  if (most > visible) {
    throw UsageError("--gpus " + std::to_string(most) + ": only " + std::to_string(visible) + " GPU(s) are visible" +
                     (visible == 0 ? " (" + why_none + ")" : std::string()) +
                     "; AllGather CP over NCCL needs a GPU per rank (check CUDA_VISIBLE_DEVICES)");
  }
  const bool over_nccl = std::any_of(o.variants.begin(), o.variants.end(), [](const Variant& v) { return !v.peer; });
  if (over_nccl && !nccl::built_with_nccl()) {
    throw UsageError("--scaling over NCCL needs NCCL: this thdcp was built without it (--device-comm peer needs none)");
  }
  if (const char* nvls = std::getenv("NCCL_NVLS_ENABLE")) {
    if (std::string(nvls) != "0") {
      throw UsageError("NCCL_NVLS_ENABLE=" + quote_excerpt(nvls) +
                       ": NVLink multicast must stay off on these hosts: unset it or set it to 0");
    }
    return "NCCL_NVLS_ENABLE=0 (from the environment)";
  }
  if (setenv("NCCL_NVLS_ENABLE", "0", 1) != 0) throw Error("could not set NCCL_NVLS_ENABLE=0");
  return "NCCL_NVLS_ENABLE=0 (was unset; set by thdcp before NCCL init: NVLink multicast stays off)";
}

// The GPUs, their peer access, CUDA's versions and the problem. Returns the GPUs' names,
// which are repeated above the table.
std::string print_setup(const Options& o, const std::string& nvls_note) {
  std::printf("thdcp bench --scaling: AllGather CP over NCCL, one process, a thread per GPU (rank r on GPU r)\n");
  const int most = *std::max_element(o.cps.begin(), o.cps.end());
  std::string gpu_names;
  for (int d = 0; d < most; ++d) {
    std::printf("GPU %d: %s\n", d, device_text(d, true).c_str());
    gpu_names += (d ? ", " : "") + std::to_string(d) + ": " + device_properties(d).name;
  }
  if (most > 1) {
    std::string peers;
    for (int a = 0; a < most; ++a) {
      for (int b = a + 1; b < most; ++b) {
        int can = 0;
        THDCP_CHECK_CUDA(cudaDeviceCanAccessPeer(&can, a, b));
        peers += " " + std::to_string(a) + "-" + std::to_string(b) + ":" + (can ? "yes" : "no");
      }
    }
    std::printf("peer access:%s\n", peers.c_str());
  }
  int driver = 0, runtime = 0;
  THDCP_CHECK_CUDA(cudaDriverGetVersion(&driver));
  THDCP_CHECK_CUDA(cudaRuntimeGetVersion(&runtime));
  THDCP_CHECK_CUDA(cudaSetDevice(0));
  std::printf("CUDA driver %d, runtime %d; kernels: %s; %s\n", driver, runtime, cuda::kernel_family(),
              nvls_note.c_str());
  const StepShape& s = o.shape;
  std::printf("problem: Hq=%lld Hkv=%lld D=%lld %s; lengths lognormal median %.0f sigma %.1f max %lld, seed %llu; "
              "documents padded to multiples of %lld; warm-up %d, median of %d steps\n",
              static_cast<long long>(s.q_heads), static_cast<long long>(s.kv_heads),
              static_cast<long long>(s.head_dim), dtype_name(s.dtype), o.dist.median, o.dist.sigma,
              static_cast<long long>(o.dist.max_length), static_cast<unsigned long long>(o.seed),
              static_cast<long long>(o.align), o.warmup, o.iters);
  std::fflush(stdout);
  return gpu_names;
}

// MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read (no check then).
double host_available_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024.0;
  }
  return 0;
}

// The median over steps of the slowest rank of each step.
double slowest_median(const std::vector<scaling::RankReport>& reports, std::vector<double> scaling::RankReport::*times,
                      size_t steps) {
  std::vector<double> slowest(steps, 0.0);
  for (const scaling::RankReport& r : reports) {
    for (size_t i = 0; i < steps; ++i) slowest[i] = std::max(slowest[i], (r.*times)[i]);
  }
  return median(slowest);
}

// The verification lines of a CP run: per tensor the worst over ranks. Returns whether all passed.
bool verify_ranks(const std::vector<scaling::RankReport>& reports, const std::string& what) {
  Verification check(what, 9, ErrorFormat::kScientific);
  for (int t = 0; t < scaling::kChecks; ++t) {
    Comparison worst;
    for (const scaling::RankReport& r : reports) {
      const Comparison& x = r.checks[static_cast<size_t>(t)];
      worst.count += x.count;
      worst.mismatches += x.mismatches;
      worst.max_abs_error = std::max(worst.max_abs_error, x.max_abs_error);
      worst.max_rel_error = std::max(worst.max_rel_error, x.max_rel_error);
    }
    check.check(scaling::kCheckNames[t], worst);
  }
  std::printf("verify %s: %s (every rank's rows against the single-GPU result)\n", what.c_str(),
              check.passed() ? "PASS" : "FAIL: not timed");
  return check.passed();
}

// One step's timeline of every rank (AllGather rows; RankReport::timeline), printed a line per
// rank and stream and drawn to DIR/timeline-T<T>-<mask>-cp<cp>-<layout>-<n>.svg.
void write_timeline(const std::string& dir, const Row& row, const std::vector<scaling::RankReport>& reports) {
  if (reports.empty() || reports[0].timeline.empty()) return;
  static int drawn = 0;
  GanttSpec spec;
  spec.title = format("one step, T=%lld %s cp=%d %s, %s", static_cast<long long>(row.tokens), row.mask.c_str(), row.cp,
                      cp_layout_name(row.layout), backward_form(row).c_str());
  spec.x_label = "ms from the forward's first mark, per rank";
  for (int p = 0; p < kPhases; ++p) spec.categories.push_back(cp::phase_name(static_cast<cp::Phase>(p)));
  for (size_t r = 0; r < reports.size(); ++r) {
    for (const bool collectives : {false, true}) {
      GanttRow lane;
      lane.label = format("rank %zu %s", r, collectives ? "collectives" : "step stream");
      std::string text;
      for (const cp::TimelineSpan& span : reports[r].timeline) {
        if (span.collectives != collectives) continue;
        lane.bars.push_back(GanttBar{span.start_ms, span.end_ms, cp::phase_name(span.phase)});
        text += format(" %s %.3f-%.3f", cp::phase_name(span.phase), span.start_ms, span.end_ms);
      }
      std::printf("timeline %s:%s\n", lane.label.c_str(), text.c_str());
      spec.rows.push_back(lane);
    }
  }
  const std::string path = format("%s/timeline-T%lld-%s-cp%d-%s-%d.svg", dir.c_str(), static_cast<long long>(row.tokens),
                                  row.mask.substr(0, row.mask.find('(')).c_str(), row.cp, cp_layout_name(row.layout),
                                  drawn++);
  write_text_file(path, svg_document({gantt_panel(spec)}));
  std::printf("timeline drawn to %s\n", path.c_str());
}

// The timings of a CP run that passed into its row; prints the collectives and the result.
void summarize(const std::vector<scaling::RankReport>& reports, const Options& o, Row& row) {
  const size_t steps = static_cast<size_t>(o.iters);
  row.step_ms = slowest_median(reports, &scaling::RankReport::step_ms, steps);
  std::string per_rank;
  for (const scaling::RankReport& r : reports) per_rank += format(" %.3f", median(r.step_ms));
  // The phases: per rank the median over steps, then the max over ranks. What the step
  // spends beyond its attention kernels (communication and the work around it that the
  // overlap did not hide): step - attention.
  for (const scaling::RankReport& r : reports) {
    for (int p = 0; p < kPhases; ++p) {
      std::vector<double> one;
      for (const auto& step : r.phases) one.push_back(step[static_cast<size_t>(p)]);
      row.phase_ms[static_cast<size_t>(p)] = std::max(row.phase_ms[static_cast<size_t>(p)], median(one));
    }
  }
  row.comm_ms = row.step_ms - row.phase_ms[static_cast<size_t>(cp::Phase::kAttention)];
  double most = 0, sum = 0;
  for (const scaling::RankReport& r : reports) {
    std::vector<double> attention;
    for (const auto& step : r.phases) attention.push_back(step[static_cast<size_t>(cp::Phase::kAttention)]);
    most = std::max(most, median(attention));
    sum += median(attention);
  }
  row.attention_imbalance = sum > 0 ? most * row.cp / sum : 0;
  const long long tokens = static_cast<long long>(row.tokens);
  if (reports[0].collectives_skip.empty()) {
    row.gather_ms = slowest_median(reports, &scaling::RankReport::gather_ms, steps);
    row.reduce_ms = slowest_median(reports, &scaling::RankReport::reduce_ms, steps);
    const double share = static_cast<double>(row.cp - 1) / row.cp;
    const double kv_bytes = static_cast<double>(o.shape.bytes(row.tokens, o.shape.kv_heads));
    const double grad_element = row.narrow_reduce ? static_cast<double>(dtype_size(o.shape.dtype)) : sizeof(float);
    const double grad_bytes = grad_element * static_cast<double>(row.tokens * o.shape.kv_heads * o.shape.head_dim);
    row.gather_busbw = 2 * kv_bytes * share / (row.gather_ms * 1e6);
    row.reduce_busbw = 2 * grad_bytes * share / (row.reduce_ms * 1e6);
    std::printf("collectives alone T=%lld cp=%d (%s): all-gather of K and V %.3f ms (busbw %.0f GB/s), "
                "reduce-scatter of %s dK and dV %.3f ms (busbw %.0f GB/s)\n",
                tokens, row.cp, row.peer ? "peer copies" : row.copy_engine ? "nccl, copy engine" : "nccl", row.gather_ms,
                row.gather_busbw,
                row.narrow_reduce ? dtype_name(o.shape.dtype) : "fp32", row.reduce_ms, row.reduce_busbw);
  } else {
    std::printf("collectives alone T=%lld cp=%d: not measured: %s\n", tokens, row.cp,
                reports[0].collectives_skip.c_str());
  }
  row.efficiency = row.baseline_ms / (row.cp * row.step_ms);
  std::printf("result T=%lld %s cp=%d %s, backward K/V %s, SM margin %d: baseline "
              "%.3f ms, CP step %.3f ms (per rank:%s), beyond attention %.3f ms, efficiency %.3f (%s); busiest "
              "rank over the mean: pairs %.3f, attention %.3f; received per rank per step %.1f MiB\n",
              tokens, row.mask.c_str(), row.cp, cp_layout_name(row.layout), backward_form(row).c_str(),
              row.sm_margin, row.baseline_ms, row.step_ms, per_rank.c_str(), row.comm_ms, row.efficiency,
              target_text(row).c_str(), row.pairs_imbalance, row.attention_imbalance,
              row.received_bytes / (1024.0 * 1024.0));
}

// One variant of a (T, mask): the CP run over NCCL, its check, its timings.
Row run_variant(const Options& o, const Variant& variant, const scaling::CpRun& run, const Row& base, bool& failed) {
  Row row = base;
  row.cp = variant.cp;
  row.layout = run.cp_layout;
  row.pairs_imbalance = pairs_imbalance(run.layout, run.cp_layout, variant.cp, run.mask);
  row.halo = variant.halo;
  row.comm = variant.comm;
  row.peer = variant.peer;
  row.copy_engine = variant.copy_engine;
  row.narrow_reduce = variant.narrow_reduce;
  row.head_slices = variant.head_slices;
  row.a2a_size = variant.a2a_size;
  row.received_bytes = variant.comm == cp::CpComm::kAllToAll
                           ? received_by_all_to_all(o.shape, row.tokens, variant.cp, variant.kept_kv)
                       : variant.comm == cp::CpComm::kA2aAg
                           ? received_by_a2a_ag(o.shape, row.tokens, variant.cp, variant.a2a_size, variant.kept_kv,
                                                variant.narrow_reduce)
                       : variant.halo ? received_by_halo(o.shape, run.mask, variant.cp, variant.kept_kv)
                                      : received_per_rank(o.shape, row.tokens, variant.cp, variant.kept_kv,
                                                          variant.narrow_reduce);
  row.kept_kv = variant.kept_kv;
  row.sm_margin = variant.sm_margin;
  row.dq_pass = variant.dq_pass;
  row.status = "PASS";
  std::vector<scaling::RankReport> reports(static_cast<size_t>(variant.cp));
  scaling::CpRun over = run;
  over.copy_engine = variant.copy_engine;
  over.timeline = !o.timeline_dir.empty();
  std::unique_ptr<SharedGpuGroup> peers;  // rank r on GPU r, peer access between them
  if (variant.peer) {
    SharedGpuOptions options;
    for (int d = 0; d < variant.cp; ++d) options.devices.push_back(d);
    options.timeout_seconds = scaling::kSyncTimeout;
    peers = std::make_unique<SharedGpuGroup>(variant.cp, options);
    over.peer_group = peers.get();
  }
  run_in_process(variant.cp, [&](Communicator& host) { scaling::cp_rank(host, over, reports[static_cast<size_t>(host.rank())]); });
  const std::string what = format("T=%lld %s cp=%d %s", static_cast<long long>(row.tokens), row.mask.c_str(), row.cp,
                                  cp_layout_name(row.layout));
  std::string skip;
  for (const scaling::RankReport& r : reports) {
    if (!r.skip.empty()) skip += (skip.empty() ? "" : "; ") + r.skip;
  }
  if (!skip.empty()) {
    std::printf("skip %s: %s\n", what.c_str(), skip.c_str());
    row.status = "skipped";
    return row;
  }
  if (!verify_ranks(reports, what)) {
    failed = true;
    row.status = "FAIL";
    std::fflush(stdout);
    return row;
  }
  summarize(reports, o, row);
  if (!o.timeline_dir.empty()) write_timeline(o.timeline_dir, row, reports);
  std::fflush(stdout);
  return row;
}

// A row for each cp of a (T, mask, layout) that did not run.
void skip_rows(int64_t tokens, const std::string& mask, size_t documents, const Options& o, std::vector<Row>& rows,
               CpLayout layout = CpLayout::kDualChunk) {
  for (int c : o.cps) {
    Row row;
    row.tokens = tokens;
    row.mask = mask;
    row.layout = layout;
    row.cp = c;
    row.documents = documents;
    row.status = "skipped";
    rows.push_back(row);
  }
}

// Every mask and variant of one batch size T.
void run_tokens(int64_t tokens, const Options& o, std::vector<Row>& rows, bool& failed) {
  // One draw for this T: sampled with the coarsest padding, so every cp's layout is this one.
  const std::vector<int64_t> lengths = sample_lengths(tokens, static_cast<int>(o.align / 2), o.dist, o.seed);
  const Capacity capacity{static_cast<int>(lengths.size()) + 1, tokens};
  int64_t longest = 0, valid = 0;
  for (int64_t n : lengths) longest = std::max(longest, n), valid += n;
  std::printf("\nT=%lld: %zu documents, %lld valid tokens, longest %lld\n", static_cast<long long>(tokens),
              lengths.size(), static_cast<long long>(valid), static_cast<long long>(longest));

  // Host: the inputs, the reference, and each rank's part of one tensor and its download at a time.
  const StepShape& s = o.shape;
  const double inputs_bytes = 2.0 * static_cast<double>(s.bytes(tokens, s.q_heads) + s.bytes(tokens, s.kv_heads));
  const double host_need = 2.0 * inputs_bytes + 4.0 * static_cast<double>(tokens * s.q_heads) +
                           2.0 * static_cast<double>(s.bytes(tokens, s.q_heads));
  const double host_free = host_available_bytes();
  if (host_free > 0 && host_need > host_free) {
    std::printf("skip T=%lld: needs about %s of host memory, %s available\n", static_cast<long long>(tokens),
                scaling::gib(host_need).c_str(), scaling::gib(host_free).c_str());
    for (const NamedMask& m : o.masks) skip_rows(tokens, m.name, lengths.size(), o, rows);
    return;
  }
  scaling::Inputs in{HostTensor(s.dtype, tokens, s.q_heads, s.head_dim),
                     HostTensor(s.dtype, tokens, s.kv_heads, s.head_dim),
                     HostTensor(s.dtype, tokens, s.kv_heads, s.head_dim),
                     HostTensor(s.dtype, tokens, s.q_heads, s.head_dim)};
  fill_random(in.q, o.seed + 1);
  fill_random(in.k, o.seed + 2);
  fill_random(in.v, o.seed + 3);
  fill_random(in.dout, o.seed + 4);

  // The links alone, once per CP size: a plain copy of a rank's K and V block to the next GPU.
  std::map<int, double> link_gbps;
  for (const Variant& variant : o.variants) {
    if (link_gbps.count(variant.cp)) continue;
    const int64_t local = tokens / variant.cp;
    const size_t bytes = s.bytes(local, s.kv_heads) + s.bytes(local, s.kv_heads, s.value_head_dim());
    const scaling::LinkCopies link = scaling::time_link_copies(variant.cp, bytes, o.warmup, o.iters);
    link_gbps[variant.cp] = link.gbps;
    if (link.skip.empty()) {
      std::printf("plain copies T=%lld cp=%d: every GPU copies a rank's K and V (%.1f MiB) to the next one at once "
                  "(copy engines, peer access): %.3f ms, %.0f GB/s per link and direction\n",
                  static_cast<long long>(tokens), variant.cp, static_cast<double>(bytes) / (1024.0 * 1024.0), link.ms,
                  link.gbps);
    } else {
      std::printf("plain copies T=%lld cp=%d: not measured: %s\n", static_cast<long long>(tokens), variant.cp,
                  link.skip.c_str());
    }
  }

  // The same documents in each layout's rows: padded to 2*lcm (dual chunk) or unpadded
  // (contiguous: T is a multiple of every cp); each layout's own baseline and reference.
  for (const CpLayout cp_layout : o.layouts) {
    const BatchLayout layout = cp_layout == CpLayout::kDualChunk
                                   ? make_layout(lengths, static_cast<int>(o.align / 2), capacity)
                                   : make_contiguous_layout(lengths, static_cast<int>(o.align / 2), capacity);
    for (const NamedMask& m : o.masks) {
      const double pairs = static_cast<double>(table_pairs(build_segment_table(layout.view(), m.mask)));
      const scaling::Baseline base = scaling::run_baseline(layout, in, m.mask, s, o.warmup, o.iters);
      if (!base.skip.empty()) {
        std::printf("skip T=%lld %s %s: %s\n", static_cast<long long>(tokens), m.name.c_str(),
                    cp_layout_name(cp_layout), base.skip.c_str());
        skip_rows(tokens, m.name, lengths.size(), o, rows, cp_layout);
        continue;
      }
      std::printf("baseline T=%lld %s, %s rows: 1 GPU, fwd+bwd %.3f ms (%.1f TFLOP/s over %.0f allowed pairs)\n",
                  static_cast<long long>(tokens), m.name.c_str(), cp_layout_name(cp_layout), base.ms,
                  14.0 * pairs * static_cast<double>(s.head_dim * s.q_heads) / (base.ms * 1e9), pairs);
      std::fflush(stdout);
      Row row;
      row.tokens = tokens;
      row.mask = m.name;
      row.documents = lengths.size();
      row.baseline_ms = base.ms;
      for (const Variant& variant : o.variants) {
        // The halo rows: the contiguous layout's, under a window no wider than a rank's rows.
        if (variant.halo && (cp_layout != CpLayout::kContiguous || m.mask.window_left < 0 ||
                             m.mask.window_left > tokens / variant.cp)) {
          continue;
        }
        if (variant.comm == cp::CpComm::kA2aAg &&
            (variant.cp % variant.a2a_size != 0 || s.q_heads % variant.a2a_size != 0 ||
             s.kv_heads % variant.a2a_size != 0)) {
          std::printf("skip T=%lld %s cp=%d a2a+ag in groups of %d: the group must divide cp and both head counts "
                      "(%lld:%lld)\n",
                      static_cast<long long>(tokens), m.name.c_str(), variant.cp, variant.a2a_size,
                      static_cast<long long>(s.q_heads), static_cast<long long>(s.kv_heads));
          continue;
        }
        // all_to_all slices a rank's share of the heads, all_gather every head.
        const int64_t shards =
            (variant.comm == cp::CpComm::kAllToAll ? static_cast<int64_t>(variant.cp) : 1) * variant.head_slices;
        if (s.q_heads % shards != 0 || s.kv_heads % shards != 0) {
          std::printf("skip T=%lld %s cp=%d %s, %d head slice(s): heads %lld:%lld are not multiples of %s\n",
                      static_cast<long long>(tokens), m.name.c_str(), variant.cp, cp::cp_comm_name(variant.comm),
                      variant.head_slices, static_cast<long long>(s.q_heads), static_cast<long long>(s.kv_heads),
                      variant.comm == cp::CpComm::kAllToAll ? "cp x slices" : "the slices");
          continue;
        }
        AttentionOptions attention;
        attention.sm_margin = variant.sm_margin;
        attention.separate_dq_pass = variant.dq_pass;
        const scaling::CpRun run{layout, in, base.ref, m.mask, s,
                                 variant.kept_kv ? Pass::kForwardBackwardKeptKv : Pass::kForwardBackward,
                                 attention, o.warmup, o.iters, cp_layout,
                                 variant.halo ? cp::KvGather::kHalo : cp::KvGather::kWhole, variant.comm,
                                 variant.narrow_reduce ? s.dtype : DType::kFloat32, nullptr, variant.head_slices,
                                 variant.a2a_size};
        rows.push_back(run_variant(o, variant, run, row, failed));
        rows.back().link_gbps = link_gbps[variant.cp];
      }
    }
  }
}

void print_tables(const std::vector<Row>& rows, const Options& o, const std::string& gpu_names,
                  const std::string& nvls_note) {
  std::printf("\nGPUs %s; %s\n", gpu_names.c_str(), nvls_note.c_str());
  std::printf("AllGather CP over NCCL vs 1 GPU, forward+backward, ms (CUDA events, median of %d after %d warm-up):\n"
              "step = the slowest rank's step (ranks start together after a host barrier; collectives on the\n"
              "plan's second stream, the reduce-scatter overlapped with the dQ pass); phases = per rank the\n"
              "median over separate eager steps run in program order on one stream (phase timing), max over\n"
              "ranks (reduce = max_logit all-reduce + fp32 dK/dV reduce-scatter, including waits for a slower\n"
              "peer); beyond attention = step - attention phase: what the overlap left exposed;\n"
              "efficiency = baseline / (cp x step).\n\n",
              o.iters, o.warmup);
  std::vector<Table::Column> columns = {{"T"},         {"mask", 0, true},  {"cp"},          {"layout", 0, true},
                                        {"bwd K/V", 0, true},
                                        {"SM margin"}, {"documents"},      {"check", 0, true}, {"baseline ms"},
                                        {"step ms"}};
  for (int p = 0; p < kPhases; ++p) columns.push_back({cp::phase_name(static_cast<cp::Phase>(p))});
  columns.insert(columns.end(), {{"beyond attention ms"}, {"efficiency"}, {"target", 0, true},
                                 {"pairs max/mean"}, {"attention max/mean"}, {"MiB in per rank"}});
  const Table steps(Table::Style::kMarkdown, columns);
  steps.print_header();
  for (const Row& r : rows) {
    const bool passed = r.status == "PASS";
    std::vector<std::string> cells = {format("%lld", static_cast<long long>(r.tokens)), r.mask, format("%d", r.cp),
                                      cp_layout_name(r.layout), backward_form(r), format("%d", r.sm_margin), format("%zu", r.documents),
                                      r.status, passed || r.baseline_ms > 0 ? format("%.3f", r.baseline_ms) : "-",
                                      passed ? format("%.3f", r.step_ms) : "-"};
    for (int p = 0; p < kPhases; ++p) cells.push_back(passed ? format("%.3f", r.phase_ms[static_cast<size_t>(p)]) : "-");
    cells.push_back(passed ? format("%.3f", r.comm_ms) : "-");
    cells.push_back(passed ? format("%.3f", r.efficiency) : "-");
    cells.push_back(target_text(r));
    cells.push_back(r.pairs_imbalance > 0 ? format("%.3f", r.pairs_imbalance) : "-");
    cells.push_back(passed ? format("%.3f", r.attention_imbalance) : "-");
    cells.push_back(r.received_bytes > 0 ? format("%.1f", r.received_bytes / (1024.0 * 1024.0)) : "-");
    steps.print_row(cells);
  }
  std::printf("\nThe step's collectives alone (the slowest rank, median; nothing else on the GPUs): all-gathers\n"
              "of K and V as in the forward, reduce-scatters of fp32 dK and dV as in the backward. busbw as in\n"
              "nccl-tests: bytes of the whole tensors x (cp - 1) / cp per second; \"plain copy\": a rank's K and V\n"
              "copied to the next GPU by every GPU at once, bytes per second per link and direction, the most\n"
              "a ring's busbw could reach over these links.\n\n");
  const Table collectives(Table::Style::kMarkdown,
                          {{"T"}, {"mask", 0, true}, {"cp"}, {"bwd K/V", 0, true}, {"SM margin"},
                           {"all-gather K, V ms"}, {"busbw GB/s"}, {"reduce-scatter dK, dV ms"}, {"busbw GB/s"},
                           {"plain copy GB/s"}});
  collectives.print_header();
  for (const Row& r : rows) {
    if (r.gather_ms <= 0) continue;
    collectives.print_row({format("%lld", static_cast<long long>(r.tokens)), r.mask, format("%d", r.cp),
                           backward_form(r), format("%d", r.sm_margin), format("%.3f", r.gather_ms),
                           format("%.0f", r.gather_busbw), format("%.3f", r.reduce_ms), format("%.0f", r.reduce_busbw),
                           r.link_gbps > 0 ? format("%.0f", r.link_gbps) : "-"});
  }
}

}  // namespace

int bench_scaling_command(const std::vector<std::string>& argv) {
  const Args args(argv,
                  {"gpus", "cp-layout", "cp-comm", "kv-gather", "device-comm", "reduce-dtype", "head-slices", "cp-a2a-size", "tokens", "mask", "window", "q-heads", "kv-heads", "head-dim", "dtype", "median",
                   "max-length", "seed", "warmup", "iters", "kv", "sm-margin", "dq-pass", "timeline"},
                  {"scaling", "help"});
  if (args.has("help")) {
    std::fputs(usage_with_cuda_head_dims(kHelp).c_str(), stdout);
    return 0;
  }
  const Options o = parse_options(args);
  const std::string nvls_note = check_environment(o);
  const std::string gpu_names = print_setup(o, nvls_note);
  std::vector<Row> rows;
  bool failed = false;
  for (int64_t tokens : o.tokens_list) run_tokens(tokens, o, rows, failed);
  print_tables(rows, o, gpu_names, nvls_note);
  if (failed) std::printf("\nverification FAILED for at least one configuration (not timed)\n");
  return failed ? 1 : 0;
}

}  // namespace thdcp::tools
