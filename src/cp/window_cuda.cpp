#include "window_cuda.h"

#include <cuda_runtime_api.h>

#include "thdcp/core/error.h"
#include "thdcp/cuda/check.h"

namespace thdcp::cp::detail {

std::unique_ptr<DeviceCommunicator::Window> workspace_window(DeviceCommunicator& comm, void* workspace, size_t bytes) {
  if (!comm.wants_windows()) return nullptr;
  std::unique_ptr<DeviceCommunicator::Window> window = comm.register_window(workspace, bytes);
  // One byte per rank in each of four regions of `size` bytes: the all_gather's send and
  // receive, the all_to_all's. The same offsets on every rank, as a symmetric window needs.
  const size_t region = static_cast<size_t>(comm.size());
  if (bytes < 4 * region) return window;
  auto* base = static_cast<unsigned char*>(workspace);
  cudaStream_t stream = nullptr;
  THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  try {
    comm.all_gather(base, base + region, 1, stream);
    comm.all_to_all(base + 2 * region, base + 3 * region, 1, stream);
    comm.synchronize(stream, 300);
  } catch (...) {
    cudaStreamDestroy(stream);
    throw;
  }
  THDCP_CHECK_CUDA(cudaStreamDestroy(stream));
  return window;
}

}  // namespace thdcp::cp::detail
