// Ranks sharing one GPU: a DeviceCommunicator whose collectives are device copies and small
// reduction kernels, ordered between the ranks' streams by CUDA events. For tests and
// single-GPU use of CP with cp > 1 (NCCL refuses two ranks on one device).
//
// Each rank is a thread of this process with its own stream. A collective is a host
// rendezvous of the ranks' threads (to learn each other's pointers and events), then, on
// each rank's stream: wait for every rank's input to be ready, read it (all_gather pulls the
// peers' buffers into recv; the reductions sum or max over them in rank order, so results
// are deterministic), and wait for every peer to have finished reading this rank's input
// before the collective counts as complete. Nothing waits for the device and nothing is
// allocated per call, so the steps of all ranks can be captured into one CUDA graph (every
// rank's stream joined to one capture) and replayed.
//
// A rank that fails releases the others: run_shared_gpu() aborts the group when a body
// throws, and a rank that waits longer than Options::timeout_seconds for its peers aborts
// it too. Every rank then throws thdcp::Error naming the cause, instead of hanging.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "thdcp/comm_device/device_communicator.h"

namespace thdcp {

struct SharedGpuOptions {
  int device = 0;                 // the GPU every rank uses
  double timeout_seconds = 300;   // a rank waiting longer than this for its peers aborts the group
  size_t reduce_scratch_bytes = size_t{1} << 16;  // per rank: the largest all_reduce_max (16K floats)
};

class SharedGpuGroup {
 public:
  // Creates the per-rank events and scratch on options.device (the caller's current device
  // is restored). Not capture-safe.
  SharedGpuGroup(int size, const SharedGpuOptions& options = {});
  ~SharedGpuGroup();
  SharedGpuGroup(const SharedGpuGroup&) = delete;
  SharedGpuGroup& operator=(const SharedGpuGroup&) = delete;

  int size() const;
  // The communicator of `rank`; each is used by one thread at a time.
  std::unique_ptr<DeviceCommunicator> communicator(int rank);
  // Releases every rank waiting in a collective; later collectives throw too.
  void abort(const std::string& reason);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

// Runs body(comm) on `size` threads, one per rank, joined by a SharedGpuGroup (each thread's
// current device is options.device). Returns once every rank has finished. If a rank throws,
// the group is aborted (the others throw from their collectives) and the first exception is
// rethrown here.
void run_shared_gpu(int size, const std::function<void(DeviceCommunicator&)>& body,
                    const SharedGpuOptions& options = {});

// The same over an existing group (e.g. one whose communicators were used before a capture).
void run_shared_gpu(SharedGpuGroup& group, const std::function<void(DeviceCommunicator&)>& body);

}  // namespace thdcp
