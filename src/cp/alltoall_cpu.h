// All-to-all (Ulysses) CP on the CPU backend (Problem::comm == CpComm::kAllToAll), for either
// CP layout of the local rows.
//
// Forward on rank r: an all-to-all turns the sequence-sharded q, k, v ([T/cp, H, D], the
// layout's rows) into head-sharded ones ([T, H/cp, D] in sequence order: every row of the
// heads [r H/cp, (r+1) H/cp)); attention runs over whole documents (the single-device segment
// table) with those heads; a second all-to-all returns out and lse to the rank's rows, and
// an all-gather assembles max_logit. Backward: q, k, v, out, dout and lse go head-sharded the
// same way, the reference backward gives fp32 dQ/dK/dV of the rank's heads, and an all-to-all
// returns them to the rank's rows, rounded once. No partial sums cross ranks: each head's
// rows, sink and d(sink) belong to one rank.
#pragma once

#include <vector>

#include "thdcp/comm/communicator.h"
#include "thdcp/cp/cp.h"

namespace thdcp::cp::detail {

// Host buffers of the all-to-all steps (grown on first use, then reused).
struct AllToAllBuffers {
  std::vector<unsigned char> send, recv;          // one all-to-all's blocks
  std::vector<unsigned char> q, k, v, out, dout;  // head-sharded, sequence order, the problem's dtype
  std::vector<float> lse, dq, dk, dv;             // head-sharded, sequence order, fp32
  std::vector<float> max_logit, dsinks;           // this rank's heads
};

// One step on this rank; the plan has checked the problem, the layout and the tensors.
void all_to_all_forward(Communicator& comm, const Problem& problem, const AttentionOptions& options,
                        AllToAllBuffers& buffers, const LayoutView& layout, const ForwardTensors& tensors,
                        Timings* timings);
void all_to_all_backward(Communicator& comm, const Problem& problem, const AttentionOptions& options,
                         AllToAllBuffers& buffers, const LayoutView& layout, const BackwardTensors& tensors,
                         Timings* timings);

}  // namespace thdcp::cp::detail
