// Graph banks through the C ABI (libthdcp.so) on a GPU (label gpu; SKIPPED with the reason
// where no CUDA device is visible): a bank over a shared-GPU group runs 4 packings of one
// capacity as warm-up, capture and replays of a callback that runs the CP step on the bank's
// buffers; each equals an eager run of the same callback bit for bit, and the counters say so.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/capi/capi_cuda.h"
#include "thdcp/plan/capacity.h"
#include "thdcp/thdcp.h"

namespace thdcp::test {
namespace {

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
  return step_tensors(s, rows, s.dtype, [&](const char* name, size_t bytes) {
    return bank_buffer(bank, capacity, name, bytes);
  });
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
               const std::vector<std::vector<int64_t>>& packings, const std::vector<Batch>& batches,
               BankResult& result) {
  int cp = 0;
  ASSERT_C_OK(thdcp_communicator_size(comm, &cp));
  const Stream stream;
  thdcp_graph_bank_t bank = nullptr;
  ASSERT_C_OK(thdcp_graph_bank_create(comm, nullptr, &bank));
  EXPECT_C_OK(thdcp_graph_bank_add_capacity(bank, &capacity));
  BankStep step;
  step.tensors = bank_tensors(bank, capacity, s, capacity.max_tokens / cp);
  const thdcp_cp_params params = cuda_cp_params(s, Capacity{capacity.max_seqs, capacity.max_tokens}, cp);
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
    const Batch& b = batches[i];
    const thdcp_layout_t host_layout = c_layout(b.layout);
    const HostTensor q = c_local_rows(b.q, host_layout, cp, rank), k = c_local_rows(b.k, host_layout, cp, rank),
                     v = c_local_rows(b.v, host_layout, cp, rank), dout = c_local_rows(b.dout, host_layout, cp, rank);

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
    result.banked.push_back(download_outputs(step.tensors, stream.get()));

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
    result.eager.push_back(download_outputs(step.tensors, stream.get()));
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
  std::vector<Batch> batches;  // in the capacity form the bank fills (empty documents dropped)
  for (size_t i = 0; i < packings.size(); ++i) {
    batches.push_back(make_batch(capacity_layout(packings[i], cp, bucket), s, 40 + i));
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
      EXPECT_TRUE(all_written(got.banked[i]));
      EXPECT_TRUE(identical(got.banked[i], got.eager[i])) << "the bank's run differs from the eager run";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cp, CApiCudaGraphBank, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& param_info) {
                           return "cp" + std::to_string(param_info.param);
                         });

}  // namespace
}  // namespace thdcp::test
