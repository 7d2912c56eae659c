// The communicator interface of context parallelism, and its in-process implementation.
//
// Semantics (shared by every implementation, like MPI and NCCL collectives):
//  - every rank of the group calls the same collectives in the same order with the same
//    sizes; a collective returns on a rank once that rank's output is complete and its
//    input may be reused (host implementations block; the NCCL one will be stream-ordered);
//  - all_gather: recv holds the `bytes` of every rank, rank-major (rank r at r * bytes);
//  - reduce_scatter_sum: send holds size() blocks of `count` floats; rank r receives the
//    element-wise sum over ranks of block r. The in-process implementation sums in rank
//    order, so its result is deterministic;
//  - all_reduce_max: element-wise max over ranks, in place.
// A collective that cannot complete (another rank failed) throws thdcp::Error instead of
// hanging.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

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
};

// Runs body(communicator) on `size` threads of this process, one per rank, connected by an
// in-process communicator. Returns once every rank has finished. If a rank throws, the
// others are released from any collective they wait in (they throw too), and the first
// exception is rethrown here.
void run_in_process(int size, const std::function<void(Communicator&)>& body);

}  // namespace thdcp
