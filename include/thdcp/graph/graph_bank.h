// GraphBank (DESIGN.md section 7): one CUDA graph per (CP size, capacity), captured from the
// caller's work after a warm-up and replayed for every later batch that fits, whatever its
// packing; a batch that fits no capacity by document count runs eagerly and is counted.
//
// A bank belongs to one rank of one CP group (its DeviceCommunicator): every call is
// collective over the group, and every rank passes the same batches in the same order (as
// with NCCL). The work is a callable that enqueues one step on a stream, reading the batch's
// layout from the StaticBatch it is given (and, for RoPE, its start offsets):
//
//   graph::GraphBank bank(comm);
//   bank.add_capacity(default_capacity(16384, comm.size()));
//   for (batch : batches) {
//     ... copy this rank's Q/K/V into the static tensors ...
//     bank.run(batch.lengths, [&](const graph::StaticBatch& b, cudaStream_t s) {
//       plans.at(b.capacity()).forward(b.layout(), tensors, s); ...
//     }, stream);
//   }
//
// Static buffers belong to the bank (buffer()), shared by every layer that asks for the
// same name under the same capacity, so graphs can be captured in any order and nothing is
// allocated inside one. Communicators must have been warmed up (warm_up()) before the first
// capture.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "thdcp/comm_device/device_communicator.h"
#include "thdcp/graph/static_batch.h"
#include "thdcp/plan/capacity.h"

namespace thdcp::graph {

struct BankOptions {
  int warmup_runs = 1;  // eager runs of a capacity before it is captured (>= 1: lazy loading,
                        // kernel attributes and plan making happen outside the capture)
  // Global proves the work safe against every thread's unsafe calls; where several groups of
  // one process capture at once (CpGroups over ranks sharing a GPU) use ThreadLocal, so one
  // group's capture does not forbid another group's eager work.
  cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeGlobal;
  // The CP layout every batch of the bank is split by: its capacities, static layouts and
  // fits follow it (thdcp/plan/capacity.h).
  CpLayout cp_layout = CpLayout::kDualChunk;
};

struct KeyCounters {
  int64_t warmups = 0;    // eager runs before the capture
  int64_t captures = 0;   // 1 once captured (the capturing run also executes the step)
  int64_t replays = 0;    // later runs of the graph
  int64_t fallbacks = 0;  // batches that fit this capacity's tokens but not its documents,
                          // run eagerly on the cp's zero-fallback capacity
};

struct KeyReport {
  int cp = 0;
  Capacity capacity;
  KeyCounters counters;
  size_t static_bytes = 0;  // the StaticBatch and the named buffers of this capacity
  size_t graph_bytes = 0;   // device memory instantiating and uploading the graph took
                            // (cudaMemGetInfo before and after; 0 on ranks that hold no graph)
};

using Work = std::function<void(const StaticBatch& batch, cudaStream_t stream)>;

class GraphBank {
 public:
  explicit GraphBank(DeviceCommunicator& comm, const BankOptions& options = {});
  // Frees the graphs and the static buffers: only once the streams that ran them are idle
  // (synchronise them first), as for any device memory.
  ~GraphBank();
  GraphBank(const GraphBank&) = delete;
  GraphBank& operator=(const GraphBank&) = delete;

  int cp() const { return comm_.size(); }
  CpLayout cp_layout() const { return options_.cp_layout; }
  DeviceCommunicator& communicator() const { return comm_; }

  // A capacity (bucket) to capture for: max_tokens a positive multiple of 2*cp (of cp under
  // the contiguous layout), max_seqs >= 1 (default_capacity(max_tokens, cp, layout) never
  // falls back). Allocates its StaticBatch. Not capture-safe.
  void add_capacity(const Capacity& capacity);
  const std::vector<Capacity>& capacities() const { return capacities_; }
  // Every capacity a batch may run at: each bucket and its zero-fallback capacity, each once,
  // in add order (what plans per capacity must be ready for, e.g. their workspaces reserved).
  std::vector<Capacity> run_capacities() const;

  // Device memory of `capacity` named `name`: allocated (zeroed, and the zeroing waited for,
  // so that any stream may fill it next) on the first request and the same pointer for every
  // later one, which may not ask for more bytes. Works for the fallback capacity of a bucket
  // too. Not capture-safe.
  void* buffer(const Capacity& capacity, const std::string& name, size_t bytes);

  enum class How { kWarmUp, kCaptured, kReplayed, kFallback };
  struct Outcome {
    How how = How::kWarmUp;
    Capacity capacity;  // what the step ran at (the fallback capacity for kFallback)
    Capacity bucket;    // the bucket the batch was counted against
  };

  // One batch. The smallest capacity it fits takes it: its StaticBatch is filled (one copy
  // on `stream`), then `work` runs eagerly (warm-up), is captured and launched (the first
  // run after the warm-up) or is replayed. A batch whose padded rows fit a capacity but
  // whose documents do not runs `work` eagerly on that bucket's fallback StaticBatch
  // (capacity default_capacity(max_tokens, cp), made on first use) and is counted as a
  // fallback of that bucket. A batch that fits no capacity's tokens throws thdcp::Error
  // naming its rows and the largest capacity, before anything is enqueued.
  // A failed capture throws thdcp::Error with CUDA's message (the work synchronised with the
  // host, allocated, or read back); the key stays uncaptured. Collective; not capture-safe.
  Outcome run(const std::vector<int64_t>& lengths, const Work& work, cudaStream_t stream,
              const std::vector<int32_t>& start_offsets = {});

  KeyCounters counters(const Capacity& capacity) const;
  std::vector<KeyReport> report() const;  // one entry per capacity, in add order
  size_t device_bytes() const;            // static + graph bytes of every capacity

  static const char* how_name(How how);  // "warm-up", "captured", "replayed", "fallback"

  struct Entry;

 private:
  Entry& entry(const Capacity& capacity);
  const Entry* find(const Capacity& capacity) const;

  DeviceCommunicator& comm_;
  BankOptions options_;
  std::vector<Capacity> capacities_;
  std::vector<std::unique_ptr<Entry>> entries_;  // buckets, then fallback capacities
};

}  // namespace thdcp::graph
