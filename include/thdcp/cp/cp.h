// AllGather context parallelism (DESIGN.md section 5): the algorithm's public types and its
// CPU backend. The orchestration is written once (src/cp/allgather_steps.h) over a CPU step
// set (this header: host tensors, host communicators) and a CUDA step set (thdcp/cp/cuda.h:
// device tensors, device communicators, stream-ordered).
//
// Plan, then run. A plan is made once for a Problem (what every rank must agree on) by every
// rank of the group together: it validates the problem, checks that every rank passed the
// same one (a disagreement throws thdcp::Error on every rank, naming it), and sizes its
// buffers by the capacity. Running a step then moves no descriptors between ranks.
//
// Every rank passes the same global layout (cu_seqlens / cu_seqlens_padded of the whole
// batch) and its local tensors (T/cp rows) in the order of the problem's CP layout:
// dual-chunk (thdcp/plan/dual_chunk.h, each P_b a multiple of 2*cp) or contiguous
// (thdcp/plan/contiguous.h, T a multiple of cp); thdcp/plan/rank_split.h makes them.
//
// Communication (Problem::comm): all_gather gathers K/V (and reduce-scatters dK/dV);
// all_to_all (Ulysses) turns the sequence-sharded [T/cp, H, D] into head-sharded
// [T, H/cp, D], runs attention over whole documents with H/cp heads, and turns the output
// (backward: dQ/dK/dV) back, so it needs q_heads and kv_heads multiples of cp. a2a+ag
// (TransformerEngine's a2a+p2p with an AllGather for the ring) factors cp = a2a_size * ag_size:
// rank r is member m = r % a2a_size of group g = r / a2a_size (the a2a_size consecutive ranks
// [g a2a_size, (g+1) a2a_size)); an all-to-all inside each group turns the group's rows into
// its rows of H/a2a_size heads (q_heads and kv_heads multiples of a2a_size), AllGather CP
// runs across the ag_size groups (the ranks of one member index, ranked by g; the problem's
// layout, mask and kv_gather at ag_size ranks) on that head shard, and the reverse
// all-to-all returns out and lse (backward: dQ, dK, dV). A rank's local rows are the layout's
// at cp, as in every mode: the rows of a group's ranks together are exactly rank g's rows of
// the same layout at ag_size (dual_chunk: the fine chunks [g a, (g+1) a) and their mirror
// are the coarse chunks g and 2 ag_size-1-g), so one split (thdcp/plan/rank_split.h at cp)
// serves every mode. a2a_size 1 gives the bits of all_gather, a2a_size cp those of
// all_to_all (src/cp/a2a_ag_cpu.h). Both backends run every layout and communication.
//
// K/V gather (Problem::kv_gather: all_gather, and a2a+ag's AllGather across the groups). A whole gather brings every rank's K/V to
// every rank and reduce-scatters dK/dV. A halo gather brings a rank only the key rows its
// queries can reach (thdcp/plan/halo.h: with a left window, the rows just before each of its
// pieces; with documents that stay on their rank, none) through Communicator::all_to_all_v,
// and in the backward returns only those rows' fp32 dK/dV to the ranks that hold them, where
// they are added in rank order from +0.0f: the order reduce_scatter_sum adds in. The ranks
// that do not reach a row would add exactly +0.0f there, which leaves such a sum unchanged, so
// every output (out, lse, max_logit, dq, dk, dv, dsinks) has the bits of the whole gather.
// auto takes the halo for a step when it moves fewer bytes (CpuPlan::kv_traffic). The CUDA
// backend gathers a halo under the contiguous layout only, and its auto decides from the mask
// (thdcp/cp/cuda.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "thdcp/comm/communicator.h"
#include "thdcp/core/tensor.h"
#include "thdcp/cpu/attention.h"
#include "thdcp/plan/attention_shape.h"
#include "thdcp/plan/contiguous.h"
#include "thdcp/plan/layout.h"
#include "thdcp/plan/mask.h"

