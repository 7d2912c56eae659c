// The CUDA backend at every (D_qk, D_v) head-dim pair it serves (issue 27: D_qk = D_v in
// {64, 96, 128, 192, 256} and MLA's D_qk 192 with D_v 128), through cuda::Attention, the
// single-device front door. On an edge-case table (lengths 0 and 1 and not multiples of 4,
// one sequence filling the capacity, exactly max_seqs - 1 sequences, full, causal and
// sliding windows, one wider than every sequence, GQA 1/2/4/8, bf16 and fp16, with and
// without sinks): out, lse, max_logit, dq, dk, dv and dsinks against the CPU reference, with
// the deterministic backward (twice: the same bits) and with deterministic = false. The
// backend plans every pair with the kernels it picks itself (THDCP_PORTABLE_KERNELS is not
// needed). Forward and backward captured in a CUDA graph and replayed on another batch of the
// same capacity give the eager bits. An unsupported pair is refused at plan time naming its
// values and the supported set; a v (or dv) tensor of another head dim than v_head_dim is
// refused naming v_head_dim, with nothing written.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "support/cp/cuda_cp_cases.h"
#include "support/cuda/cuda_test.h"
#include "support/cuda/device_step.h"
#include "support/cuda/head_dims.h"
#include "support/expect_error.h"
#include "support/gpu_tolerance.h"
#include "thdcp/cuda/attention.h"
#include "thdcp/cuda/table.h"

namespace thdcp::test {
namespace {

// The single-device problem of an edge case (its capacity at cp = 1), dq/dk/dv in its dtype.
AttentionProblem problem_for(const EdgeCase& c) {
  AttentionProblem p;
  static_cast<HeadShape&>(p) = c.shape().heads();
  p.capacity = capacity_of(c, 1);
  p.mask = c.mask;
  p.dtype = p.dq_dtype = p.dkv_dtype = c.dtype;
  return p;
}

AttentionOptions any_order() {
  AttentionOptions options;
  options.deterministic = false;
  return options;
}

// What one forward and backward wrote: the outputs and dsinks (empty without sinks).
struct StepResult {
  Outputs outputs;
  std::vector<float> dsinks;
};

// Static device buffers of one capacity for cuda::Attention (metadata, tensors, sinks, dsinks,
// one workspace for both backward settings) and a stream of their own, on which every copy,
// call and replay runs.
class DimStep {
 public:
  explicit DimStep(const AttentionProblem& problem)
      : tensors(problem.dtype, problem.capacity.max_tokens, problem.capacity.max_tokens, problem.heads(),
                problem.dtype),
        problem_(problem),
        cu_seqlens_(sizeof(int32_t) * static_cast<size_t>(problem.capacity.max_seqs + 1)),
        cu_seqlens_padded_(cu_seqlens_.bytes()),
        sinks_(sizeof(float) * static_cast<size_t>(problem.q_heads)),
        dsinks_(sinks_.bytes()),
        workspace_(std::max(cuda::Attention::workspace_size(problem),
                            cuda::Attention::workspace_size(problem, any_order()))) {}

  DeviceStep tensors;

  const AttentionProblem& problem() const { return problem_; }
  cudaStream_t stream() const { return stream_.get(); }
  DeviceLayout layout() const {
    return DeviceLayout{cu_seqlens_.as<int32_t>(), cu_seqlens_padded_.as<int32_t>(), problem_.capacity};
  }

  // Copies a batch (in the capacity's form) and its sinks (empty: none) in and poisons the
  // outputs; complete on return, never during a capture.
  void load(const Batch& b, const std::vector<float>& sinks) {
    const cudaStream_t s = stream();
    cu_seqlens_.upload(b.layout.cu_seqlens.data(), cu_seqlens_.bytes(), s);
    cu_seqlens_padded_.upload(b.layout.cu_seqlens_padded.data(), cu_seqlens_padded_.bytes(), s);
    tensors.upload_inputs(b.q, b.k, b.v, b.dout);
    THDCP_CHECK_CUDA(cudaDeviceSynchronize());  // those copies ran on the legacy stream
    with_sinks_ = !sinks.empty();
    if (with_sinks_) sinks_.upload(sinks.data(), sinks_.bytes(), s);
    poison();
  }

  // The front door planned for this problem with `options`, over the workspace; its buffers
  // checked once, as a graph's static buffers are.
  cuda::Attention plan(const AttentionOptions& options) {
    cuda::Attention attention(problem_, options, workspace_.data(), workspace_.bytes());
    const ForwardTensors f = forward_tensors();
    const BackwardTensors b = backward_tensors();
    attention.check(layout(), &f, &b);
    return attention;
  }

