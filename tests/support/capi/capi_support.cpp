#include "support/capi/capi_support.h"

#include <utility>

namespace thdcp::test {

thdcp_dtype_t c_dtype(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return THDCP_DTYPE_BF16;
    case DType::kFloat16: return THDCP_DTYPE_FP16;
    case DType::kFloat32: return THDCP_DTYPE_FP32;
  }
  return THDCP_DTYPE_DEFAULT;
}

DType dtype_of(thdcp_dtype_t dtype) {
  switch (dtype) {
    case THDCP_DTYPE_FP16: return DType::kFloat16;
    case THDCP_DTYPE_FP32: return DType::kFloat32;
    default: return DType::kBFloat16;
  }
}

thdcp_tensor_t c_tensor(const HostTensor& t) {
  thdcp_tensor_t c{};
  c.data = const_cast<void*>(t.data());
  c.rows = t.tokens();
  c.heads = t.heads();
  c.head_dim = t.head_dim();
  c.dtype = c_dtype(t.dtype());
  return c;
}

thdcp_layout_t c_layout(const BatchLayout& layout) {
  return thdcp_layout_t{layout.cu_seqlens.data(), layout.cu_seqlens_padded.data(), layout.num_seqs()};
}

::testing::AssertionResult status_is(thdcp_status_t status, thdcp_status_t expected,
                                     const std::vector<std::string>& parts) {
  const std::string message = thdcp_last_error();
  if (status != expected) {
    return ::testing::AssertionFailure() << "status " << thdcp_status_name(status) << ", expected "
                                         << thdcp_status_name(expected) << "; last error: " << message;
  }
  for (const std::string& part : parts) {
    if (message.find(part) == std::string::npos) {
      return ::testing::AssertionFailure() << "the message does not contain '" << part << "': " << message;
    }
  }
  return ::testing::AssertionSuccess();
}

Snapshot& Snapshot::add(const void* data, size_t bytes) {
  buffers_.push_back({data, std::vector<unsigned char>(static_cast<const unsigned char*>(data),
                                                       static_cast<const unsigned char*>(data) + bytes)});
  return *this;
}

Snapshot& Snapshot::add(const HostTensor& t) {
  return add(t.data(), static_cast<size_t>(t.numel()) * dtype_size(t.dtype()));
}

Snapshot& Snapshot::add(const std::vector<float>& v) { return add(v.data(), v.size() * sizeof(float)); }

::testing::AssertionResult Snapshot::unchanged() const {
  for (size_t i = 0; i < buffers_.size(); ++i) {
    const Buffer& b = buffers_[i];
    if (std::memcmp(b.data, b.bytes.data(), b.bytes.size()) != 0) {
      return ::testing::AssertionFailure() << "buffer " << i << " was written by a refused call";
    }
  }
  return ::testing::AssertionSuccess();
}

void c_attention_on_host(const thdcp_attention_params* params, const Batch& b, Outputs& r) {
  thdcp_attention_plan_t plan = nullptr;
  EXPECT_C_OK(thdcp_attention_plan_create(params, nullptr, 0, &plan));
  const thdcp_layout_t layout = c_layout(b.layout);
  const thdcp_tensor_t q = c_tensor(b.q), k = c_tensor(b.k), v = c_tensor(b.v), dout = c_tensor(b.dout);
  const thdcp_tensor_t out = c_tensor(r.out), dq = c_tensor(r.dq), dk = c_tensor(r.dk), dv = c_tensor(r.dv);
  EXPECT_C_OK(thdcp_attention_forward(plan, &layout, &q, &k, &v, &out, r.lse.data(), r.max_logit.data(), nullptr));
  EXPECT_C_OK(thdcp_attention_backward(plan, &layout, &q, &k, &v, &out, &dout, r.lse.data(), &dq, &dk, &dv, nullptr));
  EXPECT_C_OK(thdcp_attention_plan_destroy(plan));
}

HostTensor c_local_rows(const HostTensor& global, const thdcp_layout_t& layout, int cp, int rank,
                        thdcp_cp_layout_t cp_layout) {
  HostTensor local(global.dtype(), global.tokens() / cp, global.heads(), global.head_dim());
  EXPECT_C_OK(thdcp_cp_split_ex(global.data(), local.data(), global.row_bytes(), &layout, cp, rank, cp_layout));
  return local;
}

void c_merge_rows(const Outputs& local, Outputs& global, const thdcp_layout_t& layout, int cp, int rank,
                  thdcp_cp_layout_t cp_layout) {
  for (auto [from, to] : {std::make_pair(&local.out, &global.out), std::make_pair(&local.dq, &global.dq),
                          std::make_pair(&local.dk, &global.dk), std::make_pair(&local.dv, &global.dv)}) {
    EXPECT_C_OK(thdcp_cp_merge_ex(from->data(), to->data(), from->row_bytes(), &layout, cp, rank, cp_layout));
  }
  const int64_t local_rows = local.out.tokens(), rows = global.out.tokens();
  for (int64_t h = 0; h < global.out.heads(); ++h) {
    EXPECT_C_OK(thdcp_cp_merge_ex(local.lse.data() + h * local_rows, global.lse.data() + h * rows, sizeof(float),
                                  &layout, cp, rank, cp_layout));
  }
}

}  // namespace thdcp::test
