// The AllGather CP algorithm, written once (DESIGN.md section 5). A step set supplies the
// operations for one backend; the CPU one (allgather_cp.cpp) works on host buffers with a
// host communicator, the CUDA one (allgather_cp_cuda.cpp) enqueues on streams with a device
// communicator. Both hand out views of buffers they own, sized by the plan's capacity.
//
// Lanes and head groups. Work goes to one of two lanes: kCollectives (gathers, reorders,
// reduce-scatters, casts) and kCompute (the attention kernels). A backend that overlaps them
// (CUDA: a second stream of high priority) runs
//   - in the forward, the K/V gather of head group g + 1 while group g's attention runs (the
//     heads split into head_groups() groups: KV heads and their query heads; heads are
//     independent, so the split changes no value), and
//   - in the backward, the reduce-scatter of dK/dV while the dQ pass runs (the backward runs
//     every head at once: its dK/dV pass then dQ pass are two launches, and a split would
//     only slow the dK/dV pass that the reduce-scatter then competes with). Where the
//     kernels compute dQ in the dK/dV pass (Hopper, head dim 128, no left window), only the
//     fp32 dQ's store runs beside the reduce-scatter, which is then mostly exposed
//     (bench/RESULTS.md, CP scaling with the one-pass backward).
// A backend that does not overlap (the CPU one, or CUDA while phases are timed) runs
// everything in program order; its lanes are one.
//
//   int head_groups()                        G; views of group g are head_group(t, g, G)
//   void fork() / join()                     the collectives lane starts after what the
//                                            caller enqueued before / the caller's later
//                                            work waits for both lanes
//   void use(Lane)                           where subsequent calls enqueue
//   void signal(Ready, g) / await(Ready, g)  group g's K/V (kKv) or the dK/dV (kGrads, g = 0)
//                                            are ready / the current lane waits for them
//   void phase(Phase p)                      subsequent work belongs to p (timing)
//   void build_table()                       this rank's segment table for the batch
//   ConstThdTensor gather(local, Slot, g)    all-gather of group g's heads of a local K or V,
//                                            rank order
//   ConstThdTensor to_sequence_order(gathered, Slot, g)   group g's heads of the sequence-order
//                                            K or V (a view of the whole one)
//   ConstThdTensor sequence_order(Slot)      the whole sequence-order K or V, as the last
//                                            to_sequence_order calls left it
//   void attention_forward(q, k_seq, v_seq, out, lse, max_logit)   one group's views
//   kLocalFirst, bool local_first()          (CUDA) whether this forward runs local-first
//                                            (cp::Problem::local_first)
//   void attention_local(q, k, v, max_logit) then: one group's queries against their own
//                                            chunks' keys (this rank's K/V), into the step
//                                            set's fp32 partial result, which the group's
//                                            attention_forward (keys before the chunks)
//                                            merges by LSE
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
// compute lane) starts only after the last group's attention, which waited for the last
// gather.
#pragma once

#include <tuple>
#include <type_traits>

#include "thdcp/cp/cp.h"

namespace thdcp::cp::detail {

// Which of the step set's buffers a call uses.
enum class Slot { kK, kV };
enum class Lane { kCollectives, kCompute };
enum class Ready { kKv, kGrads };

struct SequenceGrads {
  ThdTensor dk, dv;  // fp32, [T, Hkv, D], every gathered row (order: see attention_backward_keys)
};

// Heads g * heads/groups .. (g + 1) * heads/groups - 1 of t, as a view with t's strides.
template <typename Tensor>
Tensor head_group(Tensor t, int g, int groups) {
  const int64_t heads = t.heads / groups;
  const int64_t row = t.row_step(), head = t.head_step();
  using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<decltype(t.data)>>, const unsigned char,
                                  unsigned char>;
  t.data = static_cast<Byte*>(t.data) + static_cast<size_t>(g * heads * head) * dtype_size(t.dtype);
  t.heads = heads;
  t.row_stride = row;
  t.head_stride = head;
  return t;
}

// The [Hq, rows] floats of group g's query heads.
template <typename Float>
Float* head_group_rows(Float* per_head_rows, int64_t rows, int64_t q_heads, int g, int groups) {
  return per_head_rows ? per_head_rows + g * (q_heads / groups) * rows : nullptr;
}

// The groups are enqueued one after another (group g's gather, then its attention), so that
// the host's enqueueing of later groups' collectives never holds back the compute lane.
template <typename Steps>
void run_forward(Steps& steps, const ForwardTensors& t) {
  steps.phase(Phase::kTable);
  steps.build_table();
  const int groups = steps.head_groups();
  const int64_t rows = t.q.tokens, hq = t.q.heads;
  steps.fork();
  for (int g = 0; g < groups; ++g) {
    steps.use(Lane::kCollectives);
    steps.phase(Phase::kGather);
    const ConstThdTensor k_gathered = steps.gather(head_group(t.k, g, groups), Slot::kK, g);
    const ConstThdTensor v_gathered = steps.gather(head_group(t.v, g, groups), Slot::kV, g);
    steps.phase(Phase::kReorder);
    const ConstThdTensor k_seq = steps.to_sequence_order(k_gathered, Slot::kK, g);
    const ConstThdTensor v_seq = steps.to_sequence_order(v_gathered, Slot::kV, g);
    steps.signal(Ready::kKv, g);
    steps.use(Lane::kCompute);
    if constexpr (Steps::kLocalFirst) {
      // Needs no gathered row: runs while the gather above is in flight.
      if (steps.local_first()) {
        steps.phase(Phase::kAttention);
        steps.attention_local(head_group(t.q, g, groups), head_group(t.k, g, groups), head_group(t.v, g, groups),
                              head_group_rows(t.max_logit, 1, hq, g, groups));
      }
    }
    steps.await(Ready::kKv, g);
    steps.phase(Phase::kAttention);
    steps.attention_forward(head_group(t.q, g, groups), k_seq, v_seq, head_group(t.out, g, groups),
                            head_group_rows(t.lse, rows, hq, g, groups),
                            head_group_rows(t.max_logit, 1, hq, g, groups));
  }
  if (t.max_logit) {
    steps.phase(Phase::kReduce);
    steps.max_reduce(t.max_logit, static_cast<size_t>(hq));
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
    const int groups = steps.head_groups();
    for (int g = 0; g < groups; ++g) {
      steps.phase(Phase::kGather);
      const ConstThdTensor k_gathered = steps.gather(head_group(t.k, g, groups), Slot::kK, g);
      const ConstThdTensor v_gathered = steps.gather(head_group(t.v, g, groups), Slot::kV, g);
      steps.phase(Phase::kReorder);
      steps.to_sequence_order(k_gathered, Slot::kK, g);
      steps.to_sequence_order(v_gathered, Slot::kV, g);
    }
    steps.signal(Ready::kKv, 0);
    steps.use(Lane::kCompute);
    steps.await(Ready::kKv, 0);
  }
  steps.phase(Phase::kAttention);
  const SequenceGrads grads = steps.attention_backward_keys(t.q, steps.sequence_order(Slot::kK),
                                                            steps.sequence_order(Slot::kV), t.out, t.dout, t.lse,
                                                            t.dq);
  steps.signal(Ready::kGrads, 0);
  steps.use(Lane::kCollectives);
  steps.await(Ready::kGrads, 0);
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