  // The tensors of a call, with the sinks and dsinks where the batch has sinks.
  ForwardTensors forward_tensors() {
    ForwardTensors f = tensors.forward_tensors();
    if (with_sinks_) f.sinks = sinks_.as<float>();
    return f;
  }
  BackwardTensors backward_tensors() {
    BackwardTensors b = tensors.backward_tensors();
    if (with_sinks_) {
      b.sinks = sinks_.as<float>();
      b.dsinks = dsinks_.as<float>();
    }
    return b;
  }

  // Forward then backward on the stream: only enqueues (capture-safe).
  void enqueue(const cuda::Attention& attention) {
    attention.forward(layout(), forward_tensors(), stream());
    attention.backward(layout(), backward_tensors(), stream());
  }

  // Outputs poisoned, one forward and backward, their results.
  StepResult run(const cuda::Attention& attention) {
    poison();
    enqueue(attention);
    return download();
  }
  StepResult run(const AttentionOptions& options) { return run(plan(options)); }

  StepResult download() {
    THDCP_CHECK_CUDA(cudaStreamSynchronize(stream()));
    StepResult r{tensors.download_outputs(), {}};
    if (with_sinks_) r.dsinks = download_vector<float>(dsinks_, static_cast<size_t>(problem_.q_heads));
    return r;
  }

  // Every output byte 0xff (NaN), ordered on the stream.
  void poison() {
    tensors.poison_outputs(stream());
    dsinks_.poison(stream());
  }

 private:
  AttentionProblem problem_;
  Stream stream_;
  DeviceBuffer cu_seqlens_, cu_seqlens_padded_, sinks_, dsinks_, workspace_;
  bool with_sinks_ = false;
};

// The CPU reference (fp32 arithmetic) of a batch with its sinks (empty: none).
struct Reference {
  std::vector<float> sinks, dsinks;
  Outputs outputs;

  Reference(const Batch& b, const Mask& mask, std::vector<float> sinks_)
      : sinks(std::move(sinks_)), outputs(single_device(b, mask, cpu_options(), sinks, dsinks)) {}

  static AttentionOptions cpu_options() {
    AttentionOptions options;
    options.num_threads = 8;
    return options;
  }

