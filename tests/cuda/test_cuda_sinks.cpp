// Attention sinks on the CUDA backend (issue 27): out, lse, max_logit, dq, dk, dv and dsinks
// against the CPU reference with the same sinks, on both kernel families (the
// portable_kernels prefix runs this binary again with the mma.sync kernels); sinks of -inf
// give the bits of no sinks; dsinks is the same bits every run and under graph replay; bad
// sinks are refused naming them.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "support/cuda/cuda_test.h"
#include "support/cuda/device_step.h"
#include "support/cuda/one_shot.h"
#include "support/expect_error.h"
#include "support/outputs.h"
#include "support/random_batch.h"
#include "thdcp/cpu/attention.h"
#include "thdcp/cuda/attention.h"
#include "thdcp/plan/layout.h"
#include "thdcp/plan/segment_table.h"
#include "thdcp/testing/compare.h"
#include "thdcp/testing/workload.h"

namespace thdcp::test {
namespace {

constexpr float kNoSink = -std::numeric_limits<float>::infinity();

struct SinkCase {
  std::string name;
  std::vector<int64_t> lengths;
  Mask mask;
  int q_heads, kv_heads, head_dim;
  DType dtype;
};

std::ostream& operator<<(std::ostream& os, const SinkCase& c) { return os << c.name; }

// Per-head sinks: N(0, 2^2), with head 0's far above every score (its rows' out shrinks to
// almost 0 and the running max starts at the sink), head 1 without a sink (-inf) and head 2
// far below (no visible effect) where there are that many heads.
std::vector<float> test_sinks(int heads, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> sinks(static_cast<size_t>(heads));
  for (float& s : sinks) s = static_cast<float>(2.0 * rng.normal());
  sinks[0] = 6.0f;
  if (heads > 1) sinks[1] = kNoSink;
  if (heads > 2) sinks[2] = -30.0f;
  return sinks;
}

// What one forward and backward wrote: the outputs' bytes (kOutputNames order) and dsinks.
struct StepResult {
  std::vector<std::vector<unsigned char>> outputs;
  std::vector<float> dsinks;
};

// One batch on the device: metadata, table, tensors, sinks and the plans' workspaces.
struct SinkStep {
  BatchLayout layout;
  Batch batch;
  DeviceBuffer cu_seqlens, cu_seqlens_padded, segments, sinks, dsinks, fwd_ws, bwd_ws;
  DeviceStep tensors;
  cuda::DeviceSegmentTable table;
  cuda::AttentionShape shape;

  SinkStep(const SinkCase& c, uint64_t seed)
      : layout(make_layout(c.lengths, 1)),
        batch(make_batch(layout, c.dtype, c.q_heads, c.kv_heads, c.head_dim, seed)),
        cu_seqlens(sizeof(int32_t) * layout.cu_seqlens.size()),
        cu_seqlens_padded(sizeof(int32_t) * layout.cu_seqlens_padded.size()),
        segments(sizeof(Segment) * c.lengths.size()),
        sinks(sizeof(float) * c.q_heads),
        dsinks(sizeof(float) * c.q_heads),
        tensors(c.dtype, layout.total_rows(), layout.total_rows(), HeadShape{c.q_heads, c.kv_heads, c.head_dim},
                c.dtype) {
    cu_seqlens.upload(layout.cu_seqlens.data(), cu_seqlens.bytes());
    cu_seqlens_padded.upload(layout.cu_seqlens_padded.data(), cu_seqlens_padded.bytes());
    tensors.upload_inputs(batch.q, batch.k, batch.v, batch.dout);
    table = build_segment_table(cu_seqlens.as<int32_t>(), cu_seqlens_padded.as<int32_t>(),
                                static_cast<int>(c.lengths.size()), layout.total_rows(), c.mask,
                                segments.as<Segment>(), nullptr);
    shape = shape_of(table, tensors.q.cview(), tensors.k.cview(), c.dtype, c.dtype);
    fwd_ws = DeviceBuffer(cuda::ForwardPlan::workspace_size(shape));
    bwd_ws = DeviceBuffer(cuda::BackwardPlan::workspace_size(shape));
  }

