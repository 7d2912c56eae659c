// The CUDA backend of `thdcp run` (compiled to a stub when thdcp is built without CUDA).
#include <chrono>
#include <cstdlib>
#include <string>

#include "args.h"
#include "progress.h"
#include "run_inputs.h"
#include "run_job.h"

#if defined(THDCP_CLI_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "thdcp/cuda/check.h"
#include "thdcp/cp/cuda.h"
#include "thdcp/testing/device_buffer.h"
#include "thdcp/comm/host_staged.h"
#endif

namespace thdcp::tools {

#if defined(THDCP_CLI_WITH_CUDA)

namespace {

using cuda::DeviceBuffer;

struct DeviceThd {
  DeviceBuffer buffer;
  DType dtype;
  int64_t tokens, heads, head_dim;
  DeviceThd(DType dtype_, int64_t tokens_, int64_t heads_, int64_t head_dim_)
      : buffer(static_cast<size_t>(tokens_ * heads_ * head_dim_) * dtype_size(dtype_)), dtype(dtype_),
        tokens(tokens_), heads(heads_), head_dim(head_dim_) {}
  ThdTensor view() const { return ThdTensor{buffer.data(), dtype, tokens, heads, head_dim}; }
};

void upload(DeviceThd& device, const HostTensor& host, cudaStream_t stream) {
  THDCP_CHECK_CUDA(cudaMemcpyAsync(device.buffer.data(), host.data(), device.buffer.bytes(), cudaMemcpyHostToDevice,
                                   stream));
}

HostTensor download(const DeviceThd& device, cudaStream_t stream) {
  HostTensor host(device.dtype, device.tokens, device.heads, device.head_dim);
  THDCP_CHECK_CUDA(cudaMemcpyAsync(host.data(), device.buffer.data(), device.buffer.bytes(), cudaMemcpyDeviceToHost,
                                   stream));
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
  return host;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

Backend resolve_backend(const RunConfig& c, std::string* why) {
  const Backend requested = c.backend;
  if (requested == Backend::kCpu) {
    *why = "--backend cpu";
    return Backend::kCpu;
  }
  std::string unsupported;
  if (c.dtype == DType::kFloat32) unsupported = "fp32 storage";
  if (!cuda::cuda_supports_head_dim(c.head_dim)) unsupported = "head_dim " + std::to_string(c.head_dim);
  if (!unsupported.empty()) {
    if (requested == Backend::kCuda) {
      throw UsageError("--backend cuda: the CUDA kernels do not support " + unsupported +
                       ": use bf16 or fp16 and head_dim 64 or 128, or --backend cpu");
    }
    *why = "the CUDA kernels do not support " + unsupported;
    return Backend::kCpu;
  }
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    const std::string reason = status != cudaSuccess ? std::string("no CUDA device: ") + cudaGetErrorString(status)
                                                     : std::string("no CUDA device");
    (void)cudaGetLastError();
    if (requested == Backend::kCuda) throw UsageError("--backend cuda: " + reason + ": use --backend cpu");
    *why = reason;
    return Backend::kCpu;
  }
  cudaDeviceProp prop{};
  THDCP_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  *why = std::string(prop.name) + (count > 1 ? " (x" + std::to_string(count) + ")" : "");
  return Backend::kCuda;
}

RankResult run_rank_cuda(Communicator& host_comm, const RunConfig& c, const GlobalBatch& batch, Progress& progress) {
  int devices = 0;
  THDCP_CHECK_CUDA(cudaGetDeviceCount(&devices));
  // Under mpirun a node's processes share its GPUs round robin; in-process ranks share GPU 0
  // when there is one.
  const char* local_rank = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const int device = (local_rank ? std::atoi(local_rank) : host_comm.rank()) % devices;
  THDCP_CHECK_CUDA(cudaSetDevice(device));
  cudaStream_t stream;
  THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  RankResult r;
  try {
    cuda::HostStagedCommunicator comm(host_comm, stream);
    const LayoutView layout = batch.layout.view();
    const int cp = comm.size(), rank = comm.rank();
    const int64_t rows = layout.total_rows() / cp;
    DeviceThd q(c.dtype, rows, c.q_heads, c.head_dim), k(c.dtype, rows, c.kv_heads, c.head_dim),
        v(c.dtype, rows, c.kv_heads, c.head_dim), dout(c.dtype, rows, c.q_heads, c.head_dim);
    DeviceThd out(c.dtype, rows, c.q_heads, c.head_dim), dq(c.dtype, rows, c.q_heads, c.head_dim),
        dk(c.dtype, rows, c.kv_heads, c.head_dim), dv(c.dtype, rows, c.kv_heads, c.head_dim);
    upload(q, split_for_rank(batch.q, layout, cp, rank), stream);
    upload(k, split_for_rank(batch.k, layout, cp, rank), stream);
    upload(v, split_for_rank(batch.v, layout, cp, rank), stream);
    upload(dout, split_for_rank(batch.dout, layout, cp, rank), stream);
    DeviceBuffer lse(sizeof(float) * c.q_heads * rows), max_logit(sizeof(float) * c.q_heads);
    const size_t offsets = sizeof(int32_t) * batch.layout.cu_seqlens.size();
    DeviceBuffer cu(offsets), cup(offsets);
    THDCP_CHECK_CUDA(cudaMemcpyAsync(cu.data(), batch.layout.cu_seqlens.data(), offsets, cudaMemcpyHostToDevice, stream));
    THDCP_CHECK_CUDA(
        cudaMemcpyAsync(cup.data(), batch.layout.cu_seqlens_padded.data(), offsets, cudaMemcpyHostToDevice, stream));
    const cuda::DeviceLayout device_layout{static_cast<const int32_t*>(cu.data()),
                                           static_cast<const int32_t*>(cup.data()), layout.num_seqs,
                                           layout.total_rows()};
    DeviceBuffer fwd_ws(cuda::cp_forward_workspace_size(device_layout, cp, c.q_heads, c.kv_heads, c.head_dim, c.dtype));
    DeviceBuffer bwd_ws(
        cuda::cp_backward_workspace_size(device_layout, cp, c.q_heads, c.kv_heads, c.head_dim, c.dtype));
    THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));

