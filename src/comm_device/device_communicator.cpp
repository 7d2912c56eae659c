// The per-rank graph capture of DeviceCommunicator (NCCL and any communicator whose ranks
// each own their stream's graph).
#include "thdcp/comm_device/device_communicator.h"

#include <string>

#include "thdcp/core/error.h"
#include "thdcp/core/cuda_check.h"
#include "stream_capture.h"

namespace thdcp {

namespace detail {

cudaGraph_t end_stream_capture(cudaStream_t stream, int rank) {
  cudaGraph_t graph = nullptr;
  const cudaError_t status = cudaStreamEndCapture(stream, &graph);
  if (status == cudaSuccess) return graph;
  cudaGetLastError();  // the capture's sticky-free error; the stream is usable again
  if (graph) cudaGraphDestroy(graph);
  THDCP_FAIL("rank " << rank << ": the CUDA graph capture failed: " << cudaGetErrorName(status) << " ("
                     << cudaGetErrorString(status)
                     << "). Captured work must only enqueue on the stream: no host synchronisation "
                        "(cudaStreamSynchronize, cudaDeviceSynchronize, a blocking cudaMemcpy), no "
                        "allocation and no read of device memory on the host while capturing");
}

void discard_stream_capture(cudaStream_t stream) noexcept {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
  }
  cudaGetLastError();
}

}  // namespace detail

std::unique_ptr<DeviceCommunicator::Window> DeviceCommunicator::register_window(void*, size_t) { return nullptr; }

void DeviceCommunicator::begin_capture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  THDCP_CHECK_CUDA(cudaStreamBeginCapture(stream, mode));
}

void DeviceCommunicator::abandon_capture(cudaStream_t stream) noexcept { detail::discard_stream_capture(stream); }

cudaGraph_t DeviceCommunicator::end_capture(cudaStream_t stream) { return detail::end_stream_capture(stream, rank()); }

void DeviceCommunicator::launch(cudaGraphExec_t exec, cudaStream_t stream) {
  THDCP_CHECK(exec != nullptr, "rank " << rank() << ": launch needs the graph this rank instantiated, not nullptr");
  THDCP_CHECK_CUDA(cudaGraphLaunch(exec, stream));
}

}  // namespace thdcp
