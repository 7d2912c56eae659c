// WorkspaceArena: one block of device memory that plans taking turns on one stream use as
// their workspace, so that a rank holds the largest plan's workspace rather than the sum of
// all of them. Dynamic CP is where it pays: a rank has a CP plan per CP size and capacity,
// yet only one of them runs at a time (graph::CpGroups::arena()).
//
// Every user reserves its bytes first (host arithmetic, e.g. cp::cuda_workspace_size); the
// first take() allocates the largest reservation, and every take() returns the same
// pointer. Sharing is safe because no plan keeps anything in its workspace from one step to
// the next (every step rebuilds its tables and zeroes its accumulators) and a forward and
// its backward (KvSource::kFromForward) are one plan's, run back to back. The users must
// run on one stream, or on streams ordered one after another: two plans running at once
// on one arena would overwrite each other.
#pragma once

#include <cstddef>

namespace thdcp::graph {

class WorkspaceArena {
 public:
  WorkspaceArena() = default;
  // Frees the memory: only once the streams that used it are idle, as for any device memory.
  ~WorkspaceArena();
  WorkspaceArena(const WorkspaceArena&) = delete;
  WorkspaceArena& operator=(const WorkspaceArena&) = delete;

  // Records one user's need. Host only. After the first take() a need larger than the
  // allocation throws thdcp::Error (reserve every user before taking).
  void reserve(size_t bytes);
  // The arena, at least `bytes` long (a reserved need): allocated with cudaMalloc on the
  // current device on the first call. Not capture-safe on the first call.
  void* take(size_t bytes);

  size_t bytes() const { return largest_; }           // what is (or will be) allocated
  size_t separate_bytes() const { return total_; }    // a workspace per user: the sum of the needs
  int users() const { return users_; }                // reservations made
  bool allocated() const { return data_ != nullptr; }

 private:
  void* data_ = nullptr;
  size_t largest_ = 0, total_ = 0;
  int users_ = 0;
};

}  // namespace thdcp::graph