  void expect_matches(const StepResult& got, const Batch& b) const {
    expect_gpu_close(got.outputs, outputs, b.q.dtype());
    if (!sinks.empty()) {
      EXPECT_TRUE(gpu_dsinks_match(got.dsinks, dsinks, outputs, b, sinks));
    }
  }
};

// An edge case at one head-dim pair, with or without sinks.
struct DimCase {
  std::string name;
  EdgeCase edge;
  bool sinks;
};

std::ostream& operator<<(std::ostream& os, const DimCase& c) { return os << c.name; }

// Every served pair through the same five cases: each pair sees both dtypes, causal, full and
// windowed masks, GQA 1, 2, 4 and 8, sinks on and off.
std::vector<DimCase> dim_cases() {
  const DType bf16 = DType::kBFloat16, fp16 = DType::kFloat16;
  const DimCase shapes[] = {
      {"causal_gqa4_bf16", {"", {0, 1, 5, 130, 0, 257, 63}, 2, Mask::causal(), 8, 2, 0, bf16}, false},
      {"full_gqa8_fp16_sinks_max_seqs_minus_one", {"", {1, 70, 190, 3}, 0, Mask::full(), 8, 1, 0, fp16}, true},
      {"window16_0_mha_bf16_sinks", {"", {250, 1, 77, 513}, 1, Mask::window(16, 0), 4, 4, 0, bf16}, true},
      {"one_sequence_fills_capacity_window16_16_gqa4_fp16", {"", {-1}, 0, Mask::window(16, 16), 4, 1, 0, fp16}, false},
      {"window1000_200_wider_than_every_sequence_gqa2_bf16",
       {"", {300, 9, 401}, 1, Mask::window(1000, 200), 4, 2, 0, bf16},
       false},
  };
  std::vector<DimCase> cases;
  for (const HeadDims& dims : served_head_dims()) {
    for (DimCase c : shapes) {
      c.name = head_dims_label(dims) + "_" + c.name;
      c.edge.head_dim = dims.head_dim;
      c.edge.v_head_dim = dims.v_head_dim;
      cases.push_back(c);
    }
  }
  return cases;
}

class CudaHeadDims : public CudaTest, public ::testing::WithParamInterface<DimCase> {};

TEST_P(CudaHeadDims, ForwardAndBackwardMatchTheCpuReference) {
  const DimCase& c = GetParam();
  DimStep step(problem_for(c.edge));
  const Batch b = make_case_batch(c.edge, 1, step.problem().capacity, std::hash<std::string>{}(c.name) % 1000, false);
  const Reference want(b, c.edge.mask, c.sinks ? sink_logits(c.edge.q_heads) : std::vector<float>{});
  step.load(b, want.sinks);

  const StepResult first = step.run(AttentionOptions{});
  {
    SCOPED_TRACE("deterministic backward");
    want.expect_matches(first, b);
  }
  const StepResult again = step.run(AttentionOptions{});
  EXPECT_TRUE(identical(again.outputs, first.outputs)) << "deterministic backward, second run";
  EXPECT_TRUE(again.dsinks == first.dsinks) << "deterministic backward, second run: dsinks differ";

  SCOPED_TRACE("deterministic = false backward");
  want.expect_matches(step.run(any_order()), b);
}

INSTANTIATE_TEST_SUITE_P(EdgeCases, CudaHeadDims, ::testing::ValuesIn(dim_cases()),
                         [](const ::testing::TestParamInfo<DimCase>& case_info) { return case_info.param.name; });

// Forward and backward (the table build included) captured once, replayed on another batch
// of the same capacity (other lengths and data, the same sinks): the bits of the eager step
// on that batch, which matches the reference.
struct GraphCase {
  HeadDims dims;
  DType dtype;
};

std::ostream& operator<<(std::ostream& os, const GraphCase& c) {
  return os << head_dims_label(c.dims) << "_" << dtype_name(c.dtype);
}

class CudaHeadDimGraph : public CudaTest, public ::testing::WithParamInterface<GraphCase> {};

TEST_P(CudaHeadDimGraph, ReplayOnAnotherBatchEqualsEagerBitForBit) {
  const GraphCase& g = GetParam();
  const EdgeCase c{"graph", {100, 7, 300, 1, 0, 45}, 3, Mask::window(128, 0), 8, 2, g.dims.head_dim, g.dtype,
                   g.dims.v_head_dim};
  DimStep step(problem_for(c));
  const Capacity capacity = step.problem().capacity;
  const Batch first = make_case_batch(c, 1, capacity, 51, false), second = make_case_batch(c, 1, capacity, 52, true);
  const std::vector<float> sinks = sink_logits(c.q_heads);
  step.load(first, sinks);
  const cuda::Attention attention = step.plan(AttentionOptions{});

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  THDCP_CHECK_CUDA(cudaStreamBeginCapture(step.stream(), cudaStreamCaptureModeGlobal));
  step.enqueue(attention);
  THDCP_CHECK_CUDA(cudaStreamEndCapture(step.stream(), &graph));
  THDCP_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  step.load(second, sinks);
  THDCP_CHECK_CUDA(cudaGraphLaunch(exec, step.stream()));
  const StepResult replayed = step.download();
  const StepResult eager = step.run(attention);
  EXPECT_TRUE(all_written(replayed.outputs));
  EXPECT_TRUE(identical(replayed.outputs, eager.outputs)) << "graph replay vs eager";
  EXPECT_TRUE(replayed.dsinks == eager.dsinks) << "graph replay vs eager: dsinks differ";
  Reference(second, c.mask, sinks).expect_matches(eager, second);
  THDCP_CHECK_CUDA(cudaGraphExecDestroy(exec));
  THDCP_CHECK_CUDA(cudaGraphDestroy(graph));
}

INSTANTIATE_TEST_SUITE_P(Pairs, CudaHeadDimGraph,
                         ::testing::Values(GraphCase{{96, 0}, DType::kBFloat16},
                                           GraphCase{{192, 128}, DType::kFloat16},
                                           GraphCase{{256, 0}, DType::kBFloat16}),
                         [](const ::testing::TestParamInfo<GraphCase>& case_info) {
                           return ::testing::PrintToString(case_info.param);
                         });

class CudaHeadDimChecks : public CudaTest {};

// A small causal case at `dims`: 4 query heads, 2 key/value heads, spare capacity.
EdgeCase small_case(const HeadDims& dims, DType dtype) {
  return EdgeCase{"", {40, 9}, 1, Mask::causal(), 4, 2, dims.head_dim, dtype, dims.v_head_dim};
}

AttentionProblem small_problem(const HeadDims& dims, DType dtype) { return problem_for(small_case(dims, dtype)); }

// The backend plans every served pair, in both dtypes and both backward settings, with the
// kernels it picks: no THDCP_PORTABLE_KERNELS needed. Where that variable is 1 (the
// portable_kernels run of this binary) or the GPU is not a Hopper, every plan runs the portable
// kernels.
TEST_F(CudaHeadDimChecks, TheBackendPicksItsKernelsForEveryPair) {
  const char* portable = std::getenv("THDCP_PORTABLE_KERNELS");
  const bool forced_portable = portable != nullptr && std::strcmp(portable, "1") == 0;
  int device = 0, major = 0;
  THDCP_CHECK_CUDA(cudaGetDevice(&device));
  THDCP_CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  for (const HeadDims& dims : served_head_dims()) {
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
      for (const AttentionOptions& options : {AttentionOptions{}, any_order()}) {
        SCOPED_TRACE(head_dims_label(dims) + " " + dtype_name(dtype) +
                     (options.deterministic ? " deterministic" : " deterministic = false"));
        EXPECT_TRUE(cuda::cuda_supports_head_dims(dims.head_dim, dims.v_head_dim));
        const AttentionProblem problem = small_problem(dims, dtype);
        DeviceBuffer workspace(cuda::Attention::workspace_size(problem, options));
        const std::string message = error_of([&] {
          const cuda::Attention attention(problem, options, workspace.data(), workspace.bytes());
          const std::string family = attention.kernel_family();
          EXPECT_TRUE(family == "sm90" || family == "portable") << family;
          if (forced_portable || major != 9) {
            EXPECT_EQ(family, "portable");
          }
        });
        EXPECT_EQ(message, "") << "THDCP_PORTABLE_KERNELS=" << (portable ? portable : "(unset)");
      }
    }
  }
}

// Unsupported pairs are refused when the plan is made (the front door, and each plan on its
// own), naming the pair's values and the supported set.
TEST_F(CudaHeadDimChecks, UnsupportedPairsAreRefusedAtPlanTime) {
  for (const HeadDims& dims : refused_head_dims()) {
    SCOPED_TRACE(head_dims_label(dims));
    EXPECT_FALSE(cuda::cuda_supports_head_dims(dims.head_dim, dims.v_head_dim));
    const AttentionProblem problem = small_problem(dims, DType::kBFloat16);
    expect_names_head_dims(error_of([&] {
                             DeviceBuffer workspace(cuda::Attention::workspace_size(problem));
                             (void)cuda::Attention(problem, AttentionOptions{}, workspace.data(), workspace.bytes());
                           }),
                           dims);
    cuda::AttentionShape shape;
    static_cast<HeadShape&>(shape) = problem.heads();
    shape.table = cuda::TablePlan::single_device(problem.capacity, problem.mask).table();
    shape.dtype = shape.dq_dtype = shape.dkv_dtype = problem.dtype;
    expect_names_head_dims(error_of([&] {
                             DeviceBuffer workspace(cuda::ForwardPlan::workspace_size(shape));
                             (void)cuda::ForwardPlan(shape, AttentionOptions{}, workspace.data(), workspace.bytes());
                           }),
                           dims);
    expect_names_head_dims(error_of([&] {
                             DeviceBuffer workspace(cuda::BackwardPlan::workspace_size(shape));
                             (void)cuda::BackwardPlan(shape, AttentionOptions{}, workspace.data(), workspace.bytes());
                           }),
                           dims);
  }
}

// A plan given v, or dv, of another head dim than its D_v (MLA's (192, 128) given D_qk = 192;
// (96, 96) given 128): refused before anything is enqueued, naming v_head_dim; every output
// keeps its poison.
TEST_F(CudaHeadDimChecks, AValueTensorOfAnotherHeadDimThanVHeadDimIsRefused) {
  struct Wrong {
    HeadDims dims;
    DType dtype;
    int v_head_dim;  // of the v and dv handed over
  };
  for (const Wrong& w : {Wrong{{192, 128}, DType::kBFloat16, 192}, Wrong{{192, 128}, DType::kFloat16, 192},
                         Wrong{{96, 0}, DType::kBFloat16, 128}}) {
    SCOPED_TRACE(head_dims_label(w.dims) + " " + dtype_name(w.dtype) + ", v of head dim " +
                 std::to_string(w.v_head_dim));
    const EdgeCase c = small_case(w.dims, w.dtype);
    DimStep step(problem_for(c));
    step.load(make_case_batch(c, 1, step.problem().capacity, 3, false), {});
    const cuda::Attention attention = step.plan(AttentionOptions{});
    DeviceTensor wrong(w.dtype, step.problem().capacity.max_tokens, c.kv_heads, w.v_head_dim);
    ForwardTensors f = step.forward_tensors();
    f.v = wrong.cview();
    expect_error([&] { attention.check(step.layout(), &f, nullptr); }, {"v_head_dim"});
    expect_error([&] { attention.forward(step.layout(), f, step.stream()); }, {"v_head_dim"});
    BackwardTensors g = step.backward_tensors();
    g.v = wrong.cview();
    expect_error([&] { attention.backward(step.layout(), g, step.stream()); }, {"v_head_dim"});
    g = step.backward_tensors();
    g.dv = wrong.view();
    expect_error([&] { attention.backward(step.layout(), g, step.stream()); }, {"v_head_dim"});
    THDCP_CHECK_CUDA(cudaStreamSynchronize(step.stream()));
    EXPECT_TRUE(still_poisoned(step.tensors));
  }
}

}  // namespace
}  // namespace thdcp::test
