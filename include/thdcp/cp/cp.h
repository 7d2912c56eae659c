// AllGather context parallelism (DESIGN.md section 5) on host tensors with the CPU backend,
// over any Communicator (in-process threads or MPI processes).
//
// Every rank passes the same global layout (cu_seqlens / cu_seqlens_padded of the whole
// batch, each P_b a multiple of 2*cp, cp = comm.size()) and its local tensors in the
// dual-chunk order of thdcp/dual_chunk.h (T / cp rows; thdcp/dispatch.h makes them).
#pragma once

#include "thdcp/cpu/attention.h"
#include "thdcp/comm/communicator.h"
#include "thdcp/plan/layout.h"
#include "thdcp/plan/mask.h"

namespace thdcp::cp {

// Seconds spent per phase on this rank (accumulated; zero it between steps).
struct Timings {
  double check = 0;      // validation, including the cross-rank consistency check
  double gather = 0;     // all-gather of K/V
  double reorder = 0;    // rank order <-> sequence order
  double attention = 0;  // the attention call over the rank's segment table
  double reduce = 0;     // max_logit all-reduce, dK/dV reduce-scatter
};

// Forward on this rank. Shapes: q, out [T/cp, Hq, D]; k, v [T/cp, Hkv, D]; lse Hq * T/cp
// floats ([Hq, T/cp]); max_logit Hq floats (max-reduced over the group) or nullptr.
// Argument errors on any rank make every rank throw thdcp::Error (no rank is left waiting
// in a collective), before any output is written.
void forward(Communicator& comm, const LayoutView& layout, const Mask& mask, ConstThdTensor q, ConstThdTensor k,
             ConstThdTensor v, ThdTensor out, float* lse, float* max_logit, const AttentionOptions& options = {},
             Timings* timings = nullptr);

// Backward on this rank: dq [T/cp, Hq, D] (q's dtype or fp32); dk, dv [T/cp, Hkv, D] (k's
// dtype or fp32). K/V are gathered again; their gradients are accumulated in fp32 over
// both segments of the rank, then summed across ranks by reduce-scatter in fp32 and
// rounded to dk/dv's dtype once.
void backward(Communicator& comm, const LayoutView& layout, const Mask& mask, ConstThdTensor q, ConstThdTensor k,
              ConstThdTensor v, ConstThdTensor out, ConstThdTensor dout, const float* lse, ThdTensor dq, ThdTensor dk,
              ThdTensor dv, const AttentionOptions& options = {}, Timings* timings = nullptr);

}  // namespace thdcp::cp