namespace thdcp::cp {

using thdcp::CpLayout;  // how the rows are split over the ranks (thdcp/plan/contiguous.h)

// How the ranks exchange what attention needs.
enum class CpComm : int {
  kAllGather = 0,  // gather K/V over the group; reduce-scatter dK/dV (DESIGN.md section 5)
  kAllToAll = 1,   // Ulysses: sequence-sharded to head-sharded and back; heads % cp == 0
  kA2aAg = 2,      // all-to-all in groups of Problem::a2a_size, AllGather across the groups
};
const char* cp_comm_name(CpComm comm);  // "all_gather", "all_to_all", "a2a+ag"

// Which K/V rows an all_gather step moves (see the top of this header).
enum class KvGather : int {
  kAuto = 0,   // the halo where it moves fewer bytes than the whole gather, per step (CUDA: thdcp/cp/cuda.h)
  kWhole = 1,  // every rank's K/V to every rank; dK/dV reduce-scattered
  kHalo = 2,   // only the key rows a rank's queries can reach; their dK/dV back to their ranks
};
const char* kv_gather_name(KvGather gather);  // "auto", "whole", "halo"

// What every rank of a CP group must agree on, fixed for the life of a plan: the heads
// (q_heads, kv_heads, head_dim of HeadShape) and the following.
struct Problem : HeadShape {
  int cp = 1;          // ranks in the group (the communicator's size)
  Capacity capacity;   // max_seqs: sequences of the layouts (entries - 1); max_tokens: global rows T
  Mask mask;
  DType dtype = DType::kBFloat16;  // q, k, v, out, dout
  // The rows of the local tensors: dual_chunk needs max_tokens and every P_b multiples of
  // 2*cp; contiguous only max_tokens % cp == 0.
  CpLayout layout = CpLayout::kDualChunk;
  // all_to_all needs q_heads % cp == 0 and kv_heads % cp == 0, and works with either layout.
  CpComm comm = CpComm::kAllGather;
  // all_gather's (and a2a+ag's across the groups) K/V rows; halo not with comm=all_to_all
  // (and on the CUDA backend only as thdcp/cp/cuda.h says).
  KvGather kv_gather = KvGather::kAuto;
  // a2a+ag only (other comms: leave it 1): the ranks of an all-to-all group, a divisor of cp
  // that divides q_heads and kv_heads; ag_size = cp / a2a_size groups. 1 is all_gather, cp
  // all_to_all.
  int a2a_size = 1;
  // The dtype in which the whole gather's dK/dV partial sums cross ranks (its reduce-scatter):
  // fp32 (the default: every rank's fp32 partials summed, then rounded once into dk, dv), or
  // the problem's dtype (half the bytes: each rank's fp32 partials rounded once to it before
  // the collective, the sum in that dtype; see "Reduced-precision reduce-scatter" below).
  // The halo gather's edges always cross in fp32. a2a+ag: its AllGather's across the groups.
  DType reduce_dtype = DType::kFloat32;
  // Heads in slices, so that the communication of one slice runs beside the attention of
  // the slice before it (on two streams in the CUDA backend). Every head is computed alone,
  // so the results are the same bits for every value. a2a+ag: leave it 1.
  //  - all_to_all: the CUDA backend exchanges and attends each rank's H/cp heads in this many
  //    slices; a divisor of q_heads / cp and kv_heads / cp. The CPU backend computes every
  //    head at once whatever it says.
  //  - all_gather: the forward gathers K/V and attends in this many slices of heads (both
  //    backends), so that only the first slice's gather is exposed; the backward is
  //    unchanged. A divisor of q_heads and kv_heads; the whole gather (kv_gather halo is
  //    refused; auto then gathers the whole).
  int head_slices = 1;

  int64_t local_rows() const { return capacity.max_tokens / cp; }
};

// The steps of one CP forward or backward, in order. Timings are kept per phase.
enum class Phase : int { kTable = 0, kGather, kReorder, kAttention, kReduce, kCast, kCount };
const char* phase_name(Phase phase);  // "table", "gather", ...

// Seconds spent per phase on this rank (accumulated; zero it between steps).
struct Timings {
  double seconds[static_cast<int>(Phase::kCount)] = {};
  double& operator[](Phase p) { return seconds[static_cast<int>(p)]; }
  double operator[](Phase p) const { return seconds[static_cast<int>(p)]; }
  double total() const;
};

// The tensors of one step on this rank (ForwardTensors, BackwardTensors of
// thdcp/plan/attention_shape.h): q, out, dout, dq: [T/cp, Hq, D]; k, v, dk, dv:
// [T/cp, Hkv, D]; lse Hq * T/cp floats ([Hq, T/cp]); max_logit Hq floats (max-reduced over
// the group) or nullptr. dq: q's dtype or fp32 (the CUDA backend takes fp32 dq under
// all_to_all only); dk, dv: k's dtype or fp32 (their fp32 partial sums are reduce-scattered in
// fp32 and rounded once). BackwardTensors::dkv_rows is the
// plan's own business: leave it null.
// Every local tensor is a view with any row and head strides (thdcp/core/tensor.h: packed
// QKV, padded, head-major [H, T/cp, D] memory). k and v are packed into dense rows (the
// plan's own buffer) before the all-gather; dk and dv are written through their strides; q,
// out, dout and dq go to the attention as they are. Outputs must not overlap themselves or
// another tensor of the step (thdcp/core/overlap.h). (The CUDA backend: thdcp/cp/cuda.h.)
//
// Attention sinks (ForwardTensors::sinks, BackwardTensors::sinks and dsinks; the CPU and
// CUDA backends): every rank passes the same [Hq] sinks, or none. A
// rank computes each of its query rows whole, over every gathered key, so each row counts
// its head's sink once (no partial rows are merged across ranks). dsinks is the sum over
// every rank's rows, added in rank order: the same bits on every rank and every run. Under
// all_to_all a rank computes whole rows of its H/cp heads; each head's dsinks comes from the
// one rank that owns it, and every rank receives them all. Under a2a+ag each head's dsinks is
// summed over the groups in rank order by its member's AllGather, and every rank receives
// them all.

// Reduced-precision reduce-scatter (Problem::reduce_dtype = the problem's bf16 or fp16). A
// key row's gradient is the sum over the cp ranks of their partial sums p_r (each exact in
// fp32 to the attention's own rounding). Rounding each p_r to the dtype (unit roundoff u:
// 2^-8 bf16, 2^-11 fp16) and summing in it adds at most u (|p_1| + ... + |p_cp|) for the
// roundings of the partials and (cp - 1) u (|p_1| + ... + |p_cp|) for the roundings of the
// running sums (NCCL's ring rounds each step; ranks sharing a GPU and the CPU backend sum in
// fp32 and round once), before the one rounding every dk, dv gets anyway: an error of at most
// cp u (|p_1| + ... + |p_cp|), against u |sum| for the fp32 reduce-scatter. The tests hold dk
// and dv to the storage tolerance plus 2 cp u max|reference| (a margin of 2 for partials that
// cancel; tests/cp/test_cp_reduce_dtype.cpp).
//
// The bytes a rank receives from the other ranks in one all_gather step of a layout: K and V
// (the problem's dtype) in the forward; K and V again, then dK and dV (fp32 partial sums) in
// the backward. Whole: (cp - 1) * T/cp rows of each; halo: the rank's halo rows, then the rows
// of the others' halos that it holds. Sinks' gradients and max_logit are not counted.
struct KvTraffic {
  KvGather gather = KvGather::kWhole;  // what the step runs: whole or halo, never auto
  std::vector<int64_t> forward_bytes;  // [cp], by rank
  std::vector<int64_t> backward_bytes;  // [cp], by rank
};

// The CPU backend: host tensors, any host Communicator (in-process threads, MPI).
class CpuPlan {
 public:
  // Collective over `comm`. Throws thdcp::Error on every rank when any rank's problem is
  // invalid or differs from rank 0's.
  CpuPlan(Communicator& comm, const Problem& problem, const AttentionOptions& options = {});

