// The host communicators of context parallelism (blocking collectives over host memory, for
// the CPU backend and as the bootstrap channel of NCCL), and the in-process implementation;
// MPI's is thdcp/comm/mpi.h. The GPU path takes a DeviceCommunicator instead
// (thdcp/comm_device/device_communicator.h: stream-ordered, device memory).
//
// Semantics (shared by every implementation, like MPI and NCCL collectives):
//  - every rank of the group calls the same collectives in the same order with the same
//    sizes; a collective returns on a rank once that rank's output is complete and its
//    input may be reused (it blocks);
//  - all_gather: recv holds the `bytes` of every rank, rank-major (rank r at r * bytes);
//  - reduce_scatter_sum: send holds size() blocks of `count` floats; rank r receives the
//    element-wise sum over ranks of block r, added in rank order from +0.0f
//    (((0 + x_0) + x_1) + ...) by every implementation, so its result is deterministic and a
//    caller can reproduce its bits;
//  - all_reduce_max: element-wise max over ranks, in place;
//  - all_to_all: send holds size() blocks of `bytes`, block r for rank r; recv receives
//    size() blocks, block r from rank r (send and recv must not overlap);
//  - all_to_all_v: the same with blocks of any size, packed back to back in rank order:
//    send_bytes[r] bytes go to rank r, recv_bytes[r] bytes come from rank r (each array has
//    size() entries; a block may be empty). Every rank's send_bytes[r] must equal rank r's
//    recv_bytes[rank()]: a mismatch throws thdcp::Error (in-process: on every rank, naming
//    both ranks and counts). The halo gathers of AllGather CP use it;
//  - split(color, key): like MPI_Comm_split and DeviceCommunicator::split. Collective over
//    this group; the ranks that pass the same color (>= 0) form a sub-group, ranked by
//    (key, rank in this group); a rank that passes color < 0 takes part and gets nullptr.
//    The sub-communicator is used by its rank's thread only and may outlive this object.
//    In-process: a failure that releases this group (a rank throws under run_in_process,
//    InProcessGroup::abort) releases every group split from it too. The a2a+ag CP mode makes
//    its all-to-all and AllGather groups with it.
// A collective that cannot complete (another rank failed) throws thdcp::Error instead of
// hanging.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace thdcp {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* kind() const = 0;  // "in-process", "mpi", ...

  virtual void all_gather(const void* send, void* recv, size_t bytes) = 0;
  virtual void reduce_scatter_sum(const float* send, float* recv, size_t count) = 0;
  virtual void all_reduce_max(float* data, size_t count) = 0;
  virtual void all_to_all(const void* send, void* recv, size_t bytes) = 0;
  virtual void all_to_all_v(const void* send, const size_t* send_bytes, void* recv, const size_t* recv_bytes) = 0;
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
};

// Runs body(communicator) on `size` threads of this process, one per rank, connected by an
// in-process communicator. Returns once every rank has finished. If a rank throws, the
// others are released from any collective they wait in (they throw too), and the first
// exception is rethrown here.
void run_in_process(int size, const std::function<void(Communicator&)>& body);

// The group of run_in_process without its threads, for callers that start one thread per
// rank themselves (the C ABI). Each communicator keeps the group's state alive and is used
// by its rank's thread only.
class InProcessGroup {
 public:
  explicit InProcessGroup(int size);  // size >= 1

  int size() const;
  // The communicator of `rank` (0 <= rank < size()).
  std::unique_ptr<Communicator> communicator(int rank);
  // Releases every rank waiting in a collective of the group and makes every later
  // collective throw thdcp::Error naming `reason`: what run_in_process does when a rank
  // throws, so that a rank that fails between collectives leaves no peer waiting forever.
  void abort(const std::string& reason);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace thdcp
