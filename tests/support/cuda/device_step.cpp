#include "support/cuda/device_step.h"

#include "thdcp/testing/workload.h"

namespace thdcp::test {

DeviceStep::DeviceStep(DType dtype, int64_t q_rows, int64_t k_rows, const HeadShape& heads, DType grad_dtype)
    : q(dtype, q_rows, heads.q_heads, heads.head_dim),
      k(dtype, k_rows, heads.kv_heads, heads.head_dim),
      v(dtype, k_rows, heads.kv_heads, heads.value_head_dim()),
      dout(dtype, q_rows, heads.q_heads, heads.value_head_dim()),
      out(dtype, q_rows, heads.q_heads, heads.value_head_dim()),
      dq(grad_dtype, q_rows, heads.q_heads, heads.head_dim),
      dk(grad_dtype, k_rows, heads.kv_heads, heads.head_dim),
      dv(grad_dtype, k_rows, heads.kv_heads, heads.value_head_dim()),
      lse(sizeof(float) * static_cast<size_t>(heads.q_heads * q_rows)),
      max_logit(sizeof(float) * static_cast<size_t>(heads.q_heads)) {}

void DeviceStep::fill_inputs(uint64_t seed) {
  for (DeviceTensor* t : {&q, &k, &v, &dout}) {
    HostTensor host(t->dtype, t->tokens, t->heads, t->head_dim);
    fill_normal(host, seed++);
    t->buffer.upload(host.data(), t->bytes());
  }
}

void DeviceStep::upload_inputs(const HostTensor& q_in, const HostTensor& k_in, const HostTensor& v_in,
                               const HostTensor& dout_in) {
  for (auto [to, from] : {std::make_pair(&q, &q_in), std::make_pair(&k, &k_in), std::make_pair(&v, &v_in),
                          std::make_pair(&dout, &dout_in)}) {
    THDCP_CHECK(to->bytes() == static_cast<size_t>(from->numel()) * dtype_size(from->dtype()),
                "test: a host input does not have the shape of its device tensor");
    to->buffer.upload(from->data(), to->bytes());
  }
}

ForwardTensors DeviceStep::forward_tensors() {
  return ForwardTensors{q.cview(), k.cview(), v.cview(), out.view(), lse.as<float>(), max_logit.as<float>()};
}

BackwardTensors DeviceStep::backward_tensors() {
  return BackwardTensors{q.cview(),       k.cview(), v.cview(), out.cview(), dout.cview(),
                         lse.as<float>(), dq.view(), dk.view(), dv.view()};
}

namespace {

ThdTensor first_rows(DeviceTensor& t, int64_t rows) {
  return ThdTensor{t.buffer.data(), t.dtype, rows, t.heads, t.head_dim};
}

}  // namespace

ForwardTensors DeviceStep::forward_tensors(int64_t rows) {
  return ForwardTensors{first_rows(q, rows),   first_rows(k, rows), first_rows(v, rows),
                        first_rows(out, rows), lse.as<float>(),     max_logit.as<float>()};
}

BackwardTensors DeviceStep::backward_tensors(int64_t rows) {
  return BackwardTensors{first_rows(q, rows),   first_rows(k, rows),    first_rows(v, rows),
                         first_rows(out, rows), first_rows(dout, rows), lse.as<float>(),
                         first_rows(dq, rows),  first_rows(dk, rows),   first_rows(dv, rows)};
}

void DeviceStep::poison_outputs() {
  for (DeviceBuffer* b : {&out.buffer, &dq.buffer, &dk.buffer, &dv.buffer, &lse, &max_logit}) b->poison();
}

void DeviceStep::poison_outputs(cudaStream_t stream) {
  for (DeviceBuffer* b : {&out.buffer, &dq.buffer, &dk.buffer, &dv.buffer, &lse, &max_logit}) b->poison(stream);
}

std::vector<std::vector<unsigned char>> DeviceStep::output_bytes() const {
  std::vector<std::vector<unsigned char>> r;
  for (const DeviceBuffer* b : {&out.buffer, &lse, &max_logit, &dq.buffer, &dk.buffer, &dv.buffer}) {
    r.push_back(download_vector<unsigned char>(*b, b->bytes()));
  }
  return r;
}

Outputs DeviceStep::download_outputs() const {
  Outputs r;
  r.out = out.download();
  r.dq = dq.download();
  r.dk = dk.download();
  r.dv = dv.download();
  r.lse = download_vector<float>(lse, static_cast<size_t>(q.heads * q.tokens));
  r.max_logit = download_vector<float>(max_logit, static_cast<size_t>(q.heads));
  return r;
}

Outputs DeviceStep::download_outputs(int64_t rows) const {
  const auto take = [&](const DeviceTensor& t) {
    HostTensor h(t.dtype, rows, t.heads, t.head_dim);
    t.buffer.download(h.data(), static_cast<size_t>(rows) * h.row_bytes());
    return h;
  };
  Outputs r;
  r.out = take(out);
  r.dq = take(dq);
  r.dk = take(dk);
  r.dv = take(dv);
  r.lse = download_vector<float>(lse, static_cast<size_t>(q.heads * q.tokens));
  r.lse.resize(static_cast<size_t>(q.heads * rows));
  r.max_logit = download_vector<float>(max_logit, static_cast<size_t>(q.heads));
  return r;
}

::testing::AssertionResult still_poisoned(const DeviceStep& step) {
  const std::vector<std::vector<unsigned char>> bytes = step.output_bytes();
  for (size_t i = 0; i < bytes.size(); ++i) {
    bool poisoned = true;
    for (unsigned char x : bytes[i]) poisoned = poisoned && x == 0xff;
    if (!poisoned) return ::testing::AssertionFailure() << kOutputNames[i] << " was written";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace thdcp::test
