// The CUDA code paths of the C ABI (libthdcp.so) on a GPU (label gpu). Every case reports
// SKIPPED with the reason where no CUDA device is visible (test::CudaTest), and the NCCL
// cases where libthdcp was built without NCCL.
//  - Attention on THDCP_BACKEND_CUDA equals the C++ thdcp::test::attention_forward /
//    attention_backward on the same device inputs bit for bit: bf16 and fp16, head_dim 64
//    and 128, causal, full, windows, GQA/MQA, fp32 gradients; a varlen batch in capacity
//    form with padding rows and an empty sequence; every output poisoned with NaN first.
//  - Bad arguments on the CUDA backend: workspaces too small (attention and CP plans) or in
//    host memory, a host pointer as q: the status, thdcp_last_error naming the argument,
//    and nothing of the caller's written.
//  - NCCL: a communicator from thdcp_nccl_unique_id, and one borrowed from the caller's
//    ncclCommInitAll; a cp = 1 CP plan over each equals the single-device C ABI attention
//    within the GPU tolerances of tests/cp; the borrowed ncclComm_t stays the caller's.
//  - A shared-GPU group of cp = 2 ranks on threads: the CP step, its rows merged with
//    thdcp_cp_merge, equals the single-device C ABI attention (same tolerances).
//  - A graph bank over a shared-GPU group: 4 packings of one capacity run as warm-up,
//    capture and replays of a callback that runs the CP step on the bank's buffers; each
//    equals an eager run of the same callback bit for bit, and the counters say so.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <ostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if defined(THDCP_HAVE_NCCL)
#include <nccl.h>
#endif

#include "support/cuda/one_shot.h"
#include "support/capi/capi_support.h"
#include "support/cp/cuda_cp_rank.h"
#include "support/cuda/cuda_test.h"
#include "support/gpu_tolerance.h"
#include "support/random_batch.h"
#include "thdcp/cuda/attention.h"
#include "thdcp/plan/capacity.h"
#include "thdcp/thdcp.h"

namespace thdcp {
namespace {

using test::c_dtype;
using test::c_layout;
using test::DeviceBuffer;
using test::Outputs;

// ---- shapes and batches -----------------------------------------------------------------

// What a case runs: storage dtype, heads, head dim and mask.
struct Shape {
  DType dtype = DType::kBFloat16;
  int64_t q_heads = 4;
  int64_t kv_heads = 2;
  int64_t head_dim = 64;
  Mask mask = Mask::causal();
};

// Documents with an empty one, a one-token one and lengths that are not multiples of 4,
// each padded to a multiple of 4 (2 * cp for cp <= 2, so the CP cases split the same
// batch), in the capacity form the CUDA backend reads: placeholders after the documents,
// the last one absorbing the 68 slack rows.
const std::vector<int64_t> kLengths = {301, 0, 1, 37, 513, 64, 90};
const Capacity kCapacity{/*max_seqs=*/10, /*max_tokens=*/1088};

test::Batch varlen_batch(const Shape& s, uint64_t seed) {
  return test::make_batch(make_layout(kLengths, 2, kCapacity), s.dtype, s.q_heads, s.kv_heads, s.head_dim, seed);
}

DType dtype_of(thdcp_dtype_t dtype) {
  switch (dtype) {
    case THDCP_DTYPE_FP16: return DType::kFloat16;
    case THDCP_DTYPE_FP32: return DType::kFloat32;
    default: return DType::kBFloat16;
  }
}

thdcp_attention_params attention_params(const Shape& s, const Capacity& capacity, DType grad_dtype) {
  thdcp_attention_params p;
  thdcp_attention_params_init(&p);
  p.backend = THDCP_BACKEND_CUDA;
  p.dtype = c_dtype(s.dtype);
  p.max_tokens = capacity.max_tokens;
  p.max_seqs = capacity.max_seqs;
  p.q_heads = s.q_heads;
  p.kv_heads = s.kv_heads;
  p.head_dim = s.head_dim;
  p.window_left = s.mask.window_left;
  p.window_right = s.mask.window_right;
  p.dq_dtype = p.dkv_dtype = c_dtype(grad_dtype);
  return p;
}

thdcp_cp_params cp_params(const Shape& s, const Capacity& capacity, int cp) {
  thdcp_cp_params p;
  thdcp_cp_params_init(&p);
  p.backend = THDCP_BACKEND_CUDA;
  p.dtype = c_dtype(s.dtype);
  p.cp_size = cp;
  p.max_tokens = capacity.max_tokens;
  p.max_seqs = capacity.max_seqs;
  p.q_heads = s.q_heads;
  p.kv_heads = s.kv_heads;
  p.head_dim = s.head_dim;
  p.window_left = s.mask.window_left;
  p.window_right = s.mask.window_right;
  return p;
}

// ---- device memory as the C ABI takes it ----------------------------------------------

// The descriptor of a contiguous device tensor.
thdcp_tensor_t c_device_tensor(void* data, DType dtype, int64_t rows, int64_t heads, int64_t head_dim) {
  thdcp_tensor_t t{};
  t.data = data;
  t.rows = rows;
  t.heads = heads;
  t.head_dim = head_dim;
  t.dtype = c_dtype(dtype);
  return t;
}

size_t bytes_of(const thdcp_tensor_t& t) {
  return static_cast<size_t>(t.rows * t.heads * t.head_dim) * dtype_size(dtype_of(t.dtype));
}

// The same memory as a C++ view (for thdcp::cuda).
ThdTensor cpp_view(const thdcp_tensor_t& t) {
  return ThdTensor{t.data, dtype_of(t.dtype), t.rows, t.heads, t.head_dim};
}

// One step's tensors in device memory (a rank's rows, or the whole batch), as the C ABI
// takes them: inputs q, k, v, dout; outputs out, dq, dk, dv, lse [Hq, rows], max_logit [Hq].
struct StepTensors {
  thdcp_tensor_t q{}, k{}, v{}, dout{}, out{}, dq{}, dk{}, dv{};
  float* lse = nullptr;
  float* max_logit = nullptr;

