// Tolerances of GPU results against the CPU reference (see derive_tensor_core_tolerance).
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "support/outputs.h"
#include "thdcp/testing/compare.h"

namespace thdcp::test {

inline Tolerance gpu_out_tolerance(DType dtype) { return derive_tensor_core_tolerance(dtype, 1); }
inline Tolerance gpu_grad_tolerance(DType dtype) { return derive_tensor_core_tolerance(dtype, 2); }
inline const Tolerance kGpuFp32ResultTolerance = tensor_core_fp32_tolerance();

// A GPU step's outputs (storage dtype `dtype`) against `reference` within these tolerances:
// out, dq, dk, dv in the storage dtype, lse and max_logit in fp32. NaN never passes, so an
// output the step did not write fails.
void expect_gpu_close(const Outputs& got, const Outputs& reference, DType dtype);

// A GPU d(sink) [Hq] against `reference_dsinks`, the CPU reference's of the call on `b` with
// `sinks` whose outputs were `reference` (sink_gradient_tolerance).
::testing::AssertionResult gpu_dsinks_match(const std::vector<float>& dsinks,
                                            const std::vector<float>& reference_dsinks, const Outputs& reference,
                                            const Batch& b, const std::vector<float>& sinks);

}  // namespace thdcp::test
