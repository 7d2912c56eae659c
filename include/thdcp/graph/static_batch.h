// The device metadata of one capacity for one CP size (DESIGN.md sections 1 and 7): the
// arrays a captured graph reads, at addresses that never change, refilled for every batch.
//
//   graph::StaticBatch batch(/*cp=*/2, default_capacity(16384, 2));
//   if (batch.fill(lengths, stream) == Fit::kFits) { ... replay a graph that reads batch.layout() ... }
//
// fill() runs on the host, outside any capture: it writes the batch's capacity-form layout
// (placeholders, last padded entry = max_tokens) into pinned staging and enqueues one
// host-to-device copy on the stream, ordered before the work the caller enqueues next.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "thdcp/plan/capacity.h"
#include "thdcp/plan/layout.h"

namespace thdcp::graph {

class StaticBatch {
 public:
  // Allocates the device arrays and their pinned staging on the current device (zeroed:
  // a valid empty batch, one placeholder absorbing every row). `layout`: the CP layout the
  // batches are split by (the capacity form of thdcp/plan/capacity.h). Not capture-safe.
  StaticBatch(int cp, const Capacity& capacity, CpLayout layout = CpLayout::kDualChunk);
  ~StaticBatch();
  StaticBatch(const StaticBatch&) = delete;
  StaticBatch& operator=(const StaticBatch&) = delete;

  // Whether a batch of these document lengths fits (thdcp/plan/capacity.h; zero-length
  // documents take no row and are dropped).
  Fit check(const std::vector<int64_t>& lengths) const;

  // If the batch fits: waits until the previous fill's copy has left the staging, writes
  // cu_seqlens, cu_seqlens_padded and the per-sequence start offsets (one per document of
  // `lengths`, or none: all zero; entries of dropped zero-length documents are dropped
  // with them) and enqueues their copy to the device on `stream`. Returns kFits. Otherwise
  // writes and enqueues nothing and returns why. Throws thdcp::Error on bad arguments
  // (negative lengths, start_offsets of the wrong size or negative) before writing anything.
  Fit fill(const std::vector<int64_t>& lengths, cudaStream_t stream, const std::vector<int32_t>& start_offsets = {});

  // Device pointers, fixed for the life of the object.
  DeviceLayout layout() const;
  const int32_t* start_offsets() const;  // capacity.max_seqs entries (placeholders 0)

  int cp() const { return cp_; }
  CpLayout cp_layout() const { return layout_; }
  const Capacity& capacity() const { return capacity_; }
  const BatchLayout& host_layout() const { return host_; }  // of the last successful fill
  size_t device_bytes() const { return bytes_; }
  int device() const { return device_; }

 private:
  int cp_;
  Capacity capacity_;
  CpLayout layout_;
  int device_ = 0;
  size_t bytes_ = 0;
  void* device_block_ = nullptr;  // cu_seqlens | cu_seqlens_padded | start offsets
  void* pinned_block_ = nullptr;
  cudaEvent_t copied_ = nullptr;  // the last fill's copy
  BatchLayout host_;
};

}  // namespace thdcp::graph
