#include "thdcp/graph/static_batch.h"

#include <cstring>

#include "thdcp/core/error.h"
#include "thdcp/core/cuda_check.h"

namespace thdcp::graph {

namespace {

size_t entries(const Capacity& c) { return 2 * static_cast<size_t>(c.max_seqs + 1) + static_cast<size_t>(c.max_seqs); }

}  // namespace

StaticBatch::StaticBatch(int cp, const Capacity& capacity, CpLayout layout)
    : cp_(cp), capacity_(capacity), layout_(layout) {
  // Validates cp, the layout and the capacity (max_tokens a positive multiple of 2*cp, or of
  // cp under the contiguous layout; max_seqs >= 1).
  check_fit({}, cp, capacity, layout);
  host_ = capacity_layout({}, cp, capacity, layout);
  bytes_ = entries(capacity) * sizeof(int32_t);
  THDCP_CHECK_CUDA(cudaGetDevice(&device_));
  THDCP_CHECK_CUDA(cudaMalloc(&device_block_, bytes_));
  THDCP_CHECK_CUDA(cudaMallocHost(&pinned_block_, bytes_));
  THDCP_CHECK_CUDA(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
  int32_t* staging = static_cast<int32_t*>(pinned_block_);
  const size_t n = static_cast<size_t>(capacity.max_seqs + 1);
  std::memcpy(staging, host_.cu_seqlens.data(), n * sizeof(int32_t));
  std::memcpy(staging + n, host_.cu_seqlens_padded.data(), n * sizeof(int32_t));
  std::memset(staging + 2 * n, 0, static_cast<size_t>(capacity.max_seqs) * sizeof(int32_t));
  THDCP_CHECK_CUDA(cudaMemcpy(device_block_, pinned_block_, bytes_, cudaMemcpyHostToDevice));
}

StaticBatch::~StaticBatch() {
  if (copied_) {
    cudaEventSynchronize(copied_);
    cudaEventDestroy(copied_);
  }
  if (pinned_block_) cudaFreeHost(pinned_block_);
  if (device_block_) cudaFree(device_block_);
}

Fit StaticBatch::check(const std::vector<int64_t>& lengths) const {
  return check_fit(lengths, cp_, capacity_, layout_);
}

Fit StaticBatch::fill(const std::vector<int64_t>& lengths, cudaStream_t stream,
                      const std::vector<int32_t>& start_offsets) {
  THDCP_CHECK(start_offsets.empty() || start_offsets.size() == lengths.size(),
              "start_offsets has " << start_offsets.size() << " entries but the batch has " << lengths.size()
                                   << " documents: pass one offset per document, or none");
  for (size_t b = 0; b < start_offsets.size(); ++b) {
    THDCP_CHECK(start_offsets[b] >= 0, "start_offsets[" << b << "]=" << start_offsets[b] << " must be >= 0");
  }
  const Fit fit = check(lengths);
  if (fit != Fit::kFits) return fit;
  BatchLayout layout = capacity_layout(lengths, cp_, capacity_, layout_);
  // The previous copy must have read the staging before it is rewritten.
  THDCP_CHECK_CUDA(cudaEventSynchronize(copied_));
  int32_t* staging = static_cast<int32_t*>(pinned_block_);
  const size_t n = static_cast<size_t>(capacity_.max_seqs + 1);
  std::memcpy(staging, layout.cu_seqlens.data(), n * sizeof(int32_t));
  std::memcpy(staging + n, layout.cu_seqlens_padded.data(), n * sizeof(int32_t));
  int32_t* offsets = staging + 2 * n;
  std::memset(offsets, 0, static_cast<size_t>(capacity_.max_seqs) * sizeof(int32_t));
  size_t kept = 0;
  for (size_t b = 0; b < start_offsets.size(); ++b) {
    if (lengths[b] > 0) offsets[kept++] = start_offsets[b];
  }
  THDCP_CHECK_CUDA(cudaMemcpyAsync(device_block_, pinned_block_, bytes_, cudaMemcpyHostToDevice, stream));
  THDCP_CHECK_CUDA(cudaEventRecord(copied_, stream));
  host_ = std::move(layout);
  return Fit::kFits;
}

DeviceLayout StaticBatch::layout() const {
  const int32_t* base = static_cast<const int32_t*>(device_block_);
  const size_t n = static_cast<size_t>(capacity_.max_seqs + 1);
  return DeviceLayout{base, base + n, capacity_};
}

const int32_t* StaticBatch::start_offsets() const {
  return static_cast<const int32_t*>(device_block_) + 2 * static_cast<size_t>(capacity_.max_seqs + 1);
}

}  // namespace thdcp::graph
