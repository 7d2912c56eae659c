// a2a+ag CP on the GPU (Problem::comm == CpComm::kA2aAg): the CUDA counterpart of
// a2a_ag_cpu.h (read it for the ranks, the rows and the order of the arithmetic), used by
// cp::CudaPlan. Rank r is member m = r % a2a_size of group g = r / a2a_size.
//
// Forward: the group's all-to-all (CudaHeadExchange over the a2a_size ranks of the group)
// turns this rank's rows of every head into the group's rows of this member's H/a2a_size
// heads, in the local order of rank g of the layout at ag_size = cp / a2a_size; a CudaPlan of
// AllGather CP over the ag_size ranks of this member index (ranked by g) attends over them
// (its own lanes, table, gathers and reduce-scatters); the reverse all-to-all returns out and
// lse, and an all-gather over the group assembles max_logit in head order. Backward: the same
// exchanges, dq and the reduce-scattered dk, dv in fp32 from the AllGather plan, returned by
// the reverse all-to-all and rounded once; d(sink) of each head comes from its member's
// AllGather plan (summed over the groups in rank order) and is all-gathered over the group.
//
// The two sub-groups are split from the plan's communicator when the plan is made (plan
// time, not capture-safe); a step enqueues only copies, reorders, collectives and kernels on
// the caller's stream (and the AllGather plan's second lane), so it can be captured.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>

#include "head_exchange_cuda.h"
#include "thdcp/comm_device/device_communicator.h"
#include "thdcp/cp/cp.h"
#include "thdcp/cp/cuda.h"
#include "thdcp/plan/layout.h"

namespace thdcp::cp::detail {

class CudaA2aAg {
 public:
  // The exchange buffers of the group, then the AllGather plan's workspace.
  static size_t workspace_size(const Problem& problem, const AttentionOptions& options);

  // Collective over `comm` (every rank, after the plan's agreement on `problem`, validated:
  // a2a_size divides cp, q_heads and kv_heads): splits it into this rank's all-to-all group and
  // AllGather group, warms both up, and makes the AllGather plan across the groups. Not
  // capture-safe.
  CudaA2aAg(DeviceCommunicator& comm, const Problem& problem, const AttentionOptions& options, void* workspace,
            size_t workspace_bytes);
  ~CudaA2aAg();
  CudaA2aAg(const CudaA2aAg&) = delete;
  CudaA2aAg& operator=(const CudaA2aAg&) = delete;

  // One step of this rank on `stream`; the layout and tensors were checked by the caller.
  void forward(const DeviceLayout& layout, const ForwardTensors& t, cudaStream_t stream, const PhaseMark& mark);
  void backward(const DeviceLayout& layout, const BackwardTensors& t, cudaStream_t stream, KvSource kv,
                const PhaseMark& mark);

  KvGather kv_gather() const { return across_->kv_gather(); }  // of the AllGather across the groups

 private:
  void start(const DeviceLayout& layout, cudaStream_t stream, const PhaseMark& mark);

  int group_ = 0;
  std::unique_ptr<DeviceCommunicator> a2a_, ag_;
  std::unique_ptr<DeviceCommunicator::Window> window_;  // a2a_'s over the workspace, if it wants one
  std::unique_ptr<CudaHeadExchange> exchange_;
  std::unique_ptr<CudaPlan> across_;  // AllGather CP of ag_size ranks, heads / a2a_size
};

}  // namespace thdcp::cp::detail
