// CUDA-graph capture, determinism and argument checks of the CUDA backend.
#include <cmath>
#include <cstring>
#include <vector>

#include "support/cuda/cuda_test.h"
#include "support/cuda/device_step.h"
#include "support/cuda/one_shot.h"
#include "thdcp/cuda/attention.h"
#include "thdcp/core/error.h"
#include "thdcp/plan/layout.h"
#include "thdcp/testing/workload.h"

namespace thdcp::test {
namespace {

// Static buffers of one capacity, shared by the captured graph and the eager calls.
struct Step {
  static constexpr int kQHeads = 4;
  static constexpr int kKvHeads = 2;
  static constexpr int kHeadDim = 64;
  static constexpr DType kDtype = DType::kBFloat16;

  Capacity capacity;
  Mask mask;
  int cp;
  int rank;
  cuda::TableKind kind;
  int64_t q_rows, k_rows;
  DeviceBuffer cu_seqlens, cu_seqlens_padded, segments;
  DeviceStep tensors;
  DeviceBuffer fwd_ws, bwd_ws;
  cuda::DeviceSegmentTable table;

  Step(Capacity capacity_, Mask mask_, int cp_, int rank_, DType grad_dtype)
      : capacity(capacity_), mask(mask_), cp(cp_), rank(rank_),
        kind(cp_ == 0 ? cuda::TableKind::kSingleDevice : cuda::TableKind::kAllGatherCp),
        q_rows(capacity_.max_tokens / (cp_ == 0 ? 1 : cp_)), k_rows(capacity_.max_tokens),
        cu_seqlens(sizeof(int32_t) * (capacity_.max_seqs + 1)),
        cu_seqlens_padded(sizeof(int32_t) * (capacity_.max_seqs + 1)),
        segments(sizeof(Segment) * table_entries(kind, capacity_.max_seqs)),
        tensors(kDtype, q_rows, k_rows, HeadShape{kQHeads, kKvHeads, kHeadDim}, grad_dtype) {
    table.segments = segments.as<Segment>();
    table.capacity = table_entries(kind, capacity.max_seqs);
    table.q_rows = q_rows;
    table.k_rows = k_rows;
    table.mask = mask;
    table.kind = kind;
    fwd_ws = DeviceBuffer(forward_workspace_size(table));
    bwd_ws = DeviceBuffer(backward_workspace_size(table, kQHeads, kKvHeads, kHeadDim, grad_dtype));
  }

  // Copies a new batch into the static buffers (outside any graph).
  void load(const std::vector<int64_t>& lengths, uint64_t seed) {
    const BatchLayout layout = make_layout(lengths, cp == 0 ? 1 : cp, capacity);
    cu_seqlens.upload(layout.cu_seqlens.data(), cu_seqlens.bytes());
    cu_seqlens_padded.upload(layout.cu_seqlens_padded.data(), cu_seqlens_padded.bytes());
    tensors.fill_inputs(seed);
  }

  void poison_outputs() {
    tensors.poison_outputs();
    // cudaMemset may return before it completes, and the graph runs on a non-blocking stream.
    THDCP_CHECK_CUDA(cudaDeviceSynchronize());
  }

  // The whole step: table build, forward, backward. Only enqueues.
  void enqueue(cudaStream_t stream) {
    if (cp == 0) {
      build_segment_table(cu_seqlens.as<int32_t>(), cu_seqlens_padded.as<int32_t>(), capacity.max_seqs,
                          capacity.max_tokens, mask, segments.as<Segment>(), stream);
    } else {
      build_cp_segment_table(cu_seqlens.as<int32_t>(), cu_seqlens_padded.as<int32_t>(), capacity.max_seqs,
                             capacity.max_tokens, cp, rank, mask, segments.as<Segment>(), stream);
    }
    attention_step(table, tensors, fwd_ws, bwd_ws, stream);
  }
};

bool has_nan(const std::vector<unsigned char>& bytes, DType dtype) {
  const size_t n = bytes.size() / dtype_size(dtype);
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(load_as_float(bytes.data(), dtype, i))) return true;
  }
  return false;
}

