// The AllGather CP algorithm, written once (DESIGN.md section 5). A step set supplies the
// operations for one backend; the CPU one (allgather_cp.cpp) works on host buffers with a
// host communicator, the CUDA one (allgather_cp_cuda.cpp) enqueues on streams with a device
// communicator. Both hand out views of buffers they own, sized by the plan's capacity.
//
// Lanes. Work goes to one of two lanes: kCollectives (gathers, reorders, reduce-scatters,
// casts) and kCompute (the attention kernels). A backend that overlaps them (CUDA: a second
// stream of high priority) runs the reduce-scatter of dK/dV while the dQ pass runs: the
// backward's dK/dV pass then dQ pass are two launches. Where the kernels compute dQ in the
// dK/dV pass (Hopper, head dim 128, no left window), only the fp32 dQ's store runs beside
// the reduce-scatter, which is then mostly exposed unless the plan's options ask for a dQ
// pass of its own (AttentionOptions::separate_dq_pass; bench/RESULTS.md, CP scaling). The
// forward's attention needs every gathered key, so its gather has nothing to run beside.
// A backend that does not overlap (the CPU one, or CUDA while phases are timed) runs
// everything in program order; its lanes are one.
//
//   void fork() / join()                     the collectives lane starts after what the
//                                            caller enqueued before / the caller's later
//                                            work waits for both lanes
//   void use(Lane)                           where subsequent calls enqueue
//   void signal(Ready) / await(Ready)        the K/V (kKv) or the dK/dV (kGrads) are ready /
//                                            the current lane waits for them
//   void phase(Phase p)                      subsequent work belongs to p (timing)
//   void build_table()                       this rank's segment table for the batch
//   ConstThdTensor gather(local, Slot)       all-gather of a local K or V, rank order; a step
//                                            set may bring only the halo instead (the CPU
//                                            one: Problem::kv_gather; its own rows, then
//                                            the halo's) and return its dK/dV in
//                                            to_rank_order / reduce_scatter
//   ConstThdTensor to_sequence_order(gathered, Slot, first_head)   the K or V in sequence
//                                            order: `gathered` holds the heads [first_head,
//                                            first_head + gathered.heads) of every row, and
//                                            the view returned is those heads of
//                                            sequence_order(Slot)
//   ConstThdTensor sequence_order(Slot)      the sequence-order K or V, as the last
//                                            to_sequence_order call left it
//   void attention_forward(q, k_seq, v_seq, out, lse, max_logit, first_q_head)
//                                            over views of heads [first_q_head, + q.heads)
//                                            (the sinks from that head on)
//   void max_reduce(max_logit, count)
//   SequenceGrads attention_backward_keys(q, k_seq, v_seq, out, dout, lse, dq)
//                                            fp32 dK/dV of every gathered row, in the order
//                                            to_rank_order takes: sequence order (CPU), or
//                                            already the ranks' order (CUDA: the kernels
//                                            accumulate each key row's gradient at its
//                                            rank-order row); dQ where the backend's key pass
//                                            computes it (CPU)
//   void attention_backward_queries()        dQ (after the key pass)
//   ThdTensor to_rank_order(grads_fp32, Slot) to the order the ranks hold their rows in
//   ThdTensor reduce_scatter(rank_ordered_fp32, Slot)   this rank's rows, summed over ranks
//   void cast(local_fp32, ThdTensor grad)    one rounding to the gradient's dtype
//
// The collectives are issued in the same order on every rank, and on the device one after
// another: the collectives lane runs them in order, and the forward's max_reduce (on the
// compute lane) starts only after the attention, which waited for the gather.
//
// Head slices (Problem::head_slices = S): the forward gathers and reorders the K/V heads of
// one slice (Hkv / S heads) at a time, and the compute lane attends that slice's query heads
// (Hq / S) as soon as they are in sequence order, beside the next slice's gather: only the
// first slice's gather and reorder are left before the first attention. Every head is
// computed alone, so every S gives the same bits. The K/V of every slice end up in the one
// sequence-order buffer, which the backward then reads whole (gathered again or kept).
#pragma once

#include <tuple>

#include "head_views.h"
#include "thdcp/cp/cp.h"

