// The CUDA attention of the C ABI (libthdcp.so) on a GPU (label gpu; SKIPPED with the reason
// where no CUDA device is visible): attention on THDCP_BACKEND_CUDA equals the C++
// thdcp::attention_forward / attention_backward on the same device inputs bit for bit:
// bf16 and fp16, head_dim 64 and 128, causal, full, windows, GQA/MQA, fp32 gradients; a
// varlen batch in capacity form with padding rows and an empty sequence; every output
// poisoned with NaN first.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "support/capi/capi_cuda.h"
#include "thdcp/thdcp.h"

namespace thdcp::test {
namespace {

struct AttentionCase {
  const char* name;
  Shape shape;
  DType grad_dtype;
};
void PrintTo(const AttentionCase& c, std::ostream* os) { *os << c.name; }  // the ctest name's comment

class CApiCudaAttention : public CApiCudaTest, public ::testing::WithParamInterface<AttentionCase> {};

TEST_P(CApiCudaAttention, ForwardAndBackwardEqualTheCppApiBitForBit) {
  const AttentionCase& c = GetParam();
  const Shape& s = c.shape;
  const Batch b = varlen_batch(s, 7 + static_cast<uint64_t>(s.q_heads * 5 + s.kv_heads + s.head_dim));
  const Stream stream;
  LayoutOnDevice layout(kVarlenCapacity.max_seqs);
  layout.upload(b.layout, stream.get());
  const int64_t rows = b.q.tokens();
  const StepBuffers c_buffers(s, rows, c.grad_dtype), cpp_buffers(s, rows, c.grad_dtype);
  const StepTensors& via_c = c_buffers.tensors();
  StepTensors via_cpp = cpp_buffers.tensors();  // its outputs, and the inputs of the C ABI call
  via_cpp.q = via_c.q;
  via_cpp.k = via_c.k;
  via_cpp.v = via_c.v;
  via_cpp.dout = via_c.dout;
  upload_inputs(via_c, b.q, b.k, b.v, b.dout, stream.get());
  fill_outputs(via_c, stream.get());
  fill_outputs(via_cpp, stream.get());

  c_attention(cuda_attention_params(s, kVarlenCapacity, c.grad_dtype), layout.c(), via_c, stream.get());
  cpp_attention(s, layout.c(), via_cpp, stream.get());

  const Outputs got = download_outputs(via_c, stream.get()), want = download_outputs(via_cpp, stream.get());
  EXPECT_TRUE(all_written(got));
  EXPECT_TRUE(identical(got, want)) << "the C ABI differs from thdcp::cuda";
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CApiCudaAttention,
    ::testing::Values(
        AttentionCase{"causal_bf16_d64", Shape{DType::kBFloat16, 4, 4, 64, Mask::causal()}, DType::kBFloat16},
        AttentionCase{"full_fp16_d128", Shape{DType::kFloat16, 4, 4, 128, Mask::full()}, DType::kFloat16},
        AttentionCase{"window_gqa2_bf16_d128", Shape{DType::kBFloat16, 4, 2, 128, Mask::window(64, 16)},
                      DType::kBFloat16},
        AttentionCase{"causal_window_gqa4_fp16_d64", Shape{DType::kFloat16, 8, 2, 64, Mask::window(100, 0)},
                      DType::kFloat16},
        AttentionCase{"causal_mqa_bf16_d64_fp32_grads", Shape{DType::kBFloat16, 8, 1, 64, Mask::causal()},
                      DType::kFloat32},
        AttentionCase{"full_gqa2_fp16_d128_fp32_grads", Shape{DType::kFloat16, 4, 2, 128, Mask::full()},
                      DType::kFloat32}),
    [](const ::testing::TestParamInfo<AttentionCase>& param_info) { return std::string(param_info.param.name); });

}  // namespace
}  // namespace thdcp::test
