// Ending a stream capture with a message that says what to change (the device communicators).
#pragma once

#include <cuda_runtime_api.h>

namespace thdcp::detail {

// cudaStreamEndCapture on `stream`; on failure throws thdcp::Error naming `rank`, CUDA's
// error and the rules of captured work. The stream is no longer capturing either way.
cudaGraph_t end_stream_capture(cudaStream_t stream, int rank);

// Ends the capture `stream` is in, if any, and discards its graph. Never throws.
void discard_stream_capture(cudaStream_t stream) noexcept;

}  // namespace thdcp::detail
