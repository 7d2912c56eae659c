// Device communicators (DESIGN.md section 5): collectives over device buffers, ordered on a
// CUDA stream, the way NCCL's are. The CUDA CP path takes only this type; the host
// communicators of thdcp/comm/communicator.h do not convert to it.
//
// Semantics shared by every implementation:
//  - every rank of the group calls the same collectives in the same order with the same
//    sizes, each on the stream it wants the work ordered on;
//  - a call returns once the work is *enqueued* on `stream`: the output is complete, and the
//    input may be reused, only for work enqueued on `stream` after the call. Nothing waits
//    for the device and nothing is allocated, so the calls can be captured in a CUDA graph
//    (after warm_up());
//  - all_gather: recv holds the `bytes` of every rank, rank-major (rank r at r * bytes);
//  - reduce_scatter_sum: send holds size() blocks of `count` floats; rank r receives the
//    element-wise sum over ranks of block r; its 16-bit form (dtype bf16 or fp16) the same
//    over elements of that dtype, the sum in that dtype (NCCL rounds as its steps go; ranks of
//    one process sum in fp32 in rank order and round once);
//  - all_reduce_max: element-wise max over ranks, in place;
//  - all_to_all: send holds size() blocks of `bytes`, block r for rank r; recv receives
//    rank r's block for this rank at r * bytes (send and recv must not overlap).
// A collective that cannot complete (a peer failed, aborted or disagrees on the sizes)
// throws thdcp::Error on every rank that can still reach the host, naming the rank and the
// cause, instead of hanging.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>

#include "thdcp/core/dtype.h"

namespace thdcp {

class DeviceCommunicator {
 public:
  virtual ~DeviceCommunicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The CUDA device this rank's buffers and streams live on.
  virtual int device() const = 0;
  virtual const char* kind() const = 0;  // "nccl", "shared-gpu", ...

  virtual void all_gather(const void* send, void* recv, size_t bytes, cudaStream_t stream) = 0;
  virtual void reduce_scatter_sum(const float* send, float* recv, size_t count, cudaStream_t stream) = 0;
  virtual void reduce_scatter_sum(const void* send, void* recv, size_t count, DType dtype, cudaStream_t stream) = 0;
  virtual void all_reduce_max(float* data, size_t count, cudaStream_t stream) = 0;
  virtual void all_to_all(const void* send, void* recv, size_t bytes, cudaStream_t stream) = 0;

  // A sub-group of the ranks that pass the same `color` (>= 0), ranked by (key, rank); a
  // rank that passes color < 0 takes part in the split and gets nullptr. Collective over
  // this group; not capture-safe (it may allocate and connect).
  virtual std::unique_ptr<DeviceCommunicator> split(int color, int key) = 0;

  // Runs one of each collective on `stream` and waits for it, so that connections that are
  // made lazily (NCCL) exist before a stream capture begins. Collective; not capture-safe.
  virtual void warm_up(cudaStream_t stream) = 0;

  // Windows (NCCL's symmetric memory): a range of device memory made known to every rank of
  // the group, so that collectives receiving into it may take faster paths (NCCL with
  // nccl::Options::copy_engine: all_gather and all_to_all on the copy engines, no SMs).
  //  - wants_windows(): whether this communicator uses them (plans then register their
  //    workspaces, which must come from the communicator's allocator: nccl::window_memory).
  //  - register_window(data, bytes): collective, at plan time (not capture-safe): every rank
  //    registers the same number of bytes, and collectives use the same offsets into it on
  //    every rank. The window lasts until the returned handle is destroyed, which must happen
  //    before the memory is freed and before the communicator is destroyed. Communicators
  //    without windows return nullptr (their collectives need none).
  class Window {
   public:
    virtual ~Window() = default;
  };
  virtual bool wants_windows() const { return false; }
  virtual std::unique_ptr<Window> register_window(void* data, size_t bytes);

  // Waits on the host until the work enqueued on `stream` so far is done, checking the
  // communicator for asynchronous errors (a dead or aborted peer) while it waits. After
  // `timeout_seconds` (<= 0: no limit) it aborts the communicator and throws thdcp::Error
  // naming this rank. For tools and tests between steps; never on a captured path.
  virtual void synchronize(cudaStream_t stream, double timeout_seconds) = 0;

  // CUDA graphs of a step of this group (DESIGN.md section 7). Collective, not capture-safe
  // themselves (they start, end and launch captures). The default is per rank (NCCL: each
  // process or thread captures its own stream, global mode); ranks sharing one GPU capture
  // every rank's stream into one graph owned by rank 0.
  //  - begin_capture(stream, mode): the work this rank enqueues on `stream` from now on (and
  //    on streams forked from it and joined back) is captured. cudaStreamCaptureModeGlobal
  //    (the default) also forbids every other thread of the process unsafe calls (host
  //    syncs, allocations) meanwhile; where several groups of one process capture at the
  //    same time (dynamic CP with ranks sharing a GPU), use ThreadLocal.
  //  - end_capture(stream): ends it and returns the graph this rank must instantiate and
  //    launch, or nullptr when another rank launches the group's graph. A capture that CUDA
  //    invalidated (a host sync, an allocation or a read-back in the captured work) throws
  //    thdcp::Error naming the rank and CUDA's message, and leaves `stream` usable.
  //  - launch(exec, stream): replays `exec` (what this rank instantiated from end_capture's
  //    graph, or nullptr where that was nullptr) so that it follows the work enqueued on
  //    `stream` before the call and precedes the work enqueued after it.
  //  - abandon_capture(stream): after the captured work threw on this rank, ends whatever
  //    capture this rank started or joined and discards it, so its streams are usable for
  //    the error path. Not collective; never throws.
  virtual void begin_capture(cudaStream_t stream, cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal);
  virtual void abandon_capture(cudaStream_t stream) noexcept;
  virtual cudaGraph_t end_capture(cudaStream_t stream);
  virtual void launch(cudaGraphExec_t exec, cudaStream_t stream);
};

}  // namespace thdcp