    auto start = std::chrono::steady_clock::now();
    cuda::cp_forward(comm, device_layout, c.mask, q.view(), k.view(), v.view(), out.view(),
                     static_cast<float*>(lse.data()), static_cast<float*>(max_logit.data()), fwd_ws.data(),
                     fwd_ws.bytes(), stream);
    THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
    r.forward_wall = seconds_since(start);
    progress.step();
    start = std::chrono::steady_clock::now();
    cuda::cp_backward(comm, device_layout, c.mask, q.view(), k.view(), v.view(), out.view(), dout.view(),
                      static_cast<const float*>(lse.data()), dq.view(), dk.view(), dv.view(), bwd_ws.data(),
                      bwd_ws.bytes(), stream);
    THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
    r.backward_wall = seconds_since(start);
    progress.step();

    r.out = download(out, stream);
    r.dq = download(dq, stream);
    r.dk = download(dk, stream);
    r.dv = download(dv, stream);
    r.lse.resize(static_cast<size_t>(c.q_heads * rows));
    r.max_logit.resize(static_cast<size_t>(c.q_heads));
    THDCP_CHECK_CUDA(cudaMemcpy(r.lse.data(), lse.data(), lse.bytes(), cudaMemcpyDeviceToHost));
    THDCP_CHECK_CUDA(cudaMemcpy(r.max_logit.data(), max_logit.data(), max_logit.bytes(), cudaMemcpyDeviceToHost));
  } catch (...) {
    cudaStreamDestroy(stream);
    throw;
  }
  THDCP_CHECK_CUDA(cudaStreamDestroy(stream));
  return r;
}

#else  // built without CUDA

Backend resolve_backend(const RunConfig& c, std::string* why) {
  const Backend requested = c.backend;
  if (requested == Backend::kCuda) {
    throw UsageError("--backend cuda: this thdcp was built without CUDA (rebuild with -DTHDCP_WITH_CUDA=ON)");
  }
  *why = requested == Backend::kCpu ? "--backend cpu" : "built without CUDA";
  return Backend::kCpu;
}

RankResult run_rank_cuda(Communicator&, const RunConfig&, const GlobalBatch&, Progress&) {
  throw UsageError("this thdcp was built without CUDA");
}

#endif

}  // namespace thdcp::tools
