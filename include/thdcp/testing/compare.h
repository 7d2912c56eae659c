// Value comparisons with tolerances derived from the storage dtype (STYLE.md, Tests).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "thdcp/cpu/attention.h"
#include "thdcp/core/dtype.h"

namespace thdcp {

// |actual - reference| <= rtol * |reference| + atol_scale * max|reference|
struct Tolerance {
  double rtol = 0.0;
  double atol_scale = 0.0;
};

// Tolerance between two results that each went through `roundings` roundings to the
// storage dtype (1: a result against an unrounded fp64 reference; 2: two rounded results)
// after arithmetic in `accumulate` precision:
//   rtol       = roundings * u(storage), u = unit roundoff (2^-8 bf16, 2^-11 fp16, 2^-24 fp32)
//   atol_scale = 2^-24 * 128 for fp32 arithmetic: sums of up to ~16K terms in a different
//                order drift by about sqrt(n) * u_fp32 relative to the largest value;
//                2^-52 * 128 for fp64 arithmetic, plus the fp32 lse carried between passes.
Tolerance derive_tolerance(DType storage, Accumulate accumulate, int roundings);

// Tolerance of a tensor-core (GPU) result against the fp32 CPU reference. On top of
// derive_tolerance(storage, fp32, 2), the GPU rounds `rounded_operands` intermediate
// operands to the storage dtype before a matrix product (P before P.V for out; P and dS for
// the gradients), as every tensor-core attention does. Each such product is a sum of
// weights times rows with every weight off by at most u relative, so it is off by at most
// u * sum|w_j||x_j|: a few u of the largest value in the worst case. 4u of max|ref| is
// allowed per rounded operand. lse and max_logit, fp32 results of fp32 arithmetic, use
// tensor_core_fp32_tolerance(): they differ only by summation order and the hardware
// exp2/log2 approximations, far below 2^-16 relative.
Tolerance derive_tensor_core_tolerance(DType storage, int rounded_operands);
Tolerance tensor_core_fp32_tolerance();

// Tolerance of a GPU d(sink) [Hq] against the CPU reference's `reference_dsinks`, from the
// reference's out [rows, Hq, D_v] and lse [Hq, rows], the dout of the call and the sinks.
// dsink_h = -sum_r P_sink(h, r) (dO . O)(h, r), and the two backends' delta = dO . O differ
// by the storage rounding of out, a few units of roundoff of |dO| |O| each: the bound of
// head h is 16 u sum_r P_sink(h, r) |dO_r| |O_r|, given as an absolute tolerance (the
// largest over the heads) relative to max |reference_dsinks|.
Tolerance sink_gradient_tolerance(const HostTensor& out, const HostTensor& dout, const std::vector<float>& lse,
                                  const std::vector<float>& sinks, const std::vector<float>& reference_dsinks);

struct Comparison {
  int64_t count = 0;
  int64_t mismatches = 0;     // elements outside the tolerance (NaN always counts)
  double max_abs_error = 0;   // over elements where both are finite or both the same inf
  double max_rel_error = 0;   // max_abs_error / max|reference|
  double reference_max = 0;   // max|reference| over finite elements
  int64_t worst_index = -1;   // first element with the largest excess over tolerance
  bool passed() const { return mismatches == 0; }
  std::string summary() const;
};

// Compares n elements of `actual` (dtype a) against `reference` (dtype r). Infinities
// compare equal only to the same infinity (lse = -inf rows); NaN never passes.
Comparison compare_values(const void* actual, DType actual_dtype, const void* reference, DType reference_dtype,
                          int64_t n, const Tolerance& tolerance);

}  // namespace thdcp
