// AllGather context parallelism on the GPU (DESIGN.md section 5): the CUDA counterpart of
// thdcp::cp::forward/backward. Plan, then run: the workspace size depends only on the
// capacity and the shapes; the run functions enqueue on `stream` (the table build, the
// reorders, the attention kernels) and call the communicator's collectives on device
// buffers.
//
// The communicator must move device memory: thdcp::cuda::HostStagedCommunicator (ranks as
// threads on one GPU, for tests) or a stream-ordered NCCL communicator. With a stream-ordered
// communicator nothing here syncs or allocates, so a whole step can be captured.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "thdcp/comm/communicator.h"
#include "thdcp/cuda/attention.h"
#include "thdcp/plan/mask.h"
#include "thdcp/core/tensor.h"

namespace thdcp::cuda {

// The global layout of a batch in device memory, in its capacity form (DESIGN.md section 1):
// max_seqs + 1 entries, every padded length a multiple of 2*cp, last entry total_rows. The
// same on every rank.
struct DeviceLayout {
  const int32_t* cu_seqlens = nullptr;
  const int32_t* cu_seqlens_padded = nullptr;
  int max_seqs = 0;
  int64_t total_rows = 0;  // max_tokens: the rows of the global tensors (cp * local rows)
};

size_t cp_forward_workspace_size(const DeviceLayout& layout, int cp, int64_t q_heads, int64_t kv_heads,
                                 int64_t head_dim, DType dtype);
// The backward's workspace depends on options.deterministic (pass the options cp_backward gets).
size_t cp_backward_workspace_size(const DeviceLayout& layout, int cp, int64_t q_heads, int64_t kv_heads,
                                  int64_t head_dim, DType dtype, const Options& options = {});

// Forward on this rank (cp = comm.size()). q, out [T/cp, Hq, D]; k, v [T/cp, Hkv, D] in the
// rank's dual-chunk order; lse Hq * T/cp floats; max_logit Hq floats (max-reduced over the
// group) or nullptr. All device pointers.
void cp_forward(Communicator& comm, const DeviceLayout& layout, const Mask& mask, ConstThdTensor q, ConstThdTensor k,
                ConstThdTensor v, ThdTensor out, float* lse, float* max_logit, void* workspace, size_t workspace_bytes,
                cudaStream_t stream, const Options& options = {});

// Backward on this rank: K/V gathered again; dK/dV accumulated in fp32 for every gathered
// row over both segments of the rank, reordered back to rank order, reduce-scattered in fp32
// and rounded once to dk/dv's dtype (which may be fp32).
void cp_backward(Communicator& comm, const DeviceLayout& layout, const Mask& mask, ConstThdTensor q,
                 ConstThdTensor k, ConstThdTensor v, ConstThdTensor out, ConstThdTensor dout, const float* lse,
                 ThdTensor dq, ThdTensor dk, ThdTensor dv, void* workspace, size_t workspace_bytes,
                 cudaStream_t stream, const Options& options = {});

}  // namespace thdcp::cuda
