// Workspaces: one caller-owned allocation carved into aligned parts. Plans size their
// workspace and cut it with the same code (WorkspaceCarver), so that the size they ask for
// and the parts they use cannot drift apart (CUTLASS's get_workspace_size / initialize).
#pragma once

#include <cstddef>
#include <cstdint>

namespace thdcp {

// Every workspace part starts on a kWorkspaceAlignment-byte boundary (what cudaMalloc
// returns, and enough for every vectorised access of the kernels).
constexpr size_t kWorkspaceAlignment = 256;
constexpr size_t align_workspace(size_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

// Hands out consecutive aligned parts of `base`. With base == nullptr it only counts: take()
// returns null and bytes() is the size the same sequence of take() calls needs.
//
//   WorkspaceCarver sizing;            // size: the same calls, no memory
//   carve(sizing);                     // -> sizing.bytes()
//   WorkspaceCarver carver(workspace);
//   carve(carver);                     // -> the parts
class WorkspaceCarver {
 public:
  explicit WorkspaceCarver(void* base = nullptr) : base_(static_cast<unsigned char*>(base)) {}

  // The next `bytes` bytes (rounded up to the alignment), as T*; null when only counting.
  template <typename T = void>
  T* take(size_t bytes) {
    const size_t offset = used_;
    used_ += align_workspace(bytes);
    return base_ ? reinterpret_cast<T*>(base_ + offset) : nullptr;
  }
  // `count` elements of T.
  template <typename T>
  T* take_array(size_t count) {
    return take<T>(count * sizeof(T));
  }

  size_t bytes() const { return used_; }

 private:
  unsigned char* base_;
  size_t used_ = 0;
};

}  // namespace thdcp
