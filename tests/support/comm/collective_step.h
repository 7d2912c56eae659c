// Value checks of a DeviceCommunicator, shared by the NCCL tests (one thread per GPU, or one
// MPI process per GPU). Every rank fills its inputs from (rank, index) by a rule, runs the
// collectives, and compares what it downloads with what the rule predicts, computed on the
// host. Inputs are small integers, so float sums are exact and the checks are too.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "thdcp/comm_device/device_communicator.h"
#include "thdcp/core/cuda_check.h"
#include "support/cuda/cuda_test.h"
#include "thdcp/testing/device_buffer.h"

namespace thdcp::test {

// Generous: a healthy collective takes milliseconds, a broken one is meant to throw.
constexpr double kTestTimeoutSeconds = 60;

// Sizes that take NCCL's different protocols: one element, an odd few KiB, and MiBs.
struct CollectiveSizes {
  size_t gather_bytes;  // per rank
  size_t count;         // floats per rank block of reduce_scatter_sum and of all_reduce_max
};
std::vector<CollectiveSizes> collective_sizes();

// A captured graph; destroyed before the communicator it captured (NCCL waits for it).
struct CapturedGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CapturedGraph() = default;
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  ~CapturedGraph() {
    if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
  }
};

// One call of each collective on one rank: its inputs, outputs and expected outputs.
class CollectiveStep {
 public:
  CollectiveStep(int rank, int size, CollectiveSizes sizes);

  // Uploads the inputs and fills every output with 0xff bytes (NaN as floats), on `stream`.
  void prepare(cudaStream_t stream);

  // The step itself: stream-ordered and capturable. all_reduce_max works in place, so the
  // step starts by copying its input in; a replayed graph then starts from the same values.
  void enqueue(DeviceCommunicator& comm, cudaStream_t stream);

  // Downloads the outputs (after the step is done) and compares them with the rule.
  ::testing::AssertionResult check(cudaStream_t stream) const;

 private:
  int rank_;
  int size_;
  CollectiveSizes sizes_;
  cuda::DeviceBuffer gather_send_, gather_recv_, scatter_send_, scatter_recv_, max_pristine_, max_data_;
  cuda::DeviceBuffer exchange_send_, exchange_recv_;  // all_to_all: size blocks of gather_bytes each
};

// Every collective of every size, eagerly; values compared on the host.
void expect_exact_collectives(DeviceCommunicator& comm, cudaStream_t stream);

// The 16-bit reduce_scatter_sum (bf16 and fp16) on inputs whose sums need rounding: with
// `rank_order` (ranks of one process) every element the bits of the fp32 sum in rank order
// rounded once; otherwise (NCCL, its own order and roundings) within size() u of the exact sum.
void expect_reduce_scatter16(DeviceCommunicator& comm, cudaStream_t stream, bool rank_order);

// The step captured once (after warm_up) and replayed twice: each replay must give the
// values an eager run gives. `mode`: global for one capturing thread per process,
// thread-local when several ranks' threads capture at once.
void expect_captured_step_replays(DeviceCommunicator& comm, cudaStream_t stream, cudaStreamCaptureMode mode);

}  // namespace thdcp::test
