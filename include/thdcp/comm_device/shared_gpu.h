// Ranks sharing one GPU: a DeviceCommunicator whose collectives are device copies and small
// reduction kernels, ordered between the ranks' streams by CUDA events. For tests and
// single-GPU use of CP with cp > 1 (NCCL refuses two ranks on one device).
//
// The same group spans several GPUs of one process (SharedGpuOptions::devices, rank r on
// devices[r]; kind "peer-copy"): with peer access enabled between every pair, all_gather and
// all_to_all are peer-to-peer copies on the copy engines (no SMs), and the reductions are
// small kernels reading the peers' buffers over the link. One graph then spans every GPU.
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
#include <vector>

#include "thdcp/comm_device/device_communicator.h"

namespace thdcp {

struct SharedGpuOptions {
  int device = 0;                 // the GPU every rank uses (when `devices` is empty)
  std::vector<int> devices;       // or: rank r's GPU, one entry per rank (distinct GPUs need peer access)
  double timeout_seconds = 300;   // a rank waiting longer than this for its peers aborts the group
  size_t reduce_scratch_bytes = size_t{1} << 16;  // per rank: the largest all_reduce_max (16K floats)
};

class SharedGpuGroup {
 public:
  // Creates the per-rank events and scratch on each rank's device, and enables peer access
  // between the devices of a group that spans several (the caller's current device is
  // restored). Throws thdcp::Error naming a pair of GPUs that cannot reach each other's memory.
  // Not capture-safe.
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
// current device is its rank's). Returns once every rank has finished. If a rank throws,
// the group is aborted (the others throw from their collectives) and the first exception is
// rethrown here.
void run_shared_gpu(int size, const std::function<void(DeviceCommunicator&)>& body,
                    const SharedGpuOptions& options = {});

// The same over an existing group (e.g. one whose communicators were used before a capture).
void run_shared_gpu(SharedGpuGroup& group, const std::function<void(DeviceCommunicator&)>& body);

}  // namespace thdcp
