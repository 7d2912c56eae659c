#include "support/capi/capi_cuda.h"

#include <algorithm>
#include <exception>
#include <thread>
#include <utility>

#include "support/cuda/one_shot.h"
#include "thdcp/cuda/attention.h"

namespace thdcp::test {

Batch varlen_batch(const Shape& s, uint64_t seed) {
  return make_batch(make_layout({301, 0, 1, 37, 513, 64, 90}, 2, kVarlenCapacity), s, seed);
}

thdcp_attention_params cuda_attention_params(const Shape& s, const Capacity& capacity, DType grad_dtype) {
  thdcp_attention_params p;
  thdcp_attention_params_init(&p);
  p.backend = THDCP_BACKEND_CUDA;
  set_shape(p, s, capacity);
  p.dq_dtype = p.dkv_dtype = c_dtype(grad_dtype);
  return p;
}

thdcp_cp_params cuda_cp_params(const Shape& s, const Capacity& capacity, int cp) {
  thdcp_cp_params p;
  thdcp_cp_params_init(&p);
  p.backend = THDCP_BACKEND_CUDA;
  p.cp_size = cp;
  set_shape(p, s, capacity);
  return p;
}

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

ThdTensor cpp_view(const thdcp_tensor_t& t) {
  return ThdTensor{t.data, dtype_of(t.dtype), t.rows, t.heads, t.head_dim};
}

StepTensors step_tensors(const Shape& s, int64_t rows, DType grad_dtype,
                         const std::function<void*(const char* name, size_t bytes)>& allocate) {
  const auto tensor = [&](const char* name, DType dtype, int64_t heads) {
    const size_t bytes = static_cast<size_t>(rows * heads * s.head_dim) * dtype_size(dtype);
    return c_device_tensor(allocate(name, bytes), dtype, rows, heads, s.head_dim);
  };
  StepTensors t;
  t.q = tensor("q", s.dtype, s.q_heads);
  t.k = tensor("k", s.dtype, s.kv_heads);
  t.v = tensor("v", s.dtype, s.kv_heads);
  t.dout = tensor("dout", s.dtype, s.q_heads);
  t.out = tensor("out", s.dtype, s.q_heads);
  t.dq = tensor("dq", grad_dtype, s.q_heads);
  t.dk = tensor("dk", grad_dtype, s.kv_heads);
  t.dv = tensor("dv", grad_dtype, s.kv_heads);
  t.lse = static_cast<float*>(allocate("lse", sizeof(float) * t.lse_count()));
  t.max_logit = static_cast<float*>(allocate("max_logit", sizeof(float) * t.max_logit_count()));
  return t;
}

StepBuffers::StepBuffers(const Shape& s, int64_t rows, DType grad_dtype)
    : t_(step_tensors(s, rows, grad_dtype, [this](const char*, size_t bytes) {
        buffers_.emplace_back(bytes);
        return buffers_.back().data();
      })) {}

void upload_inputs(const StepTensors& t, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                   const HostTensor& dout, cudaStream_t stream) {
  for (auto [to, from] :
       {std::make_pair(&t.q, &q), std::make_pair(&t.k, &k), std::make_pair(&t.v, &v), std::make_pair(&t.dout, &dout)}) {
    THDCP_CHECK(bytes_of(*to) == static_cast<size_t>(from->numel()) * dtype_size(from->dtype()),
                "test: a host input does not have the shape of its device tensor");
    THDCP_CHECK_CUDA(cudaMemcpyAsync(to->data, from->data(), bytes_of(*to), cudaMemcpyHostToDevice, stream));
  }
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
}

void fill_outputs(const StepTensors& t, cudaStream_t stream, int byte) {
  for (const thdcp_tensor_t* o : {&t.out, &t.dq, &t.dk, &t.dv}) {
    THDCP_CHECK_CUDA(cudaMemsetAsync(o->data, byte, bytes_of(*o), stream));
  }
  THDCP_CHECK_CUDA(cudaMemsetAsync(t.lse, byte, sizeof(float) * t.lse_count(), stream));
  THDCP_CHECK_CUDA(cudaMemsetAsync(t.max_logit, byte, sizeof(float) * t.max_logit_count(), stream));
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
}

Outputs download_outputs(const StepTensors& t, cudaStream_t stream) {
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

LayoutOnDevice::LayoutOnDevice(int max_seqs)
    : num_seqs_(max_seqs),
      cu_seqlens_(sizeof(int32_t) * static_cast<size_t>(max_seqs + 1)),
      cu_seqlens_padded_(sizeof(int32_t) * static_cast<size_t>(max_seqs + 1)) {}

void LayoutOnDevice::upload(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded, cudaStream_t stream) {
  cu_seqlens_.upload(cu_seqlens, cu_seqlens_.bytes(), stream);
  cu_seqlens_padded_.upload(cu_seqlens_padded, cu_seqlens_padded_.bytes(), stream);
}

void LayoutOnDevice::upload(const BatchLayout& layout, cudaStream_t stream) {
  THDCP_CHECK(layout.num_seqs() == num_seqs_, "test: the layout is not in this capacity form");
  upload(layout.cu_seqlens.data(), layout.cu_seqlens_padded.data(), stream);
}

thdcp_layout_t LayoutOnDevice::c() const {
  return thdcp_layout_t{cu_seqlens_.as<int32_t>(), cu_seqlens_padded_.as<int32_t>(), num_seqs_};
}

AttentionPlan::AttentionPlan(const thdcp_attention_params& params) {
  size_t bytes = 0;
  EXPECT_C_OK(thdcp_attention_plan_workspace_size(&params, &bytes));
  workspace_ = DeviceBuffer(bytes);
  EXPECT_C_OK(thdcp_attention_plan_create(&params, workspace_.data(), bytes, &plan_));
}

AttentionPlan::~AttentionPlan() { EXPECT_C_OK(thdcp_attention_plan_destroy(plan_)); }

void c_attention(const thdcp_attention_params& params, const thdcp_layout_t& layout, const StepTensors& t,
                 cudaStream_t stream) {
  const AttentionPlan plan(params);
  ASSERT_NE(plan.get(), nullptr);
  EXPECT_C_OK(thdcp_attention_forward(plan.get(), &layout, &t.q, &t.k, &t.v, &t.out, t.lse, t.max_logit, stream));
  EXPECT_C_OK(thdcp_attention_backward(plan.get(), &layout, &t.q, &t.k, &t.v, &t.out, &t.dout, t.lse, &t.dq, &t.dk,
                                       &t.dv, stream));
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
}

void cpp_attention(const Shape& s, const thdcp_layout_t& layout, const StepTensors& t, cudaStream_t stream) {
  const int entries = table_entries(cuda::TableKind::kSingleDevice, layout.num_seqs);
  const DeviceBuffer segments(sizeof(Segment) * static_cast<size_t>(entries));
  const cuda::DeviceSegmentTable table = build_segment_table(
      layout.cu_seqlens, layout.cu_seqlens_padded, layout.num_seqs, t.q.rows, s.mask, segments.as<Segment>(), stream);
  const DeviceBuffer forward(forward_workspace_size(table));
  const DeviceBuffer backward(backward_workspace_size(table, s.q_heads, s.kv_heads, s.head_dim, dtype_of(t.dk.dtype)));
  attention_forward(table, cpp_view(t.q), cpp_view(t.k), cpp_view(t.v), cpp_view(t.out), t.lse, t.max_logit,
                    forward.data(), forward.bytes(), stream);
  attention_backward(table, cpp_view(t.q), cpp_view(t.k), cpp_view(t.v), cpp_view(t.out), cpp_view(t.dout), t.lse,
                     cpp_view(t.dq), cpp_view(t.dk), cpp_view(t.dv), backward.data(), backward.bytes(), stream);
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
}

Outputs c_single_device(const Batch& b, const Shape& s) {
  const Stream stream;
  LayoutOnDevice layout(kVarlenCapacity.max_seqs);
  layout.upload(b.layout, stream.get());
  const StepBuffers buffers(s, b.q.tokens(), s.dtype);
  upload_inputs(buffers.tensors(), b.q, b.k, b.v, b.dout, stream.get());
  fill_outputs(buffers.tensors(), stream.get());
  c_attention(cuda_attention_params(s, kVarlenCapacity, s.dtype), layout.c(), buffers.tensors(), stream.get());
  return download_outputs(buffers.tensors(), stream.get());
}

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

Outputs c_cp_rank(thdcp_communicator_t comm, const Batch& b, const Shape& s,
                  const std::function<void(thdcp_cp_params&)>& mode) {
  int rank = -1, cp = 0;
  EXPECT_C_OK(thdcp_communicator_rank(comm, &rank));
  EXPECT_C_OK(thdcp_communicator_size(comm, &cp));
  if (rank < 0 || cp < 1) return Outputs{};
  const thdcp_layout_t host_layout = c_layout(b.layout);
  const Stream stream;
  LayoutOnDevice layout(kVarlenCapacity.max_seqs);
  layout.upload(b.layout, stream.get());
  const StepBuffers buffers(s, b.q.tokens() / cp, s.dtype);
  upload_inputs(buffers.tensors(), c_local_rows(b.q, host_layout, cp, rank), c_local_rows(b.k, host_layout, cp, rank),
                c_local_rows(b.v, host_layout, cp, rank), c_local_rows(b.dout, host_layout, cp, rank), stream.get());
  fill_outputs(buffers.tensors(), stream.get());
  thdcp_cp_params params = cuda_cp_params(s, kVarlenCapacity, cp);
  if (mode) mode(params);
  c_cp_step(comm, params, layout.c(), buffers.tensors(), stream.get());
  return download_outputs(buffers.tensors(), stream.get());
}

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

Outputs c_merge_ranks(const std::vector<Outputs>& local, const Batch& b) {
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

  Outputs global = poisoned_outputs(b, rows, b.q.dtype(), b.k.dtype());
  for (int r = 0; r < cp; ++r) {
    const Outputs& l = local[static_cast<size_t>(r)];
    if (l.out.tokens() != per_rank || l.lse.size() != static_cast<size_t>(heads * per_rank)) {
      ADD_FAILURE() << "rank " << r << " returned no outputs";
      continue;
    }
    c_merge_rows(l, global, layout, cp, r);
    EXPECT_TRUE(same_bits(l.max_logit, local[0].max_logit))
        << "rank " << r << ": max_logit is max-reduced over the group, the same on every rank";
  }
  if (!local.empty() && local[0].max_logit.size() == global.max_logit.size()) global.max_logit = local[0].max_logit;
  return global;
}

void CApiCudaTest::SetUp() {
  CudaTest::SetUp();
  if (IsSkipped()) return;
  THDCP_CHECK_CUDA(cudaSetDevice(0));
}

}  // namespace thdcp::test