  // One step on this rank. `layout` is this batch's global layout: at most
  // problem.capacity.max_seqs sequences, total rows problem.capacity.max_tokens, every P_b a
  // multiple of 2*cp under the dual-chunk layout (checked here, on this rank: every rank must
  // pass the same layout, as every NCCL rank must pass the same counts). Outputs are written
  // only after every check.
  void forward(const LayoutView& layout, const ForwardTensors& tensors, Timings* timings = nullptr);
  void backward(const LayoutView& layout, const BackwardTensors& tensors, Timings* timings = nullptr);

  const Problem& problem() const { return problem_; }

  // What a step of `layout` moves between the ranks, and whether it gathers whole or the halo
  // (kv_gather auto: the halo when its bytes over all ranks are fewer; the same choice on every
  // rank, from the layout alone). Host arithmetic only; every rank may call it, collective or
  // not. Throws thdcp::Error for comm=all_to_all (no K/V gather) or a layout the plan refuses.
  // a2a+ag: the AllGather across the groups (each rank's kv_heads/a2a_size heads, the bytes
  // of rank r those of its group r / a2a_size); the all-to-alls are not counted.
  KvTraffic kv_traffic(const LayoutView& layout) const;

  struct Buffers;  // host workspace, sized by the capacity
  // What a one-shot call (cp::forward/backward below) also agrees on: its layout, the rows
  // it was passed and its own argument checks.
  struct OneShot;
  static CpuPlan make_one_shot(Communicator& comm, const Problem& problem, const AttentionOptions& options,
                               const OneShot& agreement);

 private:
  CpuPlan(Communicator& comm, const Problem& problem, const AttentionOptions& options, const OneShot* one_shot);

  Communicator& comm_;
  Problem problem_;
  AttentionOptions options_;
  std::shared_ptr<Buffers> buffers_;
};

// One-shot forms: make a plan for this call's shapes (every rank checks its arguments and
// the ranks exchange the outcome, so an error on one rank makes every rank throw, and no
// rank is left waiting in a collective), run one step. The problem comes from the tensors
// and the layout (capacity = the layout's sequences and rows).
void forward(Communicator& comm, const LayoutView& layout, const Mask& mask, ConstThdTensor q, ConstThdTensor k,
             ConstThdTensor v, ThdTensor out, float* lse, float* max_logit, const AttentionOptions& options = {},
             Timings* timings = nullptr);
void backward(Communicator& comm, const LayoutView& layout, const Mask& mask, ConstThdTensor q, ConstThdTensor k,
              ConstThdTensor v, ConstThdTensor out, ConstThdTensor dout, const float* lse, ThdTensor dq, ThdTensor dk,
              ThdTensor dv, const AttentionOptions& options = {}, Timings* timings = nullptr);

}  // namespace thdcp::cp
