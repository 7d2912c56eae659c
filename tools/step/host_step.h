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

  // Bytes of a [rows, heads, dim] tensor of the storage dtype (checked_tensor_bytes); dim 0:
  // head_dim (D_qk; value_head_dim() for v, out, dout, dv).
  size_t bytes(int64_t rows, int64_t heads, int64_t dim = 0) const;
};

// The problems of a shape: the single-device call (every gradient in the storage dtype) and
// the CP step of `cp` ranks.
AttentionProblem attention_problem(const StepShape& shape, const Capacity& capacity, const Mask& mask);
cp::Problem cp_problem(const StepShape& shape, int cp, const Capacity& capacity, const Mask& mask,
                       CpLayout layout = CpLayout::kDualChunk, cp::CpComm comm = cp::CpComm::kAllGather,
                       cp::KvGather kv_gather = cp::KvGather::kAuto, int a2a_size = 1,
                       DType reduce_dtype = DType::kFloat32);

// The batch of `lengths` (each padded to a multiple of 2*cp) in capacity form, a capacity
// that holds exactly it: max_seqs = documents + 1, max_tokens = its rows.
BatchLayout exact_layout(const std::vector<int64_t>& lengths, int cp);

// A step's inputs on the host: q [rows, Hq, D_qk], k [rows, Hkv, D_qk], v [rows, Hkv, D_v],
// dout [rows, Hq, D_v].
struct HostInputs {
  HostTensor q, k, v, dout;
};

// Zeros of the shape of a step's inputs on `rows` rows.
HostInputs host_inputs(const StepShape& shape, int64_t rows);

// A step's results on the host: out [rows, Hq, D_v], dq [rows, Hq, D_qk], dk [rows, Hkv,
// D_qk], dv [rows, Hkv, D_v], lse [Hq, rows], max_logit [Hq]; with attention sinks dsinks
// [Hq] (empty without).
struct HostOutputs {
  HostTensor out, dq, dk, dv;
  std::vector<float> lse, max_logit;
  std::vector<float> dsinks;
};

// Zeros of the shape of a step's results on `rows` rows.
HostOutputs host_outputs(const StepShape& shape, int64_t rows);

// The CPU reference (fp32 arithmetic) of a whole batch: forward and backward over `table`.
HostOutputs cpu_reference(const SegmentTable& table, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                          const HostTensor& dout);

}  // namespace thdcp::tools
