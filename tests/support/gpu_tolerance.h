// Tolerances of GPU results against the CPU reference (see derive_tensor_core_tolerance).
#pragma once

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

}  // namespace thdcp::test
