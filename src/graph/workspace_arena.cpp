#include "thdcp/graph/workspace_arena.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "thdcp/core/cuda_check.h"
#include "thdcp/core/error.h"

namespace thdcp::graph {

WorkspaceArena::~WorkspaceArena() {
  if (data_) cudaFree(data_);
}

void WorkspaceArena::reserve(size_t bytes) {
  THDCP_CHECK(data_ == nullptr || bytes <= largest_,
              "WorkspaceArena: a user reserves " << bytes << " bytes after the arena was allocated with " << largest_
                                                 << ": reserve every user's workspace before the first take()");
  largest_ = std::max(largest_, bytes);
  total_ += bytes;
  ++users_;
}

void* WorkspaceArena::take(size_t bytes) {
  THDCP_CHECK(bytes <= largest_, "WorkspaceArena: take(" << bytes << ") but the largest reservation is " << largest_
                                                         << " bytes: reserve(" << bytes << ") first");
  if (data_ == nullptr) THDCP_CHECK_CUDA(cudaMalloc(&data_, std::max<size_t>(largest_, 1)));
  return data_;
}

}  // namespace thdcp::graph
