// AllGather CP on the GPU: the CUDA step set of the algorithm in thdcp/cp/cp.h, over a
// DeviceCommunicator (NCCL, or ranks sharing one GPU). A host Communicator does not convert
// to one, so passing it here does not compile. Problem::layout may be dual_chunk (the
// gathered K/V are reordered to sequence order, and dK/dV accumulated at their rank-order
// rows) or contiguous (the gathered K/V are in sequence order already: no reorder, no row
// map, and no sequence-order copy in the workspace). Problem::comm may be all_gather,
// all_to_all (Ulysses, either layout: src/cp/alltoall_cuda.h; q_heads and kv_heads multiples
// of cp, everything on `stream`, no second lane) or a2a+ag (src/cp/a2a_ag_cuda.h: an
// all-to-all in each group, then a CudaPlan of all_gather across the groups, with its own
// second lane; the plan splits its communicator into both groups when it is made).
// Problem::kv_gather: whole gathers every rank's K/V; halo (contiguous layout, a window on
// both sides, each at most T/cp) gathers each rank's rows with the window's edges from its
// neighbours; auto takes the halo where it fits and moves fewer rows (left + right < T/cp),
// else the whole gather (kv_gather() says which). The dual-chunk layout gathers whole: there a
// rank's halo is a window's rows before each of its two chunks in every document, a size the
// batch decides, which a step that may be captured cannot size; the CPU backend runs it.
//
// Plan, then run. The plan validates the problem for the CUDA kernels (dtype, head dim,
// kernel family of the current device), checks it across ranks once (a small exchange
// through the communicator, waited for on the host: plan time only), checks the workspace,
// and carves it. forward()/backward() check the tensors against the plan with host
// arithmetic only and enqueue on `stream`: the table build, the collectives, the reorders,
// the attention kernels and the casts. No allocation, no host synchronisation, no pointer
// query and no read-back, so a whole step of every rank can be captured in a CUDA graph.
//
// Overlap. The plan owns a second stream of the highest priority for the collectives (and
// the reorders and casts around them). A step forks it from `stream` (an event) and joins it
// back before returning: work the caller enqueues on `stream` after forward()/backward()
// follows all of the step, on both streams, and a capture of `stream` takes both. The
// backward reduce-scatters dK/dV while its dQ pass runs (where dQ comes from the dK/dV pass,
// Hopper at head dim 128 with no left window, only dQ's store runs beside it, unless the
// options ask for a dQ pass of its own). Because of that second stream, one plan's steps
// must be enqueued one after another (they share the workspace).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "thdcp/comm_device/device_communicator.h"
#include "thdcp/cp/cp.h"
#include "thdcp/cuda/attention.h"

namespace thdcp::cp {

// What a plan's workspace must hold; forward and backward of one plan share it (run them in
// order on one stream).
size_t cuda_workspace_size(const Problem& problem, const AttentionOptions& options = {});

// `bytes` of device memory on the current device for a plan's workspace over `comm`: from
// cudaMalloc, or from nccl::window_memory where the communicator wants windows (a copy-engine
// NCCL communicator, whose plans register their workspace as one). Freed when the last copy
// of the pointer goes: keep it longer than the plan. Plan time (it allocates).
std::shared_ptr<void> cuda_workspace_memory(const DeviceCommunicator& comm, size_t bytes);

// Where the backward takes K/V in sequence order from.
enum class KvSource {
  kGather,       // all-gather and reorder them again (the default; needs nothing kept)
  kFromForward,  // the ones the plan's last forward() left in its workspace: skips a gather
                 // and a reorder. Only when that forward ran on the same k, v and layout, on
                 // the same stream, and nothing else used the plan (or its workspace) since.
                 // all_to_all and a2a+ag keep the forward's head-sharded q, k, v, out and lse
                 // too (the backward exchanges dout alone): the same q, out and lse as well
  kAuto,         // kFromForward when it is safe, else kGather: when the last forward that
                 // wrote this plan's workspace (any plan over the same memory, e.g. a
                 // graph::WorkspaceArena, counts) was this plan's, on the same q, k, v, out,
                 // lse (pointers and strides), layout pointers and stream, and no backward ran
                 // since. The plan keeps that record on the host (capture-safe: a capture of
                 // forward then backward takes the forward's K/V in every replay). Forward and
                 // backward back to back (one layer, or activation checkpointing's recompute)
                 // skip the backward's gather; layers whose forwards ran in between gather again.
};

// One phase on one of a plan's two streams, in the steps run with its timeline on.
struct TimelineSpan {
  Phase phase = Phase::kTable;
  bool collectives = false;         // on the plan's collectives stream; else on the step's stream
  double start_ms = 0, end_ms = 0;  // from the timeline's first mark
};

class CudaPlan {
 public:
  // Collective over `comm` (every rank, on its device comm.device(), which must be current).
  // Throws thdcp::Error on every rank when any rank's problem is invalid or differs.
  // `workspace`: cuda_workspace_size(problem, options) bytes of device memory of comm.device().
  CudaPlan(DeviceCommunicator& comm, const Problem& problem, const AttentionOptions& options, void* workspace,
           size_t workspace_bytes);
  ~CudaPlan();
  CudaPlan(const CudaPlan&) = delete;
  CudaPlan& operator=(const CudaPlan&) = delete;