void expect_no_nan(const std::vector<std::vector<unsigned char>>& r, DType grad_dtype) {
  const DType dtypes[] = {Step::kDtype, DType::kFloat32, DType::kFloat32, grad_dtype, grad_dtype, grad_dtype};
  for (size_t i = 0; i < r.size(); ++i) EXPECT_FALSE(has_nan(r[i], dtypes[i])) << kOutputNames[i] << " holds NaN";
}

class CudaGraph : public CudaTest {};

// Forward and backward (with the device table build) captured once, replayed on a new batch
// of the same capacity: equal, bit for bit, to the same calls run eagerly on that batch.
TEST_F(CudaGraph, ReplayOnNewBatchEqualsEager) {
  for (int cp : {0, 2}) {
    SCOPED_TRACE(cp == 0 ? "single-device table" : "cp=2 rank 1 table");
    const DType grad_dtype = cp == 0 ? DType::kBFloat16 : DType::kFloat32;
    Step step(Capacity{8, 1024}, Mask::window(100, 0), cp, cp == 0 ? 0 : 1, grad_dtype);
    cudaStream_t stream = nullptr;
    THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    step.load({100, 7, 300}, 11);
    cudaGraph_t graph = nullptr;
    THDCP_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    step.enqueue(stream);
    THDCP_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec = nullptr;
    THDCP_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));

    // A different batch: other lengths and count, same capacity.
    const std::vector<int64_t> lengths = {1, 513, 0, 64, 250, 33};
    step.load(lengths, 99);
    step.poison_outputs();
    THDCP_CHECK_CUDA(cudaGraphLaunch(exec, stream));
    THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
    const auto replayed = step.tensors.output_bytes();

    step.poison_outputs();
    step.enqueue(stream);
    THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
    const auto eager = step.tensors.output_bytes();

    expect_no_nan(replayed, grad_dtype);
    for (size_t i = 0; i < eager.size(); ++i) {
      EXPECT_TRUE(replayed[i] == eager[i]) << kOutputNames[i] << " of the replay differs from the eager run";
    }
    THDCP_CHECK_CUDA(cudaGraphExecDestroy(exec));
    THDCP_CHECK_CUDA(cudaGraphDestroy(graph));
    THDCP_CHECK_CUDA(cudaStreamDestroy(stream));
  }
}

class CudaDeterminism : public CudaTest {};

// Same inputs, same bits, for a CP table (two segments share every key row) and GQA.
TEST_F(CudaDeterminism, BackwardGivesSameBitsEveryRun) {
  for (DType grad_dtype : {DType::kFloat32, DType::kBFloat16}) {
    Step step(Capacity{6, 2048}, Mask::causal(), 2, 0, grad_dtype);
    step.load({700, 3, 511, 90}, 5);
    step.enqueue(nullptr);
    THDCP_CHECK_CUDA(cudaDeviceSynchronize());
    const auto first = step.tensors.output_bytes();
    expect_no_nan(first, grad_dtype);
    for (int run = 0; run < 3; ++run) {
      step.poison_outputs();
      step.enqueue(nullptr);
      THDCP_CHECK_CUDA(cudaDeviceSynchronize());
      const auto again = step.tensors.output_bytes();
      for (size_t i = 0; i < first.size(); ++i) {
        EXPECT_TRUE(again[i] == first[i]) << kOutputNames[i] << " differs on run " << run + 2;
      }
    }
  }
}

class CudaBadInput : public CudaTest {};

