// One attention step on the device, for the CUDA backend of `thdcp run` and for `thdcp bench`:
// its tensors (single-device, or one rank's part of a CP step) and the passes of a CP step.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "step/host_step.h"
#include "thdcp/cp/cuda.h"
#include "thdcp/testing/device_buffer.h"

namespace thdcp {
class WorkspaceCarver;
}

namespace thdcp::tools {

// The device tensors of a step: q, k, v, dout (inputs) and out, lse, max_logit, dq, dk, dv
// (outputs) of `rows` rows, and the batch's cu_seqlens and cu_seqlens_padded, carved in that
// order from one allocation, so that the outputs (and the gradients) are one range each.
class DeviceTensors {
 public:
  // Allocates them and uploads the layout's offsets (complete when it returns).
  DeviceTensors(const StepShape& shape, int64_t rows, const BatchLayout& layout, cudaStream_t stream);
  // The bytes the constructor allocates: what a memory check counts.
  static size_t bytes(const StepShape& shape, int64_t rows, size_t layout_entries);

  ThdTensor q, k, v, dout, out, dq, dk, dv;
  float* lse = nullptr;        // [Hq, rows]
  float* max_logit = nullptr;  // [Hq]

  DeviceLayout layout(const Capacity& capacity) const;
  ForwardTensors forward() const;
  BackwardTensors backward() const;

  // Host tensors of `rows` rows into q, k, v, dout (complete when it returns).
  void upload_inputs(const HostTensor& q_rows, const HostTensor& k_rows, const HostTensor& v_rows,
                     const HostTensor& dout_rows, cudaStream_t stream);
  // Every byte of every output (or of dq, dk, dv) 0xff, NaN: an unwritten element fails.
  void poison_outputs(cudaStream_t stream);
  void poison_gradients(cudaStream_t stream);
  // Attention sinks [Hq] for forward() and backward(), and room for their gradient (dsinks,
  // downloaded with the outputs); without this call, none.
  void upload_sinks(const std::vector<float>& sinks, cudaStream_t stream);
  // Every output, downloaded (synchronises `stream`).
  HostOutputs download_outputs(cudaStream_t stream) const;

 private:
  DeviceTensors() = default;  // bytes() carves one with no memory to count
  void carve(WorkspaceCarver& carver, const StepShape& shape, int64_t rows, size_t layout_entries);

  cuda::DeviceBuffer memory_;
  cuda::DeviceBuffer sinks_, dsinks_;  // empty without sinks
  int32_t* cu_seqlens_ = nullptr;
  int32_t* cu_seqlens_padded_ = nullptr;
};

// What a CP step runs: the forward; the forward and the backward, which gathers K and V
// again; or the backward on the forward's gathered K and V (cp::KvSource::kFromForward).
enum class Pass { kForward = 0, kForwardBackward = 1, kForwardBackwardKeptKv = 2 };

// Enqueues `pass` of this rank on `stream`.
void run_pass(cp::CudaPlan& plan, const DeviceTensors& tensors, cudaStream_t stream, Pass pass);

// One eager step with the plan's phase timing on (CudaPlan::enable_phase_timing): the
// forward, `wait()`, its phases; then, unless the pass is the forward only, the backward,
// `wait()`, its phases (the forward's events are read before the backward records them
// again). Returns the phases of the step, in seconds.
cp::Timings time_phases(cp::CudaPlan& plan, const DeviceTensors& tensors, cudaStream_t stream, Pass pass,
                        const std::function<void()>& wait);

}  // namespace thdcp::tools