  // Enqueue one step of this rank on `stream`. Tensors: as thdcp/cp/cp.h (device memory of
  // comm.device()). Every local tensor may be a strided view: k and v of any strides
  // (packed QKV, head-major [H, T/cp, D] memory, padded) are packed into dense rows in the
  // workspace before the gather (one 2-D copy where a row's heads are adjacent, else a pack
  // kernel); dk and dv of any strides are written by the final cast; q, out, dout and dq go
  // to the attention kernels as they are, so they follow thdcp/cuda/attention.h (strides
  // and data 16-byte aligned).
  void forward(const DeviceLayout& layout, const ForwardTensors& tensors, cudaStream_t stream);
  void backward(const DeviceLayout& layout, const BackwardTensors& tensors, cudaStream_t stream,
                KvSource kv = KvSource::kGather);

  // Plan-time check of the buffers the plan will run on (a graph's static buffers, say):
  // what forward()/backward() check, plus that every pointer is device memory of
  // comm.device() (pointer queries: not for the run path). Collective: an error on one rank
  // is raised on every rank. Either tensor set may be null.
  void check_tensors(const DeviceLayout& layout, const ForwardTensors* forward, const BackwardTensors* backward) const;

  // Optional per-phase timing with CUDA events (eager runs only, e.g. benchmarks): creates
  // the events (plan time); every later step records them on its stream, and timings() —
  // after the stream is synchronised — adds each phase's milliseconds of the last step.
  void enable_phase_timing();
  void add_phase_timings(Timings& timings) const;

  // Optional timeline of the steps as they run, overlapped (eager runs only, e.g. benchmarks;
  // phase timing, once enabled, makes them run in program order): enable_timeline() makes
  // the events (plan time); every later forward and backward records, on the stream each
  // phase runs on, where the phase starts and where that stream leaves it (before it waits
  // for the other). timeline(), after the stream is synchronised, gives the spans recorded
  // since clear_timeline() (or enable_timeline()), sorted by start, in ms from the first
  // mark: what ran beside what, and what waited. AllGather steps only (all_to_all and a2a+ag
  // record nothing); a forward and a backward need about 30 marks of the 96 a timeline
  // holds. disable_timeline() stops the recording and frees the events.
  void enable_timeline();
  void clear_timeline();
  void disable_timeline();
  std::vector<TimelineSpan> timeline() const;

  const Problem& problem() const { return problem_; }
  // The K/V gather its steps run, kWhole or kHalo: Problem::kv_gather with auto resolved (the
  // halo under the contiguous layout where a window on both sides moves fewer rows than the
  // whole gather: left + right < T/cp); a2a+ag: that of its AllGather across the groups;
  // all_to_all gathers no K/V rows (kWhole).
  KvGather kv_gather() const;
  DeviceCommunicator& communicator() const { return comm_; }

  struct Workspace;
  struct Events;
  struct Lanes;
  struct Timeline;

 private:
  DeviceCommunicator& comm_;
  Problem problem_;
  AttentionOptions options_;
  std::unique_ptr<Workspace> workspace_;
  std::unique_ptr<Events> events_;
  std::unique_ptr<Lanes> lanes_;
  std::unique_ptr<Timeline> timeline_;
};

}  // namespace thdcp::cp
