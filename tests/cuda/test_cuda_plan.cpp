// ForwardPlan / BackwardPlan: made once, run on several batches of one capacity, equal to
// the one-shot functions bit for bit; run() rejects tables and tensors that do not match
// the plan; check_tensors names host pointers; plans are per device.
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "support/cuda/cuda_test.h"
#include "support/cuda/device_step.h"
#include "support/cuda/one_shot.h"
#include "support/expect_error.h"
#include "thdcp/core/error.h"
#include "thdcp/cuda/attention.h"
#include "thdcp/plan/layout.h"
#include "thdcp/plan/segment_table.h"
#include "thdcp/testing/compare.h"
#include "thdcp/testing/workload.h"

namespace thdcp::test {
namespace {

constexpr int64_t kHq = 8, kHkv = 2, kD = 128;
constexpr DType kDtype = DType::kBFloat16;

// Static buffers of one capacity (as a captured training step has), on the device that is
// current when it is made: metadata, table, inputs, outputs, workspaces.
struct Step {
  Capacity capacity{6, 1024};
  Mask mask = Mask::window(200, 0);
  DeviceBuffer cu_seqlens, cu_seqlens_padded, segments;
  DeviceStep tensors;
  DeviceBuffer fwd_ws, bwd_ws;
  cuda::DeviceSegmentTable table;  // the description; load() fills the device array
  cuda::AttentionShape shape;

  Step()
      : cu_seqlens(sizeof(int32_t) * (capacity.max_seqs + 1)),
        cu_seqlens_padded(sizeof(int32_t) * (capacity.max_seqs + 1)),
        segments(sizeof(Segment) * table_entries(cuda::TableKind::kSingleDevice, capacity.max_seqs)),
        tensors(kDtype, capacity.max_tokens, capacity.max_tokens, HeadShape{kHq, kHkv, kD}, kDtype) {
    table.capacity = table_entries(cuda::TableKind::kSingleDevice, capacity.max_seqs);
    table.q_rows = table.k_rows = capacity.max_tokens;
    table.mask = mask;
    table.kind = cuda::TableKind::kSingleDevice;
    shape.table = table;  // segments still null: a plan does not need them
    shape.q_heads = kHq;
    shape.kv_heads = kHkv;
    shape.head_dim = kD;
    shape.dtype = shape.dq_dtype = shape.dkv_dtype = kDtype;
    fwd_ws = DeviceBuffer(cuda::ForwardPlan::workspace_size(shape));
    bwd_ws = DeviceBuffer(cuda::BackwardPlan::workspace_size(shape));
  }

  // A new batch: metadata and inputs copied in, the table built on the device.
  void load(const std::vector<int64_t>& lengths, uint64_t seed) {
    const BatchLayout layout = make_layout(lengths, 1, capacity);
    cu_seqlens.upload(layout.cu_seqlens.data(), cu_seqlens.bytes());
    cu_seqlens_padded.upload(layout.cu_seqlens_padded.data(), cu_seqlens_padded.bytes());
    tensors.fill_inputs(seed);
    table = build_segment_table(cu_seqlens.as<int32_t>(), cu_seqlens_padded.as<int32_t>(), capacity.max_seqs,
                                capacity.max_tokens, mask, segments.as<Segment>(), nullptr);
  }