namespace thdcp::cp::detail {

// Which of the step set's buffers a call uses.
enum class Slot { kK, kV };
enum class Lane { kCollectives, kCompute };
enum class Ready { kKv, kGrads };

struct SequenceGrads {
  ThdTensor dk, dv;  // fp32, [T, Hkv, D], every gathered row (order: see attention_backward_keys)
};

template <typename Steps>
void run_forward(Steps& steps, const ForwardTensors& t, int head_slices = 1) {
  steps.phase(Phase::kTable);
  steps.build_table();
  steps.fork();
  const int64_t q_heads = t.q.heads / head_slices, kv_heads = t.k.heads / head_slices;  // per slice
  for (int s = 0; s < head_slices; ++s) {
    const int64_t q0 = s * q_heads, kv0 = s * kv_heads;  // the slice's first heads
    steps.use(Lane::kCollectives);
    steps.phase(Phase::kGather);
    const ConstThdTensor k_gathered = steps.gather(heads_of(t.k, kv0, kv_heads), Slot::kK);
    const ConstThdTensor v_gathered = steps.gather(heads_of(t.v, kv0, kv_heads), Slot::kV);
    steps.phase(Phase::kReorder);
    const ConstThdTensor k_seq = steps.to_sequence_order(k_gathered, Slot::kK, kv0);
    const ConstThdTensor v_seq = steps.to_sequence_order(v_gathered, Slot::kV, kv0);
    steps.signal(Ready::kKv);
    steps.use(Lane::kCompute);
    steps.await(Ready::kKv);
    steps.phase(Phase::kAttention);
    // lse is [Hq, T_local]: the slice's planes follow one another.
    steps.attention_forward(heads_of(t.q, q0, q_heads), k_seq, v_seq, heads_of(t.out, q0, q_heads),
                            t.lse + q0 * t.q.tokens, t.max_logit ? t.max_logit + q0 : nullptr, q0);
  }
  if (t.max_logit) {
    steps.phase(Phase::kReduce);
    steps.max_reduce(t.max_logit, static_cast<size_t>(t.q.heads));
  }
  steps.join();
  steps.phase(Phase::kCount);
}

// `gather_kv` false: K/V in sequence order are the ones the step set kept from the forward
// of the same step (sequence_order), and neither the gather nor the reorder runs again.
template <typename Steps>
void run_backward(Steps& steps, const BackwardTensors& t, bool gather_kv = true) {
  steps.phase(Phase::kTable);
  steps.build_table();
  steps.fork();
  if (gather_kv) {
    steps.use(Lane::kCollectives);
    steps.phase(Phase::kGather);
    const ConstThdTensor k_gathered = steps.gather(t.k, Slot::kK);
    const ConstThdTensor v_gathered = steps.gather(t.v, Slot::kV);
    steps.phase(Phase::kReorder);
    steps.to_sequence_order(k_gathered, Slot::kK, 0);
    steps.to_sequence_order(v_gathered, Slot::kV, 0);
    steps.signal(Ready::kKv);
    steps.use(Lane::kCompute);
    steps.await(Ready::kKv);
  }
  steps.phase(Phase::kAttention);
  const SequenceGrads grads = steps.attention_backward_keys(t.q, steps.sequence_order(Slot::kK),
                                                            steps.sequence_order(Slot::kV), t.out, t.dout, t.lse,
                                                            t.dq);
  steps.signal(Ready::kGrads);
  steps.use(Lane::kCollectives);
  steps.await(Ready::kGrads);
  for (const auto& [seq, grad, slot] : {std::make_tuple(grads.dk, t.dk, Slot::kK),
                                        std::make_tuple(grads.dv, t.dv, Slot::kV)}) {
    steps.phase(Phase::kReorder);
    const ThdTensor rank_ordered = steps.to_rank_order(seq, slot);
    steps.phase(Phase::kReduce);
    const ThdTensor local = steps.reduce_scatter(rank_ordered, slot);
    steps.phase(Phase::kCast);
    steps.cast(local, grad);
  }
  steps.use(Lane::kCompute);
  steps.phase(Phase::kAttention);
  steps.attention_backward_queries();
  steps.join();
  steps.phase(Phase::kCount);
}

}  // namespace thdcp::cp::detail
