#include "thdcp/testing/compare.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "thdcp/core/error.h"

namespace thdcp {

Tolerance derive_tolerance(DType storage, Accumulate accumulate, int roundings) {
  THDCP_CHECK(roundings >= 0, "roundings=" << roundings << " must be >= 0");
  Tolerance t;
  t.rtol = roundings * dtype_unit_roundoff(storage);
  t.atol_scale = 128.0 * (accumulate == Accumulate::kFloat32 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -52));
  if (accumulate == Accumulate::kFloat64) t.atol_scale += 8.0 * std::ldexp(1.0, -24);  // fp32 lse
  return t;
}

Tolerance derive_tensor_core_tolerance(DType storage, int rounded_operands) {
  THDCP_CHECK(rounded_operands >= 0, "rounded_operands=" << rounded_operands << " must be >= 0");
  Tolerance t = derive_tolerance(storage, Accumulate::kFloat32, 2);
  t.atol_scale += 4.0 * rounded_operands * dtype_unit_roundoff(storage);
  return t;
}

Tolerance tensor_core_fp32_tolerance() { return Tolerance{std::ldexp(1.0, -16), std::ldexp(1.0, -16)}; }

Tolerance sink_gradient_tolerance(const HostTensor& out, const HostTensor& dout, const std::vector<float>& lse,
                                  const std::vector<float>& sinks, const std::vector<float>& reference_dsinks) {
  const int64_t rows = out.tokens(), heads = out.heads(), d = out.head_dim();
  THDCP_CHECK(dout.tokens() == rows && dout.heads() == heads && dout.head_dim() == d &&
                  lse.size() == static_cast<size_t>(rows * heads) && sinks.size() == static_cast<size_t>(heads) &&
                  reference_dsinks.size() == sinks.size(),
              "sink_gradient_tolerance: out, dout, lse, sinks and reference_dsinks disagree in shape");
  const double u = dtype_unit_roundoff(dout.dtype());
  double bound = 0, reference_max = 0;
  for (int64_t h = 0; h < heads; ++h) {
    double head_bound = 0;
    for (int64_t row = 0; row < rows; ++row) {
      const float row_lse = lse[static_cast<size_t>(h * rows + row)];
      if (row_lse == -INFINITY) continue;  // padding: no sink
      double out_norm = 0, dout_norm = 0;
      for (int64_t i = 0; i < d; ++i) {
        const double o = out.get((row * heads + h) * d + i), g = dout.get((row * heads + h) * d + i);
        out_norm += o * o;
        dout_norm += g * g;
      }
      head_bound += std::exp(static_cast<double>(sinks[static_cast<size_t>(h)]) - row_lse) *
                    std::sqrt(out_norm * dout_norm);
    }
    bound = std::max(bound, 16 * u * head_bound);
    reference_max = std::max(reference_max, std::fabs(static_cast<double>(reference_dsinks[static_cast<size_t>(h)])));
  }
  return Tolerance{0.0, reference_max > 0 ? bound / reference_max + std::ldexp(1.0, -20) : 1.0};
}

std::string Comparison::summary() const {
  std::ostringstream out;
  out << "max abs err " << max_abs_error << ", max rel err " << max_rel_error << ", " << mismatches << "/" << count
      << " outside tolerance";
  if (worst_index >= 0) out << " (worst at " << worst_index << ")";
  return out.str();
}

Comparison compare_values(const void* actual, DType actual_dtype, const void* reference, DType reference_dtype,
                          int64_t n, const Tolerance& tolerance) {
  Comparison c;
  c.count = n;
  for (int64_t i = 0; i < n; ++i) {
    const double r = load_as_float(reference, reference_dtype, static_cast<size_t>(i));
    if (std::isfinite(r)) c.reference_max = std::max(c.reference_max, std::fabs(r));
  }
  const double atol = tolerance.atol_scale * c.reference_max;
  double worst_excess = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double a = load_as_float(actual, actual_dtype, static_cast<size_t>(i));
    const double r = load_as_float(reference, reference_dtype, static_cast<size_t>(i));
    double excess;
    if (std::isnan(a) || std::isnan(r)) {
      excess = INFINITY;
    } else if (std::isinf(a) || std::isinf(r)) {
      excess = (a == r) ? 0.0 : INFINITY;
    } else {
      const double err = std::fabs(a - r);
      c.max_abs_error = std::max(c.max_abs_error, err);
      excess = err - (tolerance.rtol * std::fabs(r) + atol);
    }
    if (excess > 0) {
      ++c.mismatches;
      if (excess > worst_excess) {
        worst_excess = excess;
        c.worst_index = i;
      }
    }
  }
  c.max_rel_error = c.reference_max > 0 ? c.max_abs_error / c.reference_max : c.max_abs_error;
  return c;
}

}  // namespace thdcp
