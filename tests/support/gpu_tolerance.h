// Tolerances of GPU results against the CPU reference (see derive_tensor_core_tolerance).
#pragma once

#include "thdcp/testing/compare.h"

namespace thdcp::test {

inline Tolerance gpu_out_tolerance(DType dtype) { return derive_tensor_core_tolerance(dtype, 1); }
inline Tolerance gpu_grad_tolerance(DType dtype) { return derive_tensor_core_tolerance(dtype, 2); }
inline const Tolerance kGpuFp32ResultTolerance = tensor_core_fp32_tolerance();

}  // namespace thdcp::test
