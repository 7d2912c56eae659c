// The AllGather CP algorithm, written once (DESIGN.md section 5). A step set supplies the
// operations for one backend; the CPU one (allgather_cp.cpp) works on host buffers with a
// host communicator, the CUDA one (allgather_cp_cuda.cpp) enqueues on a stream with a device
// communicator. Both hand out views of buffers they own, sized by the plan's capacity:
//
//   void phase(Phase p)                      subsequent work belongs to p (timing)
//   void build_table()                       this rank's segment table for the batch
//   ConstThdTensor gather(local, Slot)       all-gather of a local K or V, rank order
//   ConstThdTensor to_sequence_order(gathered, Slot)
//   ConstThdTensor kept_sequence_order(local, Slot)   what the last to_sequence_order left
//   void attention_forward(q, k_seq, v_seq, out, lse, max_logit)
//   void max_reduce(max_logit, count)
//   SequenceGrads attention_backward(q, k_seq, v_seq, out, dout, lse, dq)   fp32 dK/dV of
//                                            every gathered row, in the order to_rank_order
//                                            takes: sequence order (CPU), or already the
//                                            ranks' order (CUDA: the kernels accumulate each
//                                            key row's gradient at its rank-order row)
//   ThdTensor to_rank_order(grads_fp32, Slot) to the order the ranks hold their rows in
//   ThdTensor reduce_scatter(rank_ordered_fp32, Slot)   this rank's rows, summed over ranks
//   void cast(local_fp32, ThdTensor grad)    one rounding to the gradient's dtype
#pragma once

#include <tuple>

#include "thdcp/cp/cp.h"

namespace thdcp::cp::detail {

// Which of the step set's buffers a call uses.
enum class Slot { kK, kV };

struct SequenceGrads {
  ThdTensor dk, dv;  // fp32, [T, Hkv, D], every gathered row (order: see attention_backward above)
};

template <typename Steps>
void run_forward(Steps& steps, const ForwardTensors& t) {
  steps.phase(Phase::kTable);
  steps.build_table();
  steps.phase(Phase::kGather);
  const ConstThdTensor k_gathered = steps.gather(t.k, Slot::kK);
  const ConstThdTensor v_gathered = steps.gather(t.v, Slot::kV);
  steps.phase(Phase::kReorder);
  const ConstThdTensor k_seq = steps.to_sequence_order(k_gathered, Slot::kK);
  const ConstThdTensor v_seq = steps.to_sequence_order(v_gathered, Slot::kV);
  steps.phase(Phase::kAttention);
  steps.attention_forward(t.q, k_seq, v_seq, t.out, t.lse, t.max_logit);
  if (t.max_logit) {
    steps.phase(Phase::kReduce);
    steps.max_reduce(t.max_logit, static_cast<size_t>(t.q.heads));
  }
  steps.phase(Phase::kCount);
}

// `gather_kv` false: K/V in sequence order are the ones the step set kept from the forward
// of the same step (kept_sequence_order), and neither the gather nor the reorder runs again.
template <typename Steps>
void run_backward(Steps& steps, const BackwardTensors& t, bool gather_kv = true) {
  steps.phase(Phase::kTable);
  steps.build_table();
  ConstThdTensor k_seq, v_seq;
  if (gather_kv) {
    steps.phase(Phase::kGather);
    const ConstThdTensor k_gathered = steps.gather(t.k, Slot::kK);
    const ConstThdTensor v_gathered = steps.gather(t.v, Slot::kV);
    steps.phase(Phase::kReorder);
    k_seq = steps.to_sequence_order(k_gathered, Slot::kK);
    v_seq = steps.to_sequence_order(v_gathered, Slot::kV);
  } else {
    k_seq = steps.kept_sequence_order(t.k, Slot::kK);
    v_seq = steps.kept_sequence_order(t.v, Slot::kV);
  }
  steps.phase(Phase::kAttention);
  const SequenceGrads grads = steps.attention_backward(t.q, k_seq, v_seq, t.out, t.dout, t.lse, t.dq);
  for (const auto& [seq, grad, slot] : {std::make_tuple(grads.dk, t.dk, Slot::kK),
                                        std::make_tuple(grads.dv, t.dv, Slot::kV)}) {
    steps.phase(Phase::kReorder);
    const ThdTensor rank_ordered = steps.to_rank_order(seq, slot);
    steps.phase(Phase::kReduce);
    const ThdTensor local = steps.reduce_scatter(rank_ordered, slot);
    steps.phase(Phase::kCast);
    steps.cast(local, grad);
  }
  steps.phase(Phase::kCount);
}

}  // namespace thdcp::cp::detail
