// All-to-all (Ulysses) CP on the GPU (Problem::comm == CpComm::kAllToAll), for either CP
// layout of the local rows: the CUDA counterpart of alltoall_cpu.h, used by cp::CudaPlan.
//
// Forward on rank r of cp: an all-to-all turns this rank's rows of q, k, v ([T/cp, H, D],
// any views) into every row of its heads [r H/cp, (r+1) H/cp) ([T, H/cp, D], sequence order:
// the all-to-all's rank-major rows are reordered where the layout is dual chunk, and are the
// sequence order already where it is contiguous); the single-device kernels attend over
// whole documents with those heads; a second all-to-all returns out and lse to the rank's
// rows, and an all-gather of each rank's heads gives max_logit (and, in the backward,
// d(sink)). Backward: q, k, v, out, dout and lse go to the heads the same way (dout alone
// where the forward's are kept, KvSource::kFromForward), the kernels give fp32 dQ/dK/dV of
// the rank's heads, rounded once into the dtype of dq, dk, dv, and an all-to-all returns them
// to its rows. No partial sums cross ranks (each head belongs to one rank), so the
// result is deterministic and the same bits as the single-device kernels on those heads.
//
// The exchanges are CudaHeadExchange's (head_exchange_cuda.h) over one group of cp ranks.
// With Problem::head_slices = S > 1 the rank's heads go in S slices: every slice's inputs are
// exchanged in turn on a second stream of the plan (the device's highest priority), each
// slice's attention starts once its own inputs are in, and its results go back once it is
// done, so the exchanges run beside the attention of other slices; each head is computed as
// with one slice, so the bits do not change. Phase marks then time the step's stream only:
// "gather" is empty, "attention" runs from the first slice's inputs to the last attention,
// "reduce" is what the last exchanges leave after it.
// Everything is enqueued on the caller's stream (and the plan's second stream, forked from and
// joined back to it by events): 2-D copies and one reorder kernel around each all-to-all,
// nothing allocated or read back, so a step can be captured.
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

class CudaAllToAll {
 public:
  // What the workspace must hold: the exchange buffers, the head-sharded tensors and the
  // single-device plans' workspaces.
  static size_t workspace_size(const Problem& problem, const AttentionOptions& options);

  // `problem` validated (heads multiples of cp, comm all_to_all) by the caller; makes the
  // single-device plans for cp's share of the heads. Not capture-safe.
  CudaAllToAll(DeviceCommunicator& comm, const Problem& problem, const AttentionOptions& options, void* workspace,
               size_t workspace_bytes);
  ~CudaAllToAll();
  CudaAllToAll(const CudaAllToAll&) = delete;
  CudaAllToAll& operator=(const CudaAllToAll&) = delete;

  // One step of this rank on `stream`; the layout and tensors were checked by the caller.
  // kv == kFromForward: the backward takes q, k, v, out and lse on the heads from the last
  // forward (exchanging only dout), which must have run on the same tensors.
  void forward(const DeviceLayout& layout, const ForwardTensors& t, cudaStream_t stream, const PhaseMark& mark);
  void backward(const DeviceLayout& layout, const BackwardTensors& t, cudaStream_t stream, KvSource kv,
                const PhaseMark& mark);

  struct State;

 private:
  std::unique_ptr<State> s_;
};

}  // namespace thdcp::cp::detail
