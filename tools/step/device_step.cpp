#include "step/device_step.h"

#include "thdcp/core/cuda_check.h"
#include "thdcp/core/workspace.h"

namespace thdcp::tools {

namespace {

cp::KvSource kv_source(Pass pass) {
  return pass == Pass::kForwardBackwardKeptKv ? cp::KvSource::kFromForward : cp::KvSource::kGather;
}

HostTensor like(const ConstThdTensor& t) { return HostTensor(t.dtype, t.tokens, t.heads, t.head_dim); }

}  // namespace

void DeviceTensors::carve(WorkspaceCarver& carver, const StepShape& s, int64_t rows, size_t layout_entries) {
  auto tensor = [&](int64_t heads, int64_t dim) {
    return ThdTensor{carver.take(s.bytes(rows, heads, dim)), s.dtype, rows, heads, dim};
  };
  const int64_t d_qk = s.head_dim, d_v = s.value_head_dim();
  q = tensor(s.q_heads, d_qk);
  k = tensor(s.kv_heads, d_qk);
  v = tensor(s.kv_heads, d_v);
  dout = tensor(s.q_heads, d_v);
  out = tensor(s.q_heads, d_v);
  lse = carver.take_array<float>(static_cast<size_t>(rows * s.q_heads));
  max_logit = carver.take_array<float>(static_cast<size_t>(s.q_heads));
  dq = tensor(s.q_heads, d_qk);
  dk = tensor(s.kv_heads, d_qk);
  dv = tensor(s.kv_heads, d_v);
  cu_seqlens_ = carver.take_array<int32_t>(layout_entries);
  cu_seqlens_padded_ = carver.take_array<int32_t>(layout_entries);
}

size_t DeviceTensors::bytes(const StepShape& shape, int64_t rows, size_t layout_entries) {
  DeviceTensors sizing;
  WorkspaceCarver carver;
  sizing.carve(carver, shape, rows, layout_entries);
  return carver.bytes();
}

DeviceTensors::DeviceTensors(const StepShape& shape, int64_t rows, const BatchLayout& layout, cudaStream_t stream)
    : memory_(bytes(shape, rows, layout.cu_seqlens.size())) {
  WorkspaceCarver carver(memory_.data());
  carve(carver, shape, rows, layout.cu_seqlens.size());
  const size_t offsets = sizeof(int32_t) * layout.cu_seqlens.size();
  THDCP_CHECK_CUDA(cudaMemcpyAsync(cu_seqlens_, layout.cu_seqlens.data(), offsets, cudaMemcpyHostToDevice, stream));
  THDCP_CHECK_CUDA(
      cudaMemcpyAsync(cu_seqlens_padded_, layout.cu_seqlens_padded.data(), offsets, cudaMemcpyHostToDevice, stream));
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
}

DeviceLayout DeviceTensors::layout(const Capacity& capacity) const {
  return DeviceLayout{cu_seqlens_, cu_seqlens_padded_, capacity};
}

ForwardTensors DeviceTensors::forward() const {
  return ForwardTensors{q, k, v, out, lse, max_logit, static_cast<const float*>(sinks_.data())};
}

BackwardTensors DeviceTensors::backward() const {
  BackwardTensors t{q, k, v, out, dout, lse, dq, dk, dv};
  t.sinks = static_cast<const float*>(sinks_.data());
  t.dsinks = static_cast<float*>(dsinks_.data());
  return t;
}

void DeviceTensors::upload_sinks(const std::vector<float>& sinks, cudaStream_t stream) {
  const size_t bytes = sizeof(float) * sinks.size();
  sinks_ = cuda::DeviceBuffer(bytes);
  dsinks_ = cuda::DeviceBuffer(bytes);
  THDCP_CHECK_CUDA(cudaMemcpyAsync(sinks_.data(), sinks.data(), bytes, cudaMemcpyHostToDevice, stream));
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
}

void DeviceTensors::upload_inputs(const HostTensor& q_rows, const HostTensor& k_rows, const HostTensor& v_rows,
                                  const HostTensor& dout_rows, cudaStream_t stream) {
  for (auto [name, host, device] : {std::make_tuple("q", &q_rows, &q), std::make_tuple("k", &k_rows, &k),
                                    std::make_tuple("v", &v_rows, &v), std::make_tuple("dout", &dout_rows, &dout)}) {
    check_thd_shape(name, host->view(), ThdShape{device->tokens, "rows", device->heads, "heads", device->head_dim});
    check_thd_dtype(name, host->dtype(), device->dtype);
    THDCP_CHECK_CUDA(cudaMemcpyAsync(device->data, host->data(), static_cast<size_t>(device->numel()) *
                                     dtype_size(device->dtype), cudaMemcpyHostToDevice, stream));
  }
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
}

namespace {

// Bytes from the start of `first` to the end of `last`, 0xff.
void poison_range(const ThdTensor& first, const ThdTensor& last, cudaStream_t stream) {
  auto* begin = static_cast<unsigned char*>(first.data);
  auto* end = static_cast<unsigned char*>(last.data) + static_cast<size_t>(last.numel()) * dtype_size(last.dtype);
  THDCP_CHECK_CUDA(cudaMemsetAsync(begin, 0xff, static_cast<size_t>(end - begin), stream));
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
}

}  // namespace

void DeviceTensors::poison_outputs(cudaStream_t stream) { poison_range(out, dv, stream); }

void DeviceTensors::poison_gradients(cudaStream_t stream) { poison_range(dq, dv, stream); }

HostOutputs DeviceTensors::download_outputs(cudaStream_t stream) const {
  HostOutputs host{like(out), like(dq), like(dk), like(dv), {}, {}, {}};
  host.lse.resize(static_cast<size_t>(out.tokens * out.heads));
  host.max_logit.resize(static_cast<size_t>(out.heads));
  for (auto [to, from] : {std::make_pair(&host.out, &out), std::make_pair(&host.dq, &dq),
                          std::make_pair(&host.dk, &dk), std::make_pair(&host.dv, &dv)}) {
    THDCP_CHECK_CUDA(cudaMemcpyAsync(to->data(), from->data, static_cast<size_t>(from->numel()) *
                                     dtype_size(from->dtype), cudaMemcpyDeviceToHost, stream));
  }
  THDCP_CHECK_CUDA(cudaMemcpyAsync(host.lse.data(), lse, sizeof(float) * host.lse.size(), cudaMemcpyDeviceToHost,
                                   stream));
  THDCP_CHECK_CUDA(cudaMemcpyAsync(host.max_logit.data(), max_logit, sizeof(float) * host.max_logit.size(),
                                   cudaMemcpyDeviceToHost, stream));
  if (dsinks_.bytes() > 0) {
    host.dsinks.resize(dsinks_.bytes() / sizeof(float));
    THDCP_CHECK_CUDA(cudaMemcpyAsync(host.dsinks.data(), dsinks_.data(), dsinks_.bytes(), cudaMemcpyDeviceToHost,
                                     stream));
  }
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
  return host;
}

void run_pass(cp::CudaPlan& plan, const DeviceTensors& tensors, cudaStream_t stream, Pass pass) {
  const DeviceLayout layout = tensors.layout(plan.problem().capacity);
  plan.forward(layout, tensors.forward(), stream);
  if (pass == Pass::kForward) return;
  plan.backward(layout, tensors.backward(), stream, kv_source(pass));
}

cp::Timings time_phases(cp::CudaPlan& plan, const DeviceTensors& tensors, cudaStream_t stream, Pass pass,
                        const std::function<void()>& wait) {
  cp::Timings timings;
  run_pass(plan, tensors, stream, Pass::kForward);
  wait();
  plan.add_phase_timings(timings);
  if (pass == Pass::kForward) return timings;
  plan.backward(tensors.layout(plan.problem().capacity), tensors.backward(), stream, kv_source(pass));
  wait();
  plan.add_phase_timings(timings);
  return timings;
}

}  // namespace thdcp::tools