  // A forward and a backward on `stream` with `host_sinks` (empty: none), outputs poisoned first.
  void enqueue(const std::vector<float>& host_sinks, cudaStream_t stream) {
    const bool with = !host_sinks.empty();
    if (with) sinks.upload(host_sinks.data(), sinks.bytes());
    const cuda::ForwardPlan forward(shape, {}, fwd_ws.data(), fwd_ws.bytes());
    const cuda::BackwardPlan backward(shape, {}, bwd_ws.data(), bwd_ws.bytes());
    ForwardTensors f = tensors.forward_tensors();
    BackwardTensors b = tensors.backward_tensors();
    if (with) {
      f.sinks = b.sinks = sinks.as<float>();
      b.dsinks = dsinks.as<float>();
    }
    forward.run(table, f, stream);
    backward.run(table, b, stream);
  }

  StepResult run(const std::vector<float>& host_sinks) {
    tensors.poison_outputs();
    dsinks.poison();
    enqueue(host_sinks, nullptr);
    THDCP_CHECK_CUDA(cudaDeviceSynchronize());
    return {tensors.output_bytes(), download_vector<float>(dsinks, sinks.bytes() / sizeof(float))};
  }
};

// The CPU reference (fp32 arithmetic) of the same call: outputs in the storage dtype, dsinks.
struct Reference {
  Outputs outputs;
  std::vector<float> dsinks;
};

Reference cpu_reference_with_sinks(const SinkStep& step, const Mask& mask, const std::vector<float>& sinks) {
  const Batch& b = step.batch;
  const SegmentTable table = build_segment_table(step.layout.view(), mask);
  Reference r{outputs_for(b, b.q.tokens(), b.q.dtype(), b.q.dtype()), std::vector<float>(sinks.size(), NAN)};
  AttentionOptions options;
  options.num_threads = 8;
  ForwardTensors f{b.q.view(), b.k.view(), b.v.view(), r.outputs.out.view(), r.outputs.lse.data(),
                   r.outputs.max_logit.data(), sinks.empty() ? nullptr : sinks.data()};
  cpu::attention_forward(table, f, options);
  BackwardTensors g{b.q.view(), b.k.view(), b.v.view(), r.outputs.out.view(), b.dout.view(), r.outputs.lse.data(),
                    r.outputs.dq.view(), r.outputs.dk.view(), r.outputs.dv.view()};
  if (!sinks.empty()) {
    g.sinks = sinks.data();
    g.dsinks = r.dsinks.data();
  }
  cpu::attention_backward(table, g, options);
  return r;
}

class CudaSinks : public CudaTest, public ::testing::WithParamInterface<SinkCase> {};

TEST_P(CudaSinks, MatchTheCpuReference) {
  const SinkCase& c = GetParam();
  SinkStep step(c, 7);
  const std::vector<float> sinks = test_sinks(c.q_heads, 11);
  const Reference want = cpu_reference_with_sinks(step, c.mask, sinks);
  step.run(sinks);
  const Outputs got = step.tensors.download_outputs();
  const Tolerance out_tol = derive_tensor_core_tolerance(c.dtype, 1), grad_tol = derive_tensor_core_tolerance(c.dtype, 2);
  EXPECT_TRUE(matches("out", got.out, want.outputs.out, out_tol));
  EXPECT_TRUE(matches("lse", got.lse, want.outputs.lse, tensor_core_fp32_tolerance()));
  EXPECT_TRUE(matches("max_logit", got.max_logit, want.outputs.max_logit, tensor_core_fp32_tolerance()));
  EXPECT_TRUE(matches("dq", got.dq, want.outputs.dq, grad_tol));
  EXPECT_TRUE(matches("dk", got.dk, want.outputs.dk, grad_tol));
  EXPECT_TRUE(matches("dv", got.dv, want.outputs.dv, grad_tol));
  const std::vector<float> dsinks = download_vector<float>(step.dsinks, sinks.size());
  EXPECT_TRUE(matches("dsinks", dsinks, want.dsinks,
                      sink_gradient_tolerance(want.outputs.out, step.batch.dout, want.outputs.lse, sinks, want.dsinks)));
  EXPECT_EQ(dsinks[1], 0.0f) << "head 1 has no sink (-inf): no gradient";
  EXPECT_NE(dsinks[0], 0.0f) << "head 0's sink dominates its rows: a gradient";

  // The sinks matter: without them head 0's out is far from what it is with them.
  const Reference plain = cpu_reference_with_sinks(step, c.mask, {});
  EXPECT_FALSE(matches("out without sinks", got.out, plain.outputs.out, out_tol));
}

// Sinks of -inf are no sinks: the bits of a call without sinks, and dsinks 0.
TEST_P(CudaSinks, MinusInfinitySinksGiveTheBitsOfNoSinks) {
  const SinkCase& c = GetParam();
  SinkStep step(c, 13);
  const StepResult with = step.run(std::vector<float>(static_cast<size_t>(c.q_heads), kNoSink));
  const StepResult without = step.run({});
  for (size_t i = 0; i < with.outputs.size(); ++i) EXPECT_TRUE(with.outputs[i] == without.outputs[i]) << kOutputNames[i];
  for (float d : with.dsinks) EXPECT_EQ(d, 0.0f);
}

// The same bits every run, and under graph replay (the forward and backward captured with
// their sinks on a stream of their own, the outputs poisoned before the replay).
TEST_P(CudaSinks, SameBitsEveryRunAndUnderReplay) {
  const SinkCase& c = GetParam();
  SinkStep step(c, 17);
  const std::vector<float> sinks = test_sinks(c.q_heads, 19);
  const StepResult first = step.run(sinks), second = step.run(sinks);
  EXPECT_TRUE(first.outputs == second.outputs) << "two eager runs differ";
  EXPECT_TRUE(first.dsinks == second.dsinks) << "dsinks differs between two runs";

  Stream stream;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  THDCP_CHECK_CUDA(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal));
  step.enqueue(sinks, stream.get());
  THDCP_CHECK_CUDA(cudaStreamEndCapture(stream.get(), &graph));
  THDCP_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  step.tensors.poison_outputs(stream.get());
  step.dsinks.poison();
  THDCP_CHECK_CUDA(cudaGraphLaunch(exec, stream.get()));
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream.get()));
  EXPECT_TRUE(step.tensors.output_bytes() == first.outputs) << "replay differs from eager";
  EXPECT_TRUE(download_vector<float>(step.dsinks, sinks.size()) == first.dsinks) << "replayed dsinks differs";
  THDCP_CHECK_CUDA(cudaGraphExecDestroy(exec));
  THDCP_CHECK_CUDA(cudaGraphDestroy(graph));
}