  // A forward and a backward plan of this step's shape, on the current device.
  struct Plans {
    cuda::ForwardPlan forward;
    cuda::BackwardPlan backward;
  };
  Plans plans() const {
    return Plans{cuda::ForwardPlan(shape, {}, fwd_ws.data(), fwd_ws.bytes()),
                 cuda::BackwardPlan(shape, {}, bwd_ws.data(), bwd_ws.bytes())};
  }
};

using OutputBytes = std::vector<std::vector<unsigned char>>;

// Runs the plans on `step`'s current batch and returns the results.
OutputBytes run_plans(Step& step, const cuda::ForwardPlan& forward, const cuda::BackwardPlan& backward) {
  step.tensors.poison_outputs();
  forward.run(step.table, step.tensors.forward_tensors(), nullptr);
  backward.run(step.table, step.tensors.backward_tensors(), nullptr);
  THDCP_CHECK_CUDA(cudaDeviceSynchronize());
  return step.tensors.output_bytes();
}

OutputBytes run_plans(Step& step, const Step::Plans& plans) { return run_plans(step, plans.forward, plans.backward); }

// The one-shot functions on `step`'s current batch.
OutputBytes run_free_functions(Step& step) {
  step.tensors.poison_outputs();
  attention_step(step.table, step.tensors, step.fwd_ws, step.bwd_ws, nullptr);
  THDCP_CHECK_CUDA(cudaDeviceSynchronize());
  return step.tensors.output_bytes();
}

void expect_same(const OutputBytes& a, const OutputBytes& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i] == b[i]) << kOutputNames[i] << " differs: " << what;
}

// Makes `device` current and a Step there, with the batch of PlansArePerDevice loaded.
std::unique_ptr<Step> step_on(int device) {
  THDCP_CHECK_CUDA(cudaSetDevice(device));
  auto step = std::make_unique<Step>();
  step->load({400, 33, 250}, 7);
  return step;
}

// Restores the current device when it goes out of scope.
struct DeviceGuard {
  int saved = 0;
  DeviceGuard() { THDCP_CHECK_CUDA(cudaGetDevice(&saved)); }
  ~DeviceGuard() { cudaSetDevice(saved); }
};

class CudaPlan : public CudaTest {};

// One plan pair, two batches of the same capacity: each equals the free functions.
TEST_F(CudaPlan, RunsSeveralBatchesLikeTheFreeFunctions) {
  DeviceGuard guard;
  THDCP_CHECK_CUDA(cudaSetDevice(0));
  Step step;
  const Step::Plans plans = step.plans();
  EXPECT_EQ(plans.forward.device(), 0);
  EXPECT_STREQ(plans.forward.kernel_family(), cuda::kernel_family());

  step.load({300, 1, 0, 517, 64}, 1);
  plans.forward.check_tensors(step.tensors.forward_tensors());
  plans.backward.check_tensors(step.tensors.backward_tensors());
  const auto planned_first = run_plans(step, plans);
  expect_same(planned_first, run_free_functions(step), "first batch");

  step.load({1000, 7}, 2);  // other lengths and count, same capacity
  const auto planned_second = run_plans(step, plans);
  expect_same(planned_second, run_free_functions(step), "second batch");
  EXPECT_FALSE(planned_first[0] == planned_second[0]) << "the two batches gave the same out";
}

