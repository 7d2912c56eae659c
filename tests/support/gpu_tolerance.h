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

// dk and dv of a CP step whose reduce-scatter ran in `dtype` (cp::Problem::reduce_dtype) at
// `cp` ranks: the gradient tolerance plus 2 cp u max|reference| (thdcp/cp/cp.h).
inline Tolerance gpu_reduced_grad_tolerance(DType dtype, int cp) {
  Tolerance t = gpu_grad_tolerance(dtype);
  t.atol_scale += 2.0 * cp * dtype_unit_roundoff(dtype);
  return t;
}

// A GPU step's outputs (storage dtype `dtype`) against `reference` within these tolerances:
// out, dq, dk, dv in the storage dtype, lse and max_logit in fp32 (dk and dv: the reduced
// tolerance of `reduced_cp` ranks, where the step's reduce-scatter ran in `dtype`). NaN never
// passes, so an output the step did not write fails.
void expect_gpu_close(const Outputs& got, const Outputs& reference, DType dtype, int reduced_cp = 0);

// A GPU d(sink) [Hq] against `reference_dsinks`, the CPU reference's of the call on `b` with
// `sinks` whose outputs were `reference` (sink_gradient_tolerance).
::testing::AssertionResult gpu_dsinks_match(const std::vector<float>& dsinks,
                                            const std::vector<float>& reference_dsinks, const Outputs& reference,
                                            const Batch& b, const std::vector<float>& sinks);

}  // namespace thdcp::test
