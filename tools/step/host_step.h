// One attention step on the host, for `thdcp run` and `thdcp bench`: its shape, the problems
// the library plans for it, its results and the CPU reference.
#pragma once

#include <cstdint>
#include <vector>

#include "thdcp/core/tensor.h"
#include "thdcp/cp/cp.h"
#include "thdcp/plan/attention_shape.h"
#include "thdcp/plan/layout.h"
#include "thdcp/plan/segment_table.h"

namespace thdcp::tools {

// The heads and the storage dtype of a step.
struct StepShape : HeadShape {
  DType dtype = DType::kBFloat16;

  // Bytes of a [rows, heads, D] tensor of the storage dtype (checked_tensor_bytes).
  size_t bytes(int64_t rows, int64_t heads) const;
};

// The problems of a shape: the single-device call (every gradient in the storage dtype) and
// the CP step of `cp` ranks.
AttentionProblem attention_problem(const StepShape& shape, const Capacity& capacity, const Mask& mask);
cp::Problem cp_problem(const StepShape& shape, int cp, const Capacity& capacity, const Mask& mask);

// The batch of `lengths` (each padded to a multiple of 2*cp) in capacity form, a capacity
// that holds exactly it: max_seqs = documents + 1, max_tokens = its rows.
BatchLayout exact_layout(const std::vector<int64_t>& lengths, int cp);

// A step's results on the host: out, dq [rows, Hq, D], dk, dv [rows, Hkv, D], lse [Hq, rows],
// max_logit [Hq].
struct HostOutputs {
  HostTensor out, dq, dk, dv;
  std::vector<float> lse, max_logit;
};

// Zeros of the shape of a step's results on `rows` rows.
HostOutputs host_outputs(const StepShape& shape, int64_t rows);

// The CPU reference (fp32 arithmetic) of a whole batch: forward and backward over `table`.
HostOutputs cpu_reference(const SegmentTable& table, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                          const HostTensor& dout);

}  // namespace thdcp::tools