// run() checks with host arithmetic that the call matches the plan, and throws before
// enqueueing anything.
TEST_F(CudaPlan, RunRejectsWhatDoesNotMatchThePlan) {
  Step step;
  step.load({100, 200}, 3);
  const Step::Plans plans = step.plans();
  step.tensors.poison_outputs();
  auto run_forward = [&](const cuda::DeviceSegmentTable& table, const ForwardTensors& t) {
    return error_of([&] { plans.forward.run(table, t, nullptr); });
  };
  EXPECT_EQ(run_forward(step.table, step.tensors.forward_tensors()), "") << "the matching call must not throw";
  THDCP_CHECK_CUDA(cudaDeviceSynchronize());
  step.tensors.poison_outputs();

  ForwardTensors t = step.tensors.forward_tensors();
  t.q.tokens -= 8;
  expect_contains(run_forward(step.table, t), "q is [1016, 8, 128] but must be [q_rows=1024");
  t = step.tensors.forward_tensors();
  t.k.heads = 1;
  expect_contains(run_forward(step.table, t), "k is [1024, 1, 128] but must be [k_rows=1024, kv_heads=2");
  t = step.tensors.forward_tensors();
  t.v.dtype = DType::kFloat16;
  expect_contains(run_forward(step.table, t), "v has dtype fp16");
  t = step.tensors.forward_tensors();
  t.out.row_stride = kHq * kD + 4;
  expect_contains(run_forward(step.table, t), "out.row_stride=1028 is not a multiple of 8");
  t = step.tensors.forward_tensors();
  t.lse = nullptr;
  expect_contains(run_forward(step.table, t), "lse is a null pointer");

  cuda::DeviceSegmentTable other = step.table;
  other.capacity -= 1;
  expect_contains(run_forward(other, step.tensors.forward_tensors()), "capacity");
  other = step.table;
  other.mask = Mask::causal();
  expect_contains(run_forward(other, step.tensors.forward_tensors()), "mask");
  other = step.table;
  other.kind = cuda::TableKind::kAllGatherCp;
  expect_contains(run_forward(other, step.tensors.forward_tensors()), "kind");
  other = step.table;
  other.segments = nullptr;
  expect_contains(run_forward(other, step.tensors.forward_tensors()), "table.segments is a null pointer");

  BackwardTensors b = step.tensors.backward_tensors();
  b.dq.dtype = DType::kFloat32;  // the plan was made for bf16 dq
  expect_contains(error_of([&] { plans.backward.run(step.table, b, nullptr); }), "dq has dtype fp32");
  b = step.tensors.backward_tensors();
  b.dk.head_stride = kD - 8;  // heads 120 elements apart: head 1 starts inside head 0
  expect_contains(error_of([&] { plans.backward.run(step.table, b, nullptr); }),
                  "head_stride=120: its elements (row 0, head 0, d 120) and (row 0, head 1, d 0) share an address");

  THDCP_CHECK_CUDA(cudaDeviceSynchronize());
  EXPECT_TRUE(still_poisoned(step.tensors)) << "a run that threw wrote an output";
}

TEST_F(CudaPlan, CheckTensorsNamesHostPointers) {
  Step step;
  const Step::Plans plans = step.plans();
  EXPECT_EQ(error_of([&] { plans.forward.check_tensors(step.tensors.forward_tensors()); }), "");

  std::vector<uint16_t> host(static_cast<size_t>(step.tensors.q.tokens * kHq * kD) + 8);
  void* aligned_host = host.data() + (16 - reinterpret_cast<uintptr_t>(host.data()) % 16) % 16 / 2;
  ForwardTensors t = step.tensors.forward_tensors();
  t.q.data = aligned_host;
  expect_contains(error_of([&] { plans.forward.check_tensors(t); }), "q points to");
  BackwardTensors b = step.tensors.backward_tensors();
  b.dout.data = aligned_host;
  expect_contains(error_of([&] { plans.backward.check_tensors(b); }), "dout points to");
  std::vector<float> host_lse(static_cast<size_t>(kHq * step.tensors.q.tokens));
  t = step.tensors.forward_tensors();
  t.lse = host_lse.data();
  expect_contains(error_of([&] { plans.forward.check_tensors(t); }), "lse points to");

  // The workspace, at plan time.
  std::vector<unsigned char> host_ws(step.fwd_ws.bytes() + 256);
  void* aligned_ws = host_ws.data() + (256 - reinterpret_cast<uintptr_t>(host_ws.data()) % 256) % 256;
  expect_contains(error_of([&] { cuda::ForwardPlan(step.shape, {}, aligned_ws, step.fwd_ws.bytes()); }),
                  "workspace points to");
  expect_contains(error_of([&] { cuda::ForwardPlan(step.shape, {}, step.fwd_ws.data(), step.fwd_ws.bytes() - 1); }),
                  "workspace has");
}

