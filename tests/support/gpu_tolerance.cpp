#include "support/gpu_tolerance.h"

namespace thdcp::test {

void expect_gpu_close(const Outputs& got, const Outputs& reference, DType dtype, int reduced_cp) {
  const Tolerance kv = reduced_cp > 0 ? gpu_reduced_grad_tolerance(dtype, reduced_cp) : gpu_grad_tolerance(dtype);
  EXPECT_TRUE(matches("out", got.out, reference.out, gpu_out_tolerance(dtype)));
  EXPECT_TRUE(matches("dq", got.dq, reference.dq, gpu_grad_tolerance(dtype)));
  EXPECT_TRUE(matches("dk", got.dk, reference.dk, kv));
  EXPECT_TRUE(matches("dv", got.dv, reference.dv, kv));
  EXPECT_TRUE(matches("lse", got.lse, reference.lse, kGpuFp32ResultTolerance));
  EXPECT_TRUE(matches("max_logit", got.max_logit, reference.max_logit, kGpuFp32ResultTolerance));
}

::testing::AssertionResult gpu_dsinks_match(const std::vector<float>& dsinks,
                                            const std::vector<float>& reference_dsinks, const Outputs& reference,
                                            const Batch& b, const std::vector<float>& sinks) {
  return matches("dsinks", dsinks, reference_dsinks,
                 sink_gradient_tolerance(reference.out, b.dout, reference.lse, sinks, reference_dsinks));
}

}  // namespace thdcp::test