  size_t lse_count() const { return static_cast<size_t>(q.heads * q.rows); }
  size_t max_logit_count() const { return static_cast<size_t>(q.heads); }
};

// Device memory of a StepTensors (the graph case uses the bank's buffers instead).
class StepBuffers {
 public:
  StepBuffers(const Shape& s, int64_t rows, DType grad_dtype) {
    const auto tensor = [&](DType dtype, int64_t heads) {
      buffers_.emplace_back(static_cast<size_t>(rows * heads * s.head_dim) * dtype_size(dtype));
      return c_device_tensor(buffers_.back().data(), dtype, rows, heads, s.head_dim);
    };
    t_.q = tensor(s.dtype, s.q_heads);
    t_.k = tensor(s.dtype, s.kv_heads);
    t_.v = tensor(s.dtype, s.kv_heads);
    t_.dout = tensor(s.dtype, s.q_heads);
    t_.out = tensor(s.dtype, s.q_heads);
    t_.dq = tensor(grad_dtype, s.q_heads);
    t_.dk = tensor(grad_dtype, s.kv_heads);
    t_.dv = tensor(grad_dtype, s.kv_heads);
    buffers_.emplace_back(sizeof(float) * t_.lse_count());
    t_.lse = buffers_.back().as<float>();
    buffers_.emplace_back(sizeof(float) * t_.max_logit_count());
    t_.max_logit = buffers_.back().as<float>();
  }
  const StepTensors& tensors() const { return t_; }

 private:
  std::vector<DeviceBuffer> buffers_;
  StepTensors t_;
};

// Copies the host inputs into t's inputs, on `stream`, complete on return.
void upload_inputs(const StepTensors& t, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                   const HostTensor& dout, cudaStream_t stream) {
  for (auto [to, from] : {std::make_pair(&t.q, &q), std::make_pair(&t.k, &k), std::make_pair(&t.v, &v),
                          std::make_pair(&t.dout, &dout)}) {
    THDCP_CHECK(bytes_of(*to) == static_cast<size_t>(from->numel()) * dtype_size(from->dtype()),
                "test: a host input does not have the shape of its device tensor");
    THDCP_CHECK_CUDA(cudaMemcpyAsync(to->data, from->data(), bytes_of(*to), cudaMemcpyHostToDevice, stream));
  }
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
}

// Fills every output byte with `byte` on `stream`, complete on return. 0xff is NaN in fp32,
// fp16 and bf16, so an element no call wrote cannot pass a check.
void fill_outputs(const StepTensors& t, cudaStream_t stream, int byte = 0xff) {
  for (const thdcp_tensor_t* o : {&t.out, &t.dq, &t.dk, &t.dv}) {
    THDCP_CHECK_CUDA(cudaMemsetAsync(o->data, byte, bytes_of(*o), stream));
  }
  THDCP_CHECK_CUDA(cudaMemsetAsync(t.lse, byte, sizeof(float) * t.lse_count(), stream));
  THDCP_CHECK_CUDA(cudaMemsetAsync(t.max_logit, byte, sizeof(float) * t.max_logit_count(), stream));
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
}

// The outputs, once the work enqueued on `stream` is done.
Outputs download(const StepTensors& t, cudaStream_t stream) {
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
  const auto take = [](const thdcp_tensor_t& d) {
    HostTensor h(dtype_of(d.dtype), d.rows, d.heads, d.head_dim);
    THDCP_CHECK_CUDA(cudaMemcpy(h.data(), d.data, bytes_of(d), cudaMemcpyDeviceToHost));
    return h;
  };
  Outputs r;
  r.out = take(t.out);
  r.dq = take(t.dq);
  r.dk = take(t.dk);
  r.dv = take(t.dv);
  r.lse.resize(t.lse_count());
  THDCP_CHECK_CUDA(cudaMemcpy(r.lse.data(), t.lse, sizeof(float) * r.lse.size(), cudaMemcpyDeviceToHost));
  r.max_logit.resize(t.max_logit_count());
  THDCP_CHECK_CUDA(
      cudaMemcpy(r.max_logit.data(), t.max_logit, sizeof(float) * r.max_logit.size(), cudaMemcpyDeviceToHost));
  return r;
}

// A layout's two arrays in device memory, in capacity form (max_seqs + 1 entries each).
class LayoutOnDevice {
 public:
  explicit LayoutOnDevice(int max_seqs)
      : num_seqs_(max_seqs),
        cu_seqlens_(sizeof(int32_t) * static_cast<size_t>(max_seqs + 1)),
        cu_seqlens_padded_(sizeof(int32_t) * static_cast<size_t>(max_seqs + 1)) {}

  // Complete on return.
  void upload(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded, cudaStream_t stream) {
    cu_seqlens_.upload(cu_seqlens, cu_seqlens_.bytes(), stream);
    cu_seqlens_padded_.upload(cu_seqlens_padded, cu_seqlens_padded_.bytes(), stream);
  }
  void upload(const BatchLayout& layout, cudaStream_t stream) {
    THDCP_CHECK(layout.num_seqs() == num_seqs_, "test: the layout is not in this capacity form");
    upload(layout.cu_seqlens.data(), layout.cu_seqlens_padded.data(), stream);
  }
  thdcp_layout_t c() const {
    return thdcp_layout_t{cu_seqlens_.as<int32_t>(), cu_seqlens_padded_.as<int32_t>(), num_seqs_};
  }

