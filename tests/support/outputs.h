// The outputs of one attention step (forward and backward) on the host, as every test
// compares them: against a reference within a tolerance, or bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "support/random_batch.h"
#include "thdcp/core/tensor.h"
#include "thdcp/plan/segment_table.h"

namespace thdcp::test {

// out [rows, Hq, D_v]; dq [rows, Hq, D_qk]; dk [rows, Hkv, D_qk]; dv [rows, Hkv, D_v];
// lse [Hq, rows]; max_logit [Hq].
struct Outputs {
  HostTensor out, dq, dk, dv;
  std::vector<float> lse, max_logit;
};

// Zeroed outputs of `rows` rows with the heads of `b`: out in q's dtype, dq in `dq_dtype`,
// dk and dv in `dkv_dtype`.
Outputs outputs_for(const Batch& b, int64_t rows, DType dq_dtype, DType dkv_dtype);

// Every element NaN, so that an output no call wrote cannot pass.
void poison(Outputs& o);

// outputs_for, poisoned.
Outputs poisoned_outputs(const Batch& b, int64_t rows, DType dq_dtype, DType dkv_dtype);

bool same_bits(const HostTensor& a, const HostTensor& b);
bool same_bits(const std::vector<float>& a, const std::vector<float>& b);

// Every output of `a` equals `b` bit for bit; names the first that does not and where.
::testing::AssertionResult identical(const Outputs& a, const Outputs& b);

// The CPU reference forward and backward of `b` over `table` into `r` (sized for it).
void cpu_reference(const SegmentTable& table, const Batch& b, const AttentionOptions& options, Outputs& r);

// The same with attention sinks: `sinks` [Hq] host fp32 (null: none) in the forward and the
// backward, and d(sink) into `dsinks` [Hq] (null: not computed; needs sinks).
void cpu_reference(const SegmentTable& table, const Batch& b, const AttentionOptions& options, const float* sinks,
                   float* dsinks, Outputs& r);

// No element is NaN (the poison): every output was written. Two NaN-poisoned buffers that no
// call wrote would otherwise be equal bit for bit.
::testing::AssertionResult all_written(const Outputs& o);

}  // namespace thdcp::test
