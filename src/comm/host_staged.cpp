#include "thdcp/comm/host_staged.h"

#include "thdcp/cuda/check.h"

namespace thdcp::cuda {

void HostStagedCommunicator::all_gather(const void* send, void* recv, size_t bytes) {
  send_.resize(bytes);
  recv_.resize(bytes * static_cast<size_t>(size()));
  THDCP_CHECK_CUDA(cudaMemcpyAsync(send_.data(), send, bytes, cudaMemcpyDeviceToHost, stream_));
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream_));
  host_.all_gather(send_.data(), recv_.data(), bytes);
  THDCP_CHECK_CUDA(cudaMemcpyAsync(recv, recv_.data(), recv_.size(), cudaMemcpyHostToDevice, stream_));
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream_));
}

void HostStagedCommunicator::reduce_scatter_sum(const float* send, float* recv, size_t count) {
  const size_t bytes = count * sizeof(float);
  send_.resize(bytes * static_cast<size_t>(size()));
  recv_.resize(bytes);
  THDCP_CHECK_CUDA(cudaMemcpyAsync(send_.data(), send, send_.size(), cudaMemcpyDeviceToHost, stream_));
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream_));
  host_.reduce_scatter_sum(reinterpret_cast<const float*>(send_.data()), reinterpret_cast<float*>(recv_.data()),
                           count);
  THDCP_CHECK_CUDA(cudaMemcpyAsync(recv, recv_.data(), bytes, cudaMemcpyHostToDevice, stream_));
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream_));
}

void HostStagedCommunicator::all_reduce_max(float* data, size_t count) {
  const size_t bytes = count * sizeof(float);
  send_.resize(bytes);
  THDCP_CHECK_CUDA(cudaMemcpyAsync(send_.data(), data, bytes, cudaMemcpyDeviceToHost, stream_));
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream_));
  host_.all_reduce_max(reinterpret_cast<float*>(send_.data()), count);
  THDCP_CHECK_CUDA(cudaMemcpyAsync(data, send_.data(), bytes, cudaMemcpyHostToDevice, stream_));
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream_));
}

}  // namespace thdcp::cuda
