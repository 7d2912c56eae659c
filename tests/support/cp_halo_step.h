// Support for the halo-gather tests (kv_gather, issue 31): one rank's CP step through a
// CpuPlan with the bytes its communicator moved, for comparisons bit for bit between K/V
// gathers. Used by the in-process and the MPI tests.
#pragma once

#include <cstdint>
#include <vector>

#include "support/outputs.h"
#include "support/random_batch.h"
#include "thdcp/comm/communicator.h"
#include "thdcp/cp/cp.h"

namespace thdcp::test {

// A communicator that counts the bytes this rank receives from the others in the collectives
// that move K/V and dK/dV (all_gather, all_to_all_v, reduce_scatter_sum), then forwards.
class CountingCommunicator final : public Communicator {
 public:
  explicit CountingCommunicator(Communicator& inner) : inner_(inner) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const char* kind() const override { return inner_.kind(); }

  void all_gather(const void* send, void* recv, size_t bytes) override;
  void reduce_scatter_sum(const float* send, float* recv, size_t count) override;
  void all_reduce_max(float* data, size_t count) override { inner_.all_reduce_max(data, count); }
  void all_to_all(const void* send, void* recv, size_t bytes) override { inner_.all_to_all(send, recv, bytes); }
  void all_to_all_v(const void* send, const size_t* send_bytes, void* recv, const size_t* recv_bytes) override;
  // The sub-group's collectives are not counted.
  std::unique_ptr<Communicator> split(int color, int key) override { return inner_.split(color, key); }

  int64_t received = 0;

 private:
  Communicator& inner_;
};

// One rank's forward and backward under a CpuPlan of `problem`: its outputs (poisoned first),
// d(sink) (with `sinks`, else empty), the K/V bytes it received in each pass (dsinks' own
// all-gather left out) and what the plan said it would move.
struct RankStep {
  Outputs outputs;
  std::vector<float> dsinks;
  int64_t forward_bytes = 0, backward_bytes = 0;
  cp::KvTraffic traffic;
};

RankStep run_counted_step(Communicator& comm, const Batch& b, const cp::Problem& problem,
                          const std::vector<float>& sinks = {});

}  // namespace thdcp::test