TEST_F(CudaBadInput, ThrowsBeforeLaunch) {
  Step step(Capacity{4, 256}, Mask::causal(), 0, 0, DType::kBFloat16);
  step.load({100, 50}, 3);
  DeviceStep& tensors = step.tensors;
  build_segment_table(step.cu_seqlens.as<int32_t>(), step.cu_seqlens_padded.as<int32_t>(), 4, 256, Mask::causal(),
                      step.segments.as<Segment>(), nullptr);
  auto forward = [&](ConstThdTensor q, ConstThdTensor k, ConstThdTensor v, ThdTensor out, size_t ws_bytes) {
    attention_forward(step.table, q, k, v, out, tensors.lse.as<float>(), nullptr, step.fwd_ws.data(), ws_bytes,
                      nullptr);
  };
  const size_t ws = step.fwd_ws.bytes();
  ThdTensor out = tensors.out.view();
  // Sanity: the good call does not throw (so the throws below are about the one change).
  EXPECT_NO_THROW(forward(tensors.q.cview(), tensors.k.cview(), tensors.v.cview(), out, ws));

  ConstThdTensor wrong_rows = tensors.q.cview();
  wrong_rows.tokens -= 2;
  EXPECT_THROW(forward(wrong_rows, tensors.k.cview(), tensors.v.cview(), out, ws), Error);

  ConstThdTensor fp32_q = tensors.q.cview();
  fp32_q.dtype = DType::kFloat32;
  EXPECT_THROW(forward(fp32_q, tensors.k.cview(), tensors.v.cview(), out, ws), Error);

  // A head dim the kernels are not compiled for.
  DeviceTensor q160(DType::kBFloat16, step.q_rows, 4, 160), k160(DType::kBFloat16, step.k_rows, 2, 160);
  DeviceTensor out160(DType::kBFloat16, step.q_rows, 4, 160);
  EXPECT_THROW(forward(q160.cview(), k160.cview(), k160.cview(), out160.view(), ws), Error);

  DeviceTensor k3(DType::kBFloat16, step.k_rows, 3, 64);
  EXPECT_THROW(forward(tensors.q.cview(), k3.cview(), k3.cview(), out, ws), Error);  // 4 % 3 != 0

  std::vector<uint16_t> host_q(static_cast<size_t>(tensors.q.tokens * tensors.q.heads * tensors.q.head_dim));
  ConstThdTensor on_host = tensors.q.cview();
  on_host.data = host_q.data();
  EXPECT_THROW(forward(on_host, tensors.k.cview(), tensors.v.cview(), out, ws), Error);

  DeviceBuffer shifted(tensors.q.bytes() + 16);
  ConstThdTensor misaligned = tensors.q.cview();
  misaligned.data = static_cast<const char*>(shifted.data()) + 2;
  EXPECT_THROW(forward(misaligned, tensors.k.cview(), tensors.v.cview(), out, ws), Error);

  EXPECT_THROW(forward(tensors.q.cview(), tensors.k.cview(), tensors.v.cview(), out, ws - 1), Error);

  // Backward: dk and dv of different dtypes, and a workspace sized for fp32 dk/dv while the
  // call stores them in bf16 (which needs the accumulators).
  DeviceTensor dv32(DType::kFloat32, step.k_rows, 2, 64);
  EXPECT_THROW(attention_backward(step.table, tensors.q.cview(), tensors.k.cview(), tensors.v.cview(),
                                  tensors.out.cview(), tensors.dout.cview(), tensors.lse.as<float>(), tensors.dq.view(),
                                  tensors.dk.view(), dv32.view(), step.bwd_ws.data(), step.bwd_ws.bytes(), nullptr),
               Error);
  const size_t fp32_ws = backward_workspace_size(step.table, 4, 2, 64, DType::kFloat32);
  EXPECT_THROW(attention_backward(step.table, tensors.q.cview(), tensors.k.cview(), tensors.v.cview(),
                                  tensors.out.cview(), tensors.dout.cview(), tensors.lse.as<float>(), tensors.dq.view(),
                                  tensors.dk.view(), tensors.dv.view(), step.bwd_ws.data(), fp32_ws, nullptr),
               Error);

  // Table builders: rank out of range, total rows not aligned to 2*cp.
  EXPECT_THROW(build_cp_segment_table(step.cu_seqlens.as<int32_t>(), step.cu_seqlens_padded.as<int32_t>(), 4, 256, 2, 2,
                                      Mask::causal(), step.segments.as<Segment>(), nullptr),
               Error);
  EXPECT_THROW(build_cp_segment_table(step.cu_seqlens.as<int32_t>(), step.cu_seqlens_padded.as<int32_t>(), 4, 254, 2, 0,
                                      Mask::causal(), step.segments.as<Segment>(), nullptr),
               Error);
  THDCP_CHECK_CUDA(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace thdcp::test