std::vector<SinkCase> sink_cases() {
  const DType bf16 = DType::kBFloat16, fp16 = DType::kFloat16;
  return {
      {"causal_gqa4_bf16_d128", {0, 1, 300, 77, 1000}, Mask::causal(), 8, 2, 128, bf16},
      {"full_fp16_d64", {5, 0, 130, 64}, Mask::full(), 4, 4, 64, fp16},
      {"window16_0_gqa8_bf16_d64", {1, 250, 513}, Mask::window(16, 0), 8, 1, 64, bf16},
      {"window64_200_fp16_d128", {300, 1, 401}, Mask::window(64, 200), 4, 4, 128, fp16},
      // Hopper's one-pass backward (head dim 128, a left window of 4096 keys or more).
      {"window4096_0_bf16_d128", {4500, 70}, Mask::window(4096, 0), 4, 1, 128, bf16},
  };
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaSinks, ::testing::ValuesIn(sink_cases()),
                         [](const ::testing::TestParamInfo<SinkCase>& case_info) { return case_info.param.name; });

class CudaSinkChecks : public CudaTest {};

// Sinks in host memory and dsinks without sinks are refused before anything is enqueued.
TEST_F(CudaSinkChecks, HostSinksAndDsinksWithoutSinksAreRefused) {
  SinkStep step({"checks", {40, 9}, Mask::causal(), 4, 2, 64, DType::kBFloat16}, 23);
  const cuda::ForwardPlan forward(step.shape, {}, step.fwd_ws.data(), step.fwd_ws.bytes());
  const cuda::BackwardPlan backward(step.shape, {}, step.bwd_ws.data(), step.bwd_ws.bytes());
  std::vector<float> host(4, 0.5f);
  ForwardTensors f = step.tensors.forward_tensors();
  f.sinks = host.data();
  expect_error([&] { forward.check_tensors(f); }, {"sinks points to"});
  BackwardTensors b = step.tensors.backward_tensors();
  b.dsinks = step.dsinks.as<float>();
  expect_error([&] { backward.run(step.table, b, nullptr); }, {"dsinks is set but sinks is null"});
  b.sinks = step.sinks.as<float>();
  b.dsinks = host.data();
  expect_error([&] { backward.check_tensors(b); }, {"dsinks points to"});
}


}  // namespace
}  // namespace thdcp::test
