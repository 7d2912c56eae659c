// The device tensors of one attention step (forward and backward), as the GPU tests hold
// them: inputs q, k, v, dout; outputs out, dq, dk, dv, lse [Hq, q_rows], max_logit [Hq].
// q, k, dq, dk have head dim D_qk (HeadShape::head_dim); v, dout, out, dv D_v
// (HeadShape::value_head_dim()).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "support/cuda/cuda_test.h"
#include "support/outputs.h"
#include "thdcp/plan/attention_shape.h"

namespace thdcp::test {

// The outputs in the order DeviceStep::output_bytes gives them.
inline const char* const kOutputNames[] = {"out", "lse", "max_logit", "dq", "dk", "dv"};

struct DeviceStep {
  DeviceTensor q, k, v, dout, out, dq, dk, dv;
  DeviceBuffer lse, max_logit;

  // q, dout, out, dq: q_rows rows of Hq heads; k, v, dk, dv: k_rows rows of Hkv heads; dq,
  // dk, dv in `grad_dtype`, the others in `dtype`.
  DeviceStep(DType dtype, int64_t q_rows, int64_t k_rows, const HeadShape& heads, DType grad_dtype);

  // Fills q, k, v and dout with N(0, 1) values (fill_normal with seeds seed, seed + 1, ...).
  void fill_inputs(uint64_t seed);

  // Copies host inputs of the same shapes in (synchronous).
  void upload_inputs(const HostTensor& q_in, const HostTensor& k_in, const HostTensor& v_in, const HostTensor& dout_in);

  // The tensors of a call on all rows, or on the first `rows` rows of each (a step of a
  // smaller capacity on buffers sized for the largest).
  ForwardTensors forward_tensors();
  BackwardTensors backward_tensors();
  ForwardTensors forward_tensors(int64_t rows);
  BackwardTensors backward_tensors(int64_t rows);

  // Every output byte 0xff (NaN): on the legacy stream, or ordered on `stream` and complete
  // on return (DeviceBuffer::poison).
  void poison_outputs();
  void poison_outputs(cudaStream_t stream);

  // The outputs' bytes, in the order of kOutputNames (synchronous).
  std::vector<std::vector<unsigned char>> output_bytes() const;

  // The outputs of all rows, or of the first `rows` rows (lse: its first Hq * rows floats,
  // the [Hq, rows] of a call on `rows` rows) (synchronous).
  Outputs download_outputs() const;
  Outputs download_outputs(int64_t rows) const;
};

// Every output byte of `step` is still the poison (0xff): nothing wrote it. Names the first
// output that was written.
::testing::AssertionResult still_poisoned(const DeviceStep& step);

}  // namespace thdcp::test