 private:
  int num_seqs_;
  DeviceBuffer cu_seqlens_, cu_seqlens_padded_;
};

// A stream of the test's own (non-blocking: the legacy stream does not order it).
class TestStream {
 public:
  TestStream() { THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~TestStream() { cudaStreamDestroy(stream_); }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// ---- runs through the C ABI and the C++ API ---------------------------------------------

// A C ABI attention plan of `params` (CUDA backend) with a workspace of the size the library
// asks for. Destroy it only once its stream's work is done.
class AttentionPlan {
 public:
  explicit AttentionPlan(const thdcp_attention_params& params) {
    size_t bytes = 0;
    EXPECT_C_OK(thdcp_attention_plan_workspace_size(&params, &bytes));
    workspace_ = DeviceBuffer(bytes);
    EXPECT_C_OK(thdcp_attention_plan_create(&params, workspace_.data(), bytes, &plan_));
  }
  ~AttentionPlan() { EXPECT_C_OK(thdcp_attention_plan_destroy(plan_)); }
  AttentionPlan(const AttentionPlan&) = delete;
  AttentionPlan& operator=(const AttentionPlan&) = delete;
  thdcp_attention_plan_t get() const { return plan_; }

 private:
  DeviceBuffer workspace_;
  thdcp_attention_plan_t plan_ = nullptr;
};

// Forward then backward through a C ABI attention plan of `params`.
void c_attention(const thdcp_attention_params& params, const thdcp_layout_t& layout, const StepTensors& t,
                 cudaStream_t stream) {
  const AttentionPlan plan(params);
  ASSERT_NE(plan.get(), nullptr);
  EXPECT_C_OK(thdcp_attention_forward(plan.get(), &layout, &t.q, &t.k, &t.v, &t.out, t.lse, t.max_logit, stream));
  EXPECT_C_OK(thdcp_attention_backward(plan.get(), &layout, &t.q, &t.k, &t.v, &t.out, &t.dout, t.lse, &t.dq, &t.dk,
                                       &t.dv, stream));
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
}

// The same through the C++ API: thdcp::test::attention_forward / attention_backward over the
// single-device table of the device layout (what the C ABI builds on its stream).
void cpp_attention(const Shape& s, const thdcp_layout_t& layout, const StepTensors& t, cudaStream_t stream) {
  const int entries = test::table_entries(cuda::TableKind::kSingleDevice, layout.num_seqs);
  const DeviceBuffer segments(sizeof(Segment) * static_cast<size_t>(entries));
  const cuda::DeviceSegmentTable table =
      test::build_segment_table(layout.cu_seqlens, layout.cu_seqlens_padded, layout.num_seqs, t.q.rows, s.mask,
                                segments.as<Segment>(), stream);
  const DeviceBuffer forward(test::forward_workspace_size(table));
  const DeviceBuffer backward(
      test::backward_workspace_size(table, s.q_heads, s.kv_heads, s.head_dim, dtype_of(t.dk.dtype)));
  test::attention_forward(table, cpp_view(t.q), cpp_view(t.k), cpp_view(t.v), cpp_view(t.out), t.lse, t.max_logit,
                          forward.data(), forward.bytes(), stream);
  test::attention_backward(table, cpp_view(t.q), cpp_view(t.k), cpp_view(t.v), cpp_view(t.out), cpp_view(t.dout),
                           t.lse, cpp_view(t.dq), cpp_view(t.dk), cpp_view(t.dv), backward.data(), backward.bytes(),
                           stream);
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
}

// The single-device C ABI attention (CUDA backend) on the whole batch: the reference of the
// CP cases.
Outputs single_device(const test::Batch& b, const Shape& s) {
  const TestStream stream;
  LayoutOnDevice layout(kCapacity.max_seqs);
  layout.upload(b.layout, stream.get());
  const StepBuffers buffers(s, b.q.tokens(), s.dtype);
  upload_inputs(buffers.tensors(), b.q, b.k, b.v, b.dout, stream.get());
  fill_outputs(buffers.tensors(), stream.get());
  c_attention(attention_params(s, kCapacity, s.dtype), layout.c(), buffers.tensors(), stream.get());
  return download(buffers.tensors(), stream.get());
}

// This rank's CP forward then backward through a C ABI CP plan (CUDA backend) over `comm`.
void c_cp_step(thdcp_communicator_t comm, const thdcp_cp_params& params, const thdcp_layout_t& layout,
               const StepTensors& t, cudaStream_t stream) {
  size_t bytes = 0;
  EXPECT_C_OK(thdcp_cp_plan_workspace_size(&params, &bytes));
  const DeviceBuffer workspace(bytes);
  thdcp_cp_plan_t plan = nullptr;
  ASSERT_C_OK(thdcp_cp_plan_create(comm, &params, workspace.data(), bytes, &plan));
  EXPECT_C_OK(thdcp_cp_forward(plan, &layout, &t.q, &t.k, &t.v, &t.out, t.lse, t.max_logit, stream));
  EXPECT_C_OK(thdcp_cp_backward(plan, &layout, &t.q, &t.k, &t.v, &t.out, &t.dout, t.lse, &t.dq, &t.dk, &t.dv, stream));
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
  EXPECT_C_OK(thdcp_cp_plan_destroy(plan));
}

// The rows of `rank` of a global host tensor (thdcp_cp_split).
HostTensor local_rows(const HostTensor& global, const thdcp_layout_t& layout, int cp, int rank) {
  HostTensor local(global.dtype(), global.tokens() / cp, global.heads(), global.head_dim());
  EXPECT_C_OK(thdcp_cp_split(global.data(), local.data(), global.row_bytes(), &layout, cp, rank));
  return local;
}

// One rank of a CP group on device 0: its rows of `b` through a C ABI CP plan; its outputs
// (local rows).
Outputs c_cp_rank(thdcp_communicator_t comm, const test::Batch& b, const Shape& s) {
  int rank = -1, cp = 0;
  EXPECT_C_OK(thdcp_communicator_rank(comm, &rank));
  EXPECT_C_OK(thdcp_communicator_size(comm, &cp));
  if (rank < 0 || cp < 1) return Outputs{};
  const thdcp_layout_t host_layout = c_layout(b.layout);
  const TestStream stream;
  LayoutOnDevice layout(kCapacity.max_seqs);
  layout.upload(b.layout, stream.get());
  const StepBuffers buffers(s, b.q.tokens() / cp, s.dtype);
  upload_inputs(buffers.tensors(), local_rows(b.q, host_layout, cp, rank), local_rows(b.k, host_layout, cp, rank),
                local_rows(b.v, host_layout, cp, rank), local_rows(b.dout, host_layout, cp, rank), stream.get());
  fill_outputs(buffers.tensors(), stream.get());
  c_cp_step(comm, cp_params(s, kCapacity, cp), layout.c(), buffers.tensors(), stream.get());
  return download(buffers.tensors(), stream.get());
}

// Runs body(comm, rank) on a thread per rank, each with device 0 current. What a rank throws
// is a failure of the test (not std::terminate).
void run_ranks(const std::vector<thdcp_communicator_t>& comms,
               const std::function<void(thdcp_communicator_t, int)>& body) {
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        THDCP_CHECK_CUDA(cudaSetDevice(0));
        body(comms[r], static_cast<int>(r));
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << " threw: " << e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

// ---- comparisons --------------------------------------------------------------------------

// The global outputs from every rank's rows (thdcp_cp_merge; lse plane by plane), after
// checking with thdcp_cp_local_rows that the ranks' rows together are every global row once.
Outputs merge(const std::vector<Outputs>& local, const test::Batch& b) {
  const int cp = static_cast<int>(local.size());
  const thdcp_layout_t layout = c_layout(b.layout);
  const int64_t rows = b.q.tokens(), per_rank = rows / cp, heads = b.q.heads();
  std::vector<int> held(static_cast<size_t>(rows), 0);
  for (int r = 0; r < cp; ++r) {
    std::vector<int32_t> global_rows(static_cast<size_t>(per_rank), -1);
    EXPECT_C_OK(thdcp_cp_local_rows(&layout, cp, r, global_rows.data(), per_rank));
    for (int32_t g : global_rows) {
      if (g >= 0 && g < rows) ++held[static_cast<size_t>(g)];
    }
  }
  EXPECT_EQ(std::count(held.begin(), held.end(), 1), rows) << "the ranks' rows are not every global row once";

  Outputs global;
  global.out = HostTensor(b.q.dtype(), rows, heads, b.q.head_dim());
  global.dq = HostTensor(b.q.dtype(), rows, heads, b.q.head_dim());
  global.dk = HostTensor(b.k.dtype(), rows, b.k.heads(), b.k.head_dim());
  global.dv = HostTensor(b.k.dtype(), rows, b.k.heads(), b.k.head_dim());
  global.lse.resize(static_cast<size_t>(heads * rows));
  global.max_logit.resize(static_cast<size_t>(heads));
  for (HostTensor* t : {&global.out, &global.dq, &global.dk, &global.dv}) test::poison(*t);
  test::poison(global.lse);
  test::poison(global.max_logit);
  for (int r = 0; r < cp; ++r) {
    const Outputs& l = local[static_cast<size_t>(r)];
    if (l.out.tokens() != per_rank || l.lse.size() != static_cast<size_t>(heads * per_rank)) {
      ADD_FAILURE() << "rank " << r << " returned no outputs";
      continue;
    }
    for (auto [from, to] : {std::make_pair(&l.out, &global.out), std::make_pair(&l.dq, &global.dq),
                            std::make_pair(&l.dk, &global.dk), std::make_pair(&l.dv, &global.dv)}) {
      EXPECT_C_OK(thdcp_cp_merge(from->data(), to->data(), from->row_bytes(), &layout, cp, r));
    }
    for (int64_t h = 0; h < heads; ++h) {
      EXPECT_C_OK(thdcp_cp_merge(l.lse.data() + h * per_rank, global.lse.data() + h * rows, sizeof(float), &layout,
                                 cp, r));
    }
    EXPECT_TRUE(test::same_bits(l.max_logit, local[0].max_logit))
        << "rank " << r << ": max_logit is max-reduced over the group, the same on every rank";
  }
  if (!local.empty() && local[0].max_logit.size() == global.max_logit.size()) global.max_logit = local[0].max_logit;
  return global;
}

// The GPU cases: skipped with the reason without a device; device 0 current.
class CApiCudaTest : public test::CudaTest {
 protected:
  void SetUp() override {
    test::CudaTest::SetUp();
    if (IsSkipped()) return;
    THDCP_CHECK_CUDA(cudaSetDevice(0));
  }
};

// ---- 1. attention on the CUDA backend against the C++ API --------------------------------

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
  const test::Batch b = varlen_batch(s, 7 + static_cast<uint64_t>(s.q_heads * 5 + s.kv_heads + s.head_dim));
  const TestStream stream;
  LayoutOnDevice layout(kCapacity.max_seqs);
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

  c_attention(attention_params(s, kCapacity, c.grad_dtype), layout.c(), via_c, stream.get());
  cpp_attention(s, layout.c(), via_cpp, stream.get());

  const Outputs got = download(via_c, stream.get()), want = download(via_cpp, stream.get());
  EXPECT_TRUE(test::all_written(got));
  EXPECT_TRUE(test::identical(got, want)) << "the C ABI differs from thdcp::cuda";
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

// ---- 2. bad arguments on the CUDA backend --------------------------------------------------

class CApiCudaErrors : public CApiCudaTest {};

template <typename Handle>
Handle untouched_handle() {
  return reinterpret_cast<Handle>(uintptr_t{0x5a5a});  // never dereferenced
}

TEST_F(CApiCudaErrors, AttentionWorkspaceTooSmallOrInHostMemoryIsRefusedNamingIt) {
  const Shape s{};
  const thdcp_attention_params p = attention_params(s, kCapacity, s.dtype);
  size_t bytes = 0;
  ASSERT_C_OK(thdcp_attention_plan_workspace_size(&p, &bytes));
  ASSERT_GT(bytes, 0u);
  const DeviceBuffer workspace(bytes);
  const auto untouched = untouched_handle<thdcp_attention_plan_t>();
  thdcp_attention_plan_t plan = untouched;
  EXPECT_C_STATUS(thdcp_attention_plan_create(&p, workspace.data(), bytes - 1, &plan), THDCP_ERROR_INVALID_ARGUMENT,
                  "thdcp_attention_plan_create: workspace=", "workspace_bytes=" + std::to_string(bytes - 1),
                  "the plan needs " + std::to_string(bytes) + " bytes of device memory");
  EXPECT_EQ(plan, untouched);

  // Host memory of the right size and alignment: the device check names it.
  const size_t rounded = (bytes + 255) / 256 * 256;
  void* host = std::aligned_alloc(256, rounded);
  ASSERT_NE(host, nullptr);
  EXPECT_C_STATUS(thdcp_attention_plan_create(&p, host, bytes, &plan), THDCP_ERROR_INVALID_ARGUMENT,
                  "thdcp_attention_plan_create: ", "workspace points to unregistered host memory");
  EXPECT_EQ(plan, untouched);
  std::free(host);
}

TEST_F(CApiCudaErrors, CpWorkspaceTooSmallIsRefusedNamingIt) {
  thdcp_communicator_t comm = nullptr;
  ASSERT_C_OK(thdcp_communicator_create_shared_gpu_group(1, 0, &comm));
  const thdcp_cp_params p = cp_params(Shape{}, kCapacity, 1);
  size_t bytes = 0;
  ASSERT_C_OK(thdcp_cp_plan_workspace_size(&p, &bytes));
  ASSERT_GT(bytes, 0u);
  const DeviceBuffer workspace(bytes);
  const auto untouched = untouched_handle<thdcp_cp_plan_t>();
  thdcp_cp_plan_t plan = untouched;
  EXPECT_C_STATUS(thdcp_cp_plan_create(comm, &p, workspace.data(), bytes - 1, &plan), THDCP_ERROR_INVALID_ARGUMENT,
                  "thdcp_cp_plan_create: ", "workspace has " + std::to_string(bytes - 1) + " bytes",
                  "cuda_workspace_size gives " + std::to_string(bytes));
  EXPECT_EQ(plan, untouched);
  EXPECT_C_OK(thdcp_communicator_destroy(comm));
}

// q in host memory. It is pinned (cudaMallocHost), which a kernel can read through unified
// addressing: should the library launch anyway, this case fails on its checks instead of
// faulting and leaving a broken CUDA context to the cases after it.
TEST_F(CApiCudaErrors, HostPointerAsQIsRefusedNamingItAndNothingIsWritten) {
  const Shape s{};
  const test::Batch b = varlen_batch(s, 3);
  const TestStream stream;
  LayoutOnDevice layout(kCapacity.max_seqs);
  layout.upload(b.layout, stream.get());
  const StepBuffers buffers(s, b.q.tokens(), s.dtype);
  const StepTensors& t = buffers.tensors();
  upload_inputs(t, b.q, b.k, b.v, b.dout, stream.get());
  fill_outputs(t, stream.get(), 0x5a);
  const Outputs before = download(t, stream.get());

  void* host_q = nullptr;
  ASSERT_EQ(cudaMallocHost(&host_q, bytes_of(t.q)), cudaSuccess);
  std::memcpy(host_q, b.q.data(), bytes_of(t.q));
  thdcp_tensor_t q = t.q;
  q.data = host_q;
  {
    const AttentionPlan plan(attention_params(s, kCapacity, s.dtype));
    const thdcp_layout_t l = layout.c();
    EXPECT_C_STATUS(thdcp_attention_forward(plan.get(), &l, &q, &t.k, &t.v, &t.out, t.lse, t.max_logit, stream.get()),
                    THDCP_ERROR_INVALID_ARGUMENT, "thdcp_attention_forward: ", "q points to", "host memory");
    EXPECT_TRUE(test::identical(download(t, stream.get()), before)) << "the refused call wrote its outputs";
  }
  EXPECT_EQ(cudaFreeHost(host_q), cudaSuccess);
}

// ---- 3. NCCL: a unique id, and a borrowed ncclComm_t -------------------------------------

class CApiCudaNccl : public CApiCudaTest {
 protected:
  void SetUp() override {
    CApiCudaTest::SetUp();
    if (IsSkipped()) return;
    int built = 0;
    ASSERT_C_OK(thdcp_built_with(THDCP_FEATURE_NCCL, &built));
    if (!built) GTEST_SKIP() << "libthdcp was built without NCCL (thdcp_built_with(THDCP_FEATURE_NCCL) gives 0)";
  }
};

const Shape kNcclShape{DType::kFloat16, 8, 2, 128, Mask::window(200, 0)};

// What every NCCL communicator of one rank on device 0 reports.
void expect_one_nccl_rank(thdcp_communicator_t comm) {
  int rank = -1, size = 0, is_device = 0, device = -1;
  const char* kind = nullptr;
  EXPECT_C_OK(thdcp_communicator_rank(comm, &rank));
  EXPECT_C_OK(thdcp_communicator_size(comm, &size));
  EXPECT_C_OK(thdcp_communicator_is_device(comm, &is_device));
  EXPECT_C_OK(thdcp_communicator_device(comm, &device));
  EXPECT_C_OK(thdcp_communicator_kind(comm, &kind));
  EXPECT_EQ(rank, 0);
  EXPECT_EQ(size, 1);
  EXPECT_EQ(is_device, 1);
  EXPECT_EQ(device, 0);
  EXPECT_STREQ(kind, "nccl");
}

TEST_F(CApiCudaNccl, CpOneOverACommunicatorFromAUniqueIdEqualsSingleDeviceAttention) {
  const test::Batch b = varlen_batch(kNcclShape, 21);
  const Outputs reference = single_device(b, kNcclShape);
  unsigned char id[THDCP_NCCL_UNIQUE_ID_BYTES] = {};
  ASSERT_C_OK(thdcp_nccl_unique_id(id, sizeof(id)));
  thdcp_communicator_t comm = nullptr;
  ASSERT_C_OK(thdcp_communicator_create_nccl(id, sizeof(id), /*rank=*/0, /*size=*/1, /*device=*/0, &comm));
  expect_one_nccl_rank(comm);
  const Outputs local = c_cp_rank(comm, b, kNcclShape);
  EXPECT_C_OK(thdcp_communicator_destroy(comm));
  test::expect_gpu_close(merge({local}, b), reference, kNcclShape.dtype);
}

TEST_F(CApiCudaNccl, CpOneOverABorrowedNcclCommEqualsSingleDeviceAttentionAndTheCommStaysTheCallers) {
#if !defined(THDCP_HAVE_NCCL)
  GTEST_SKIP() << "this test was compiled without nccl.h (THDCP_HAVE_NCCL is not defined): it cannot make the "
                  "caller's ncclComm_t";
#else
  const test::Batch b = varlen_batch(kNcclShape, 22);
  const Outputs reference = single_device(b, kNcclShape);
  ncclComm_t raw = nullptr;
  const int devices[1] = {0};
  ASSERT_EQ(ncclCommInitAll(&raw, 1, devices), ncclSuccess);
  thdcp_communicator_t comm = nullptr;
  EXPECT_C_OK(thdcp_communicator_borrow_nccl(raw, 0, &comm));
  Outputs local;
  if (comm != nullptr) {
    expect_one_nccl_rank(comm);
    local = c_cp_rank(comm, b, kNcclShape);
    EXPECT_C_OK(thdcp_communicator_destroy(comm));
  }

  // Still the caller's once thdcp's handle is gone: it all-reduces, then its owner destroys it.
  const TestStream stream;
  DeviceBuffer value(sizeof(float));
  const float three = 3.0f;
  value.upload(&three, sizeof(float), stream.get());
  EXPECT_EQ(ncclAllReduce(value.data(), value.data(), 1, ncclFloat, ncclSum, raw, stream.get()), ncclSuccess);
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream.get()));
  float reduced = 0.0f;
  value.download(&reduced, sizeof(float));
  EXPECT_EQ(reduced, 3.0f);
  EXPECT_EQ(ncclCommDestroy(raw), ncclSuccess);

  test::expect_gpu_close(merge({local}, b), reference, kNcclShape.dtype);
#endif
}

// ---- 4. a shared-GPU group of cp = 2 ranks on threads -------------------------------------

struct CpCase {
  const char* name;
  Shape shape;
};
void PrintTo(const CpCase& c, std::ostream* os) { *os << c.name; }

class CApiCudaSharedGpu : public CApiCudaTest, public ::testing::WithParamInterface<CpCase> {};

TEST_P(CApiCudaSharedGpu, TwoRanksOnThreadsEqualSingleDeviceAttention) {
  const Shape& s = GetParam().shape;
  const int cp = 2;
  const test::Batch b = varlen_batch(s, 31 + static_cast<uint64_t>(s.q_heads + s.head_dim));
  const Outputs reference = single_device(b, s);

  std::vector<thdcp_communicator_t> comms(cp, nullptr);
  ASSERT_C_OK(thdcp_communicator_create_shared_gpu_group(cp, 0, comms.data()));
  for (int r = 0; r < cp; ++r) {
    int rank = -1, device = -1;
    const char* kind = nullptr;
    EXPECT_C_OK(thdcp_communicator_rank(comms[static_cast<size_t>(r)], &rank));
    EXPECT_C_OK(thdcp_communicator_device(comms[static_cast<size_t>(r)], &device));
    EXPECT_C_OK(thdcp_communicator_kind(comms[static_cast<size_t>(r)], &kind));
    EXPECT_EQ(rank, r);
    EXPECT_EQ(device, 0);
    EXPECT_STREQ(kind, "shared-gpu");
  }
  std::vector<Outputs> local(static_cast<size_t>(cp));
  run_ranks(comms, [&](thdcp_communicator_t comm, int rank) {
    local[static_cast<size_t>(rank)] = c_cp_rank(comm, b, s);
  });
  for (thdcp_communicator_t comm : comms) EXPECT_C_OK(thdcp_communicator_destroy(comm));

  test::expect_gpu_close(merge(local, b), reference, s.dtype);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CApiCudaSharedGpu,
    ::testing::Values(CpCase{"causal_gqa2_bf16_d64", Shape{DType::kBFloat16, 4, 2, 64, Mask::causal()}},
                      CpCase{"window_mqa_fp16_d128", Shape{DType::kFloat16, 8, 1, 128, Mask::window(64, 32)}},
                      CpCase{"full_bf16_d128", Shape{DType::kBFloat16, 4, 4, 128, Mask::full()}}),
    [](const ::testing::TestParamInfo<CpCase>& param_info) { return std::string(param_info.param.name); });

// ---- 5. a graph bank ------------------------------------------------------------------------

const char* how_name(thdcp_graph_how_t how) {
  switch (how) {
    case THDCP_GRAPH_WARM_UP: return "warm-up";
    case THDCP_GRAPH_CAPTURED: return "captured";
    case THDCP_GRAPH_REPLAYED: return "replayed";
    case THDCP_GRAPH_FALLBACK: return "fallback";
  }
  return "?";
}

// What the work callback reads: this rank's CP plan and its tensors in the bank's buffers;
// and how often it ran.
struct BankStep {
  thdcp_cp_plan_t plan = nullptr;
  StepTensors tensors;
  int calls = 0;
};

// The work the bank runs, captures and replays: this rank's CP forward and backward on the
// bank's buffers, reading the layout of the batch the bank gives.
thdcp_status_t cp_step_work(const thdcp_static_batch_info* batch, thdcp_stream_t stream, void* user_data) {
  auto* step = static_cast<BankStep*>(user_data);
  ++step->calls;
  const StepTensors& t = step->tensors;
  const thdcp_status_t forward =
      thdcp_cp_forward(step->plan, &batch->layout, &t.q, &t.k, &t.v, &t.out, t.lse, t.max_logit, stream);
  if (forward != THDCP_SUCCESS) return forward;
  return thdcp_cp_backward(step->plan, &batch->layout, &t.q, &t.k, &t.v, &t.out, &t.dout, t.lse, &t.dq, &t.dk, &t.dv,
                           stream);
}

void* bank_buffer(thdcp_graph_bank_t bank, const thdcp_capacity_t& capacity, const char* name, size_t bytes) {
  void* buffer = nullptr;
  EXPECT_C_OK(thdcp_graph_bank_buffer(bank, &capacity, name, bytes, &buffer));
  return buffer;
}

// This rank's tensors as named buffers of the bank (as a model's layers would share them).
StepTensors bank_tensors(thdcp_graph_bank_t bank, const thdcp_capacity_t& capacity, const Shape& s, int64_t rows) {
  const auto tensor = [&](const char* name, int64_t heads) {
    const size_t bytes = static_cast<size_t>(rows * heads * s.head_dim) * dtype_size(s.dtype);
    return c_device_tensor(bank_buffer(bank, capacity, name, bytes), s.dtype, rows, heads, s.head_dim);
  };
  StepTensors t;
  t.q = tensor("q", s.q_heads);
  t.k = tensor("k", s.kv_heads);
  t.v = tensor("v", s.kv_heads);
  t.dout = tensor("dout", s.q_heads);
  t.out = tensor("out", s.q_heads);
  t.dq = tensor("dq", s.q_heads);
  t.dk = tensor("dk", s.kv_heads);
  t.dv = tensor("dv", s.kv_heads);
  t.lse = static_cast<float*>(bank_buffer(bank, capacity, "lse", sizeof(float) * t.lse_count()));
  t.max_logit = static_cast<float*>(bank_buffer(bank, capacity, "max_logit", sizeof(float) * t.max_logit_count()));
  return t;
}

// What one rank saw.
struct BankResult {
  std::vector<Outputs> banked, eager;  // per packing
  std::vector<thdcp_graph_how_t> how;
  std::vector<thdcp_capacity_t> ran_at;
  thdcp_graph_counters_t counters{};
  int work_calls_by_bank = 0;
  size_t device_bytes = 0;
};

// One rank: a bank of one capacity, a CP plan whose workspace is a bank buffer, and every
// packing through the bank and then eagerly (the same callback, called directly with a layout
// of its own from thdcp_capacity_layout), outputs poisoned before each.
void bank_rank(thdcp_communicator_t comm, int rank, const Shape& s, const thdcp_capacity_t& capacity,
               const std::vector<std::vector<int64_t>>& packings, const std::vector<test::Batch>& batches,
               BankResult& result) {
  int cp = 0;
  ASSERT_C_OK(thdcp_communicator_size(comm, &cp));
  const TestStream stream;
  thdcp_graph_bank_t bank = nullptr;
  ASSERT_C_OK(thdcp_graph_bank_create(comm, nullptr, &bank));
  EXPECT_C_OK(thdcp_graph_bank_add_capacity(bank, &capacity));
  BankStep step;
  step.tensors = bank_tensors(bank, capacity, s, capacity.max_tokens / cp);
  const thdcp_cp_params params = cp_params(s, Capacity{capacity.max_seqs, capacity.max_tokens}, cp);
  size_t bytes = 0;
  EXPECT_C_OK(thdcp_cp_plan_workspace_size(&params, &bytes));
  void* workspace = bank_buffer(bank, capacity, "cp workspace", bytes);
  // The bank zeroes new buffers with cudaMemset on the legacy stream, which this rank's
  // non-blocking stream does not wait for: let it finish before the uploads.
  THDCP_CHECK_CUDA(cudaDeviceSynchronize());
  EXPECT_C_OK(thdcp_cp_plan_create(comm, &params, workspace, bytes, &step.plan));

  LayoutOnDevice eager_layout(capacity.max_seqs);
  std::vector<int32_t> cu_seqlens(static_cast<size_t>(capacity.max_seqs + 1)), cu_seqlens_padded(cu_seqlens.size());
  for (size_t i = 0; i < packings.size(); ++i) {
    const std::vector<int64_t>& lengths = packings[i];
    const int64_t documents = static_cast<int64_t>(lengths.size());
    const test::Batch& b = batches[i];
    const thdcp_layout_t host_layout = c_layout(b.layout);
    const HostTensor q = local_rows(b.q, host_layout, cp, rank), k = local_rows(b.k, host_layout, cp, rank),
                     v = local_rows(b.v, host_layout, cp, rank), dout = local_rows(b.dout, host_layout, cp, rank);

    upload_inputs(step.tensors, q, k, v, dout, stream.get());
    fill_outputs(step.tensors, stream.get());
    const int calls = step.calls;
    thdcp_graph_how_t how = THDCP_GRAPH_FALLBACK;
    thdcp_capacity_t ran_at{};
    EXPECT_C_OK(thdcp_graph_bank_run(bank, lengths.data(), documents, nullptr, cp_step_work, &step, stream.get(), &how,
                                     &ran_at));
    result.work_calls_by_bank += step.calls - calls;
    result.how.push_back(how);
    result.ran_at.push_back(ran_at);
    result.banked.push_back(download(step.tensors, stream.get()));

    EXPECT_C_OK(thdcp_capacity_layout(lengths.data(), documents, cp, &capacity, cu_seqlens.data(),
                                      cu_seqlens_padded.data()));
    eager_layout.upload(cu_seqlens.data(), cu_seqlens_padded.data(), stream.get());
    upload_inputs(step.tensors, q, k, v, dout, stream.get());
    fill_outputs(step.tensors, stream.get());
    thdcp_static_batch_info eager{};
    eager.struct_size = sizeof(eager);
    eager.layout = eager_layout.c();
    eager.capacity = capacity;
    eager.cp_size = cp;
    EXPECT_C_OK(cp_step_work(&eager, stream.get(), &step));
    result.eager.push_back(download(step.tensors, stream.get()));
  }
  EXPECT_C_OK(thdcp_graph_bank_counters(bank, &capacity, &result.counters));
  EXPECT_C_OK(thdcp_graph_bank_device_bytes(bank, &result.device_bytes));
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream.get()));
  EXPECT_C_OK(thdcp_cp_plan_destroy(step.plan));
  EXPECT_C_OK(thdcp_graph_bank_destroy(bank));
}

class CApiCudaGraphBank : public CApiCudaTest, public ::testing::WithParamInterface<int> {};

TEST_P(CApiCudaGraphBank, ReplaysOfFourPackingsEqualEagerRunsBitForBit) {
  const int cp = GetParam();
  const Shape s{};
  thdcp_capacity_t capacity{};
  ASSERT_C_OK(thdcp_capacity_default(512, cp, &capacity));
  // Different packings of one capacity: empty and one-token documents, one document filling
  // every row, rows left over for the placeholder.
  const std::vector<std::vector<int64_t>> packings = {
      {130, 0, 77, 1, 200}, {512}, {0, 3, 0, 17, 5, 100, 250}, {64, 64, 64, 64, 64, 64, 64, 60}};
  const Capacity bucket{capacity.max_seqs, capacity.max_tokens};
  std::vector<test::Batch> batches;  // in the capacity form the bank fills (empty documents dropped)
  for (size_t i = 0; i < packings.size(); ++i) {
    batches.push_back(test::make_batch(capacity_layout(packings[i], cp, bucket), s.dtype, s.q_heads, s.kv_heads,
                                       s.head_dim, 40 + i));
  }

  std::vector<thdcp_communicator_t> comms(static_cast<size_t>(cp), nullptr);
  ASSERT_C_OK(thdcp_communicator_create_shared_gpu_group(cp, 0, comms.data()));
  std::vector<BankResult> results(static_cast<size_t>(cp));
  run_ranks(comms, [&](thdcp_communicator_t comm, int rank) {
    bank_rank(comm, rank, s, capacity, packings, batches, results[static_cast<size_t>(rank)]);
  });
  for (thdcp_communicator_t comm : comms) EXPECT_C_OK(thdcp_communicator_destroy(comm));

  const std::vector<thdcp_graph_how_t> expected = {THDCP_GRAPH_WARM_UP, THDCP_GRAPH_CAPTURED, THDCP_GRAPH_REPLAYED,
                                                   THDCP_GRAPH_REPLAYED};
  for (int r = 0; r < cp; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const BankResult& got = results[static_cast<size_t>(r)];
    ASSERT_EQ(got.how.size(), packings.size());
    ASSERT_EQ(got.banked.size(), packings.size());
    ASSERT_EQ(got.eager.size(), packings.size());
    EXPECT_EQ(got.counters.warmups, 1);
    EXPECT_EQ(got.counters.captures, 1);
    EXPECT_EQ(got.counters.replays, 2);
    EXPECT_EQ(got.counters.fallbacks, 0);
    EXPECT_EQ(got.work_calls_by_bank, 2) << "the bank calls the work for the warm-up and the capture, not for replays";
    EXPECT_GT(got.device_bytes, 0u);
    for (size_t i = 0; i < packings.size(); ++i) {
      SCOPED_TRACE("packing " + std::to_string(i) + " (" + how_name(got.how[i]) + ")");
      EXPECT_EQ(got.how[i], expected[i]) << "expected " << how_name(expected[i]);
      EXPECT_EQ(got.ran_at[i].max_tokens, capacity.max_tokens);
      EXPECT_EQ(got.ran_at[i].max_seqs, capacity.max_seqs);
      EXPECT_TRUE(test::all_written(got.banked[i]));
      EXPECT_TRUE(test::identical(got.banked[i], got.eager[i])) << "the bank's run differs from the eager run";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cp, CApiCudaGraphBank, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& param_info) {
                           return "cp" + std::to_string(param_info.param);
                         });

}  // namespace
}  // namespace thdcp