// Options::sm_margin leaves SMs free beside the forward: the persistent forward on fewer
// blocks (down to one, which then takes every work item from the counter) gives the same
// bits as on all of them. A negative margin, or one that leaves no SM, is refused at plan
// time, naming sm_margin.
TEST_F(CudaPlan, SmMarginGivesTheSameBits) {
  Step step;
  step.load({300, 1, 0, 517, 64}, 11);
  const cuda::BackwardPlan backward(step.shape, {}, step.bwd_ws.data(), step.bwd_ws.bytes());
  const cuda::ForwardPlan all_sms(step.shape, {}, step.fwd_ws.data(), step.fwd_ws.bytes());
  const auto expected = run_plans(step, all_sms, backward);
  int multiprocessors = 0;
  THDCP_CHECK_CUDA(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, all_sms.device()));
  const bool sm90 = std::string(all_sms.kernel_family()) == "sm90";
  for (int margin : {1, multiprocessors / 2, multiprocessors - 1}) {
    AttentionOptions options;
    options.sm_margin = margin;
    const cuda::ForwardPlan fewer(step.shape, options, step.fwd_ws.data(), step.fwd_ws.bytes());
    expect_same(run_plans(step, fewer, backward), expected, "sm_margin=" + std::to_string(margin));
  }
  AttentionOptions bad;
  bad.sm_margin = -1;
  expect_contains(error_of([&] { cuda::ForwardPlan(step.shape, bad, step.fwd_ws.data(), step.fwd_ws.bytes()); }),
                  "sm_margin=-1 must be >= 0");
  bad.sm_margin = multiprocessors;
  const std::string message =
      error_of([&] { cuda::ForwardPlan(step.shape, bad, step.fwd_ws.data(), step.fwd_ws.bytes()); });
  if (sm90) {
    expect_contains(message, "sm_margin=" + std::to_string(multiprocessors) + " leaves no SM for the forward");
  } else {
    EXPECT_EQ(message, "") << "the portable kernels are not persistent and ignore sm_margin";
  }
}

// A plan belongs to the device current when it is made. With two GPUs, a plan made on
// device 1 runs there on device 1's buffers and gives device 0's bits.
TEST_F(CudaPlan, PlansArePerDevice) {
  int count = 0;
  THDCP_CHECK_CUDA(cudaGetDeviceCount(&count));
  DeviceGuard guard;
  const std::unique_ptr<Step> step0 = step_on(0);
  const Step::Plans plans0 = step0->plans();
  EXPECT_EQ(plans0.forward.device(), 0);
  EXPECT_EQ(plans0.backward.device(), 0);
  const auto on_device0 = run_plans(*step0, plans0);
  if (count < 2) {
    GTEST_SKIP() << "one CUDA device visible: the plan on device 1 needs two (device 0 ran and was checked)";
  }

  int major0 = 0, minor0 = 0, major1 = 0, minor1 = 0;
  THDCP_CHECK_CUDA(cudaDeviceGetAttribute(&major0, cudaDevAttrComputeCapabilityMajor, 0));
  THDCP_CHECK_CUDA(cudaDeviceGetAttribute(&minor0, cudaDevAttrComputeCapabilityMinor, 0));
  THDCP_CHECK_CUDA(cudaDeviceGetAttribute(&major1, cudaDevAttrComputeCapabilityMajor, 1));
  THDCP_CHECK_CUDA(cudaDeviceGetAttribute(&minor1, cudaDevAttrComputeCapabilityMinor, 1));
  const std::unique_ptr<Step> step1 = step_on(1);
  const Step::Plans plans1 = step1->plans();
  EXPECT_EQ(plans1.forward.device(), 1);
  EXPECT_EQ(plans1.backward.device(), 1);
  plans1.forward.check_tensors(step1->tensors.forward_tensors());
  plans1.backward.check_tensors(step1->tensors.backward_tensors());
  // Device 0's tensors are not device 1's.
  expect_contains(error_of([&] { plans1.forward.check_tensors(step0->tensors.forward_tensors()); }),
                  "lives on device 0");
  const auto on_device1 = run_plans(*step1, plans1);
  if (major0 != major1 || minor0 != minor1) {
    GTEST_SKIP() << "devices 0 and 1 differ (compute capability " << major0 << "." << minor0 << " and " << major1
                 << "." << minor1 << "): the plan on device 1 ran; its bits are not comparable";
  }
  expect_same(on_device1, on_device0, "device 1 against device 0");
  // Device 0's plan still runs after device 1's was made (attributes are per device).
  THDCP_CHECK_CUDA(cudaSetDevice(0));
  expect_same(run_plans(*step0, plans0), on_device0, "device 0 after device 1's plan");
}

}  // namespace
}  // namespace thdcp::test
