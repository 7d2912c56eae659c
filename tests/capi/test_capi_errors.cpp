// Every status a bad argument can produce through the C ABI, with a message that names the
// function and the argument; and nothing the caller owns is written by a refused call.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "support/capi/capi_support.h"
#include "support/random_batch.h"
#include "thdcp/thdcp.h"

namespace thdcp {
namespace {

using test::c_layout;
using test::c_tensor;
using test::set_raw;
using test::Snapshot;

bool built_with(thdcp_feature_t feature) {
  int on = -1;
  EXPECT_C_OK(thdcp_built_with(feature, &on));
  return on == 1;
}

// Causal, bf16 (thdcp.h's default dtype and window_left), heads 4:2, head_dim 16; capacity
// 4 sequences, 32 rows.
thdcp_attention_params small_params() {
  thdcp_attention_params p = THDCP_ATTENTION_PARAMS_INIT;
  test::set_shape(p, test::Shape{DType::kBFloat16, 4, 2, 16, Mask::causal()}, Capacity{4, 32});
  return p;
}

TEST(CApiLibrary, VersionAbiAndStatusNames) {
  EXPECT_STREQ(thdcp_version_string(), THDCP_TEST_PROJECT_VERSION);
  EXPECT_EQ(thdcp_abi_version(), THDCP_ABI_VERSION);
  EXPECT_EQ(thdcp_abi_version(), 1);
  EXPECT_STREQ(thdcp_status_name(THDCP_SUCCESS), "THDCP_SUCCESS");
  EXPECT_STREQ(thdcp_status_name(THDCP_ERROR_COMMUNICATION), "THDCP_ERROR_COMMUNICATION");
  EXPECT_STREQ(thdcp_status_name(THDCP_ERROR_INVALID_HANDLE), "THDCP_ERROR_INVALID_HANDLE");
  EXPECT_STREQ(thdcp_status_name(static_cast<thdcp_status_t>(8)), "THDCP_STATUS_UNKNOWN");
  EXPECT_C_STATUS(thdcp_built_with(THDCP_FEATURE_CUDA, nullptr), THDCP_ERROR_INVALID_ARGUMENT,
                  "thdcp_built_with: out is NULL");
  int on = 0;
  EXPECT_C_STATUS(thdcp_built_with(static_cast<thdcp_feature_t>(3), &on), THDCP_ERROR_INVALID_ARGUMENT,
                  "feature=3 is not a thdcp_feature_t");
}

TEST(CApiLibrary, LastErrorIsPerThreadAndKeptBySuccessfulCalls) {
  EXPECT_C_STATUS(thdcp_attention_plan_create(nullptr, nullptr, 0, nullptr), THDCP_ERROR_INVALID_ARGUMENT,
                  "thdcp_attention_plan_create: params is NULL");
  std::string other;
  std::thread([&] { other = thdcp_last_error(); }).join();
  EXPECT_EQ(other, "") << "another thread has no failure of its own";
  size_t bytes = 0;
  const thdcp_attention_params p = small_params();
  EXPECT_C_OK(thdcp_attention_plan_workspace_size(&p, &bytes));
  EXPECT_NE(std::string(thdcp_last_error()).find("params is NULL"), std::string::npos)
      << "a successful call keeps the last failure's message";
}

// A field at a time set to a bad value: the status and the words of the message.
struct BadParams {
  const char* name;
  void (*spoil)(thdcp_attention_params&);
  std::vector<std::string> message;
};

TEST(CApiAttentionPlan, BadParamsAreRefusedNamingTheField) {
  const std::vector<BadParams> cases = {
      {"struct_size too small", [](thdcp_attention_params& p) { p.struct_size = 56; },
       {"params->struct_size=56", "first version has 64 bytes", "THDCP_ATTENTION_PARAMS_INIT"}},
      {"struct_size not a multiple of 8", [](thdcp_attention_params& p) { p.struct_size = 68; },
       {"params->struct_size=68"}},
      {"struct_size zero", [](thdcp_attention_params& p) { p.struct_size = 0; }, {"params->struct_size=0"}},
      {"backend", [](thdcp_attention_params& p) { set_raw(p.backend, 7); },
       {"params->backend=7 is not a thdcp_backend_t"}},
      {"dtype default", [](thdcp_attention_params& p) { p.dtype = THDCP_DTYPE_DEFAULT; },
       {"params->dtype=0 (THDCP_DTYPE_DEFAULT) is not a storage dtype"}},
      {"dtype unknown", [](thdcp_attention_params& p) { set_raw(p.dtype, 9); },
       {"params->dtype=9"}},
      {"heads not GQA", [](thdcp_attention_params& p) { p.q_heads = 5; },
       {"params->q_heads=5, params->kv_heads=2", "multiple of kv_heads"}},
      {"kv_heads zero", [](thdcp_attention_params& p) { p.kv_heads = 0; }, {"params->kv_heads=0"}},
      {"head_dim unsupported", [](thdcp_attention_params& p) { p.head_dim = 12; },
       {"params->head_dim=12 is not supported by the CPU backend", "multiple of 8 in [8, 256]"}},
      {"head_dim too large", [](thdcp_attention_params& p) { p.head_dim = 264; }, {"params->head_dim=264"}},
      {"max_seqs", [](thdcp_attention_params& p) { p.max_seqs = 0; }, {"params->max_seqs=0 must be >= 1"}},
      {"max_tokens negative", [](thdcp_attention_params& p) { p.max_tokens = -2; }, {"params->max_tokens=-2"}},
      {"max_tokens past int32", [](thdcp_attention_params& p) { p.max_tokens = int64_t{1} << 31; },
       {"params->max_tokens=2147483648"}},
      {"window", [](thdcp_attention_params& p) { p.window_left = -2; },
       {"params->window_left=-2, window_right=0", "-1 for unbounded"}},
      {"softmax_scale", [](thdcp_attention_params& p) { p.softmax_scale = std::numeric_limits<float>::infinity(); },
       {"params->softmax_scale=inf must be finite"}},
      {"softmax_scale negative", [](thdcp_attention_params& p) { p.softmax_scale = -1.0f; },
       {"params->softmax_scale=-1 must be finite and >= 0", "or 0 for 1/sqrt(head_dim)"}},
      {"softmax_scale NaN",
       [](thdcp_attention_params& p) { p.softmax_scale = std::numeric_limits<float>::quiet_NaN(); },
       {"params->softmax_scale=nan must be finite and >= 0"}},
      {"dq_dtype", [](thdcp_attention_params& p) { p.dq_dtype = THDCP_DTYPE_FP16; },
       {"params->dq_dtype=THDCP_DTYPE_FP16 is neither the plan's dtype (bf16) nor fp32"}},
      {"dkv_dtype", [](thdcp_attention_params& p) { set_raw(p.dkv_dtype, -4); },
       {"params->dkv_dtype=-4"}},
      {"num_threads", [](thdcp_attention_params& p) { p.num_threads = -1; }, {"params->num_threads=-1"}},
      {"num_threads too many", [](thdcp_attention_params& p) { p.num_threads = THDCP_MAX_THREADS + 1; },
       {"params->num_threads=4097 must be in [0, THDCP_MAX_THREADS=4096]"}},
  };
  for (const BadParams& c : cases) {
    SCOPED_TRACE(c.name);
    thdcp_attention_params p = small_params();
    c.spoil(p);
    thdcp_attention_plan_t plan = reinterpret_cast<thdcp_attention_plan_t>(0x1);  // poison
    std::vector<std::string> parts = {"thdcp_attention_plan_create: "};
    parts.insert(parts.end(), c.message.begin(), c.message.end());
    EXPECT_TRUE(test::status_is(thdcp_attention_plan_create(&p, nullptr, 0, &plan), THDCP_ERROR_INVALID_ARGUMENT,
                                parts));
    EXPECT_EQ(plan, reinterpret_cast<thdcp_attention_plan_t>(0x1)) << "a refused create wrote the handle";
    size_t bytes = 12345;
    EXPECT_TRUE(test::status_is(thdcp_attention_plan_workspace_size(&p, &bytes), THDCP_ERROR_INVALID_ARGUMENT,
                                c.message));
    EXPECT_EQ(bytes, 12345u);
  }
  thdcp_attention_params p = small_params();
  EXPECT_C_STATUS(thdcp_attention_plan_create(&p, nullptr, 0, nullptr), THDCP_ERROR_INVALID_ARGUMENT,
                  "plan is NULL: pass a thdcp_attention_plan_t");
  p.num_threads = THDCP_MAX_THREADS;  // the limit itself is accepted
  thdcp_attention_plan_t largest = nullptr;
  EXPECT_C_OK(thdcp_attention_plan_create(&p, nullptr, 0, &largest));
  EXPECT_C_OK(thdcp_attention_plan_destroy(largest));
  EXPECT_C_STATUS(thdcp_attention_plan_workspace_size(&p, nullptr), THDCP_ERROR_INVALID_ARGUMENT,
                  "workspace_bytes is NULL");
  EXPECT_C_OK(thdcp_attention_plan_destroy(nullptr));
}

// Without CUDA in the build, or without a visible GPU, the CUDA backend is unsupported, and
// the message says which and what to do.
TEST(CApiAttentionPlan, CudaBackendWithoutCudaIsUnsupported) {
  thdcp_attention_params p = small_params();
  p.backend = THDCP_BACKEND_CUDA;
  p.head_dim = 64;
  thdcp_attention_plan_t plan = nullptr;
  if (!built_with(THDCP_FEATURE_CUDA)) {
    EXPECT_C_STATUS(thdcp_attention_plan_create(&p, nullptr, 0, &plan), THDCP_ERROR_UNSUPPORTED,
                    "params->backend=THDCP_BACKEND_CUDA: this libthdcp was built without CUDA",
                    "-DTHDCP_WITH_CUDA=ON");
    size_t bytes = 0;
    EXPECT_C_STATUS(thdcp_attention_plan_workspace_size(&p, &bytes), THDCP_ERROR_UNSUPPORTED, "-DTHDCP_WITH_CUDA=ON");
    return;
  }
  // Built with CUDA: the CUDA-only limits apply, and on a machine without a GPU the plan is
  // refused as unsupported (with one, making it needs a workspace: covered by the GPU tests).
  p.dtype = THDCP_DTYPE_FP32;
  EXPECT_C_STATUS(thdcp_attention_plan_create(&p, nullptr, 0, &plan), THDCP_ERROR_INVALID_ARGUMENT,
                  "THDCP_DTYPE_FP32 is not supported by the CUDA backend");
  p.dtype = THDCP_DTYPE_BF16;
  // A (head_dim, v_head_dim) pair without CUDA kernels, named with what the kernels take.
  p.head_dim = 32;
  EXPECT_C_STATUS(thdcp_attention_plan_create(&p, nullptr, 0, &plan), THDCP_ERROR_INVALID_ARGUMENT,
                  "params->head_dim=32, params->v_head_dim=0 is not supported by the CUDA backend: it takes ");
  p.head_dim = 128;
  p.v_head_dim = 64;
  EXPECT_C_STATUS(thdcp_attention_plan_create(&p, nullptr, 0, &plan), THDCP_ERROR_INVALID_ARGUMENT,
                  "params->head_dim=128, params->v_head_dim=64 is not supported by the CUDA backend: it takes ");
  p.head_dim = 64;
  p.v_head_dim = 0;
  size_t bytes = 0;
  EXPECT_C_OK(thdcp_attention_plan_workspace_size(&p, &bytes));
  EXPECT_GT(bytes, 0u);
  const thdcp_status_t status = thdcp_attention_plan_create(&p, nullptr, 0, &plan);
  if (status == THDCP_ERROR_UNSUPPORTED) {
    EXPECT_NE(std::string(thdcp_last_error()).find("no CUDA device is visible"), std::string::npos)
        << thdcp_last_error();
  } else {
    EXPECT_C_STATUS(status, THDCP_ERROR_INVALID_ARGUMENT, "workspace=", "thdcp_attention_plan_workspace_size");
  }
}

// Bad arguments of a run, one at a time; the outputs, poisoned, must stay as they were.
class CApiRunErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    // Capacity form of 4 sequences and 32 rows: 9 and 14 tokens, an empty document dropped,
    // the last placeholder absorbing the slack rows.
    b_ = test::make_batch(make_layout({9, 0, 14}, 2, Capacity{4, 32}), DType::kBFloat16, 4, 2, 16, 3);
    const thdcp_attention_params p = small_params();
    ASSERT_C_OK(thdcp_attention_plan_create(&p, nullptr, 0, &plan_));
    out_ = HostTensor(DType::kBFloat16, 32, 4, 16);
    dq_ = HostTensor(DType::kBFloat16, 32, 4, 16);
    dk_ = HostTensor(DType::kBFloat16, 32, 2, 16);
    dv_ = HostTensor(DType::kBFloat16, 32, 2, 16);
    for (HostTensor* t : {&out_, &dq_, &dk_, &dv_}) test::poison(*t);
    lse_.assign(4 * 32, 0.0f);
    test::poison(lse_);
    max_logit_.assign(4, 0.0f);
    test::poison(max_logit_);
    layout_ = c_layout(b_.layout);
    q_ = c_tensor(b_.q);
    k_ = c_tensor(b_.k);
    v_ = c_tensor(b_.v);
    dout_ = c_tensor(b_.dout);
    out_c_ = c_tensor(out_);
    dq_c_ = c_tensor(dq_);
    dk_c_ = c_tensor(dk_);
    dv_c_ = c_tensor(dv_);
    snapshot_.add(out_).add(dq_).add(dk_).add(dv_).add(lse_).add(max_logit_);
  }
  void TearDown() override { EXPECT_C_OK(thdcp_attention_plan_destroy(plan_)); }

  thdcp_status_t forward() {
    return thdcp_attention_forward(plan_, &layout_, &q_, &k_, &v_, &out_c_, lse_.data(), max_logit_.data(), nullptr);
  }
  thdcp_status_t backward(const float* lse) {
    return thdcp_attention_backward(plan_, &layout_, &q_, &k_, &v_, &out_c_, &dout_, lse, &dq_c_, &dk_c_, &dv_c_,
                                    nullptr);
  }

  test::Batch b_;
  thdcp_attention_plan_t plan_ = nullptr;
  HostTensor out_, dq_, dk_, dv_;
  std::vector<float> lse_, max_logit_;
  thdcp_layout_t layout_{};
  thdcp_tensor_t q_{}, k_{}, v_{}, dout_{}, out_c_{}, dq_c_{}, dk_c_{}, dv_c_{};
  Snapshot snapshot_;
};

TEST_F(CApiRunErrors, ForwardArgumentsAreCheckedBeforeAnythingIsWritten) {
  const thdcp_tensor_t good_q = q_, good_k = k_;
  const thdcp_layout_t good_layout = layout_;
  EXPECT_C_STATUS(thdcp_attention_forward(nullptr, &layout_, &q_, &k_, &v_, &out_c_, lse_.data(), nullptr, nullptr),
                  THDCP_ERROR_INVALID_ARGUMENT, "thdcp_attention_forward: plan is NULL");
  EXPECT_C_STATUS(thdcp_attention_forward(plan_, nullptr, &q_, &k_, &v_, &out_c_, lse_.data(), nullptr, nullptr),
                  THDCP_ERROR_INVALID_ARGUMENT, "layout is NULL");
  EXPECT_C_STATUS(thdcp_attention_forward(plan_, &layout_, nullptr, &k_, &v_, &out_c_, lse_.data(), nullptr, nullptr),
                  THDCP_ERROR_INVALID_ARGUMENT, "q is NULL");
  EXPECT_C_STATUS(thdcp_attention_forward(plan_, &layout_, &q_, &k_, &v_, nullptr, lse_.data(), nullptr, nullptr),
                  THDCP_ERROR_INVALID_ARGUMENT, "out is NULL");
  EXPECT_C_STATUS(thdcp_attention_forward(plan_, &layout_, &q_, &k_, &v_, &out_c_, nullptr, nullptr, nullptr),
                  THDCP_ERROR_INVALID_ARGUMENT, "lse is NULL: pass q_heads * max_tokens = 128 floats");
  q_.dtype = THDCP_DTYPE_FP16;
  EXPECT_C_STATUS(forward(), THDCP_ERROR_INVALID_ARGUMENT, "q has dtype fp16 but must be bf16");
  set_raw(q_.dtype, 17);
  EXPECT_C_STATUS(forward(), THDCP_ERROR_INVALID_ARGUMENT, "q->dtype=17");
  q_ = good_q;
  k_.heads = 4;
  EXPECT_C_STATUS(forward(), THDCP_ERROR_INVALID_ARGUMENT,
                  "k is [32, 4, 16] but must be [max_tokens=32, kv_heads=2, head_dim=16]");
  k_ = good_k;
  q_.rows = 24;
  EXPECT_C_STATUS(forward(), THDCP_ERROR_INVALID_ARGUMENT, "q is [24, 4, 16] but must be [max_tokens=32");
  q_ = good_q;
  q_.data = nullptr;
  EXPECT_C_STATUS(forward(), THDCP_ERROR_INVALID_ARGUMENT, "q->data is NULL");
  q_ = good_q;
  q_.row_stride = -64;
  EXPECT_C_STATUS(forward(), THDCP_ERROR_INVALID_ARGUMENT, "q has row_stride=-64");
  q_ = good_q;
  layout_.cu_seqlens = nullptr;
  EXPECT_C_STATUS(forward(), THDCP_ERROR_INVALID_ARGUMENT, "layout->cu_seqlens is NULL");
  layout_ = good_layout;
  layout_.num_seqs = 5;
  EXPECT_C_STATUS(forward(), THDCP_ERROR_INVALID_ARGUMENT, "layout->num_seqs=5 is more than the plan's max_seqs=4");
  layout_.num_seqs = 0;
  EXPECT_C_STATUS(forward(), THDCP_ERROR_INVALID_ARGUMENT, "layout->num_seqs=0 must be >= 1");
  layout_ = good_layout;
  std::vector<int32_t> decreasing = b_.layout.cu_seqlens;
  decreasing[2] = 3;  // below cu_seqlens[1] = 9
  layout_.cu_seqlens = decreasing.data();
  EXPECT_C_STATUS(forward(), THDCP_ERROR_INVALID_ARGUMENT, "cu_seqlens[2]=3");
  layout_ = good_layout;
  std::vector<int32_t> short_rows = b_.layout.cu_seqlens_padded;
  short_rows.back() = 28;
  layout_.cu_seqlens_padded = short_rows.data();
  EXPECT_C_STATUS(forward(), THDCP_ERROR_INVALID_ARGUMENT, "28");
  layout_ = good_layout;
  EXPECT_TRUE(snapshot_.unchanged());
  EXPECT_C_OK(forward());
  EXPECT_FALSE(snapshot_.unchanged()) << "the accepted call writes the outputs (the snapshot can fail)";
}

TEST_F(CApiRunErrors, BackwardArgumentsAreCheckedBeforeAnythingIsWritten) {
  const std::vector<float> lse(4 * 32, 0.0f);
  EXPECT_C_STATUS(backward(nullptr), THDCP_ERROR_INVALID_ARGUMENT, "thdcp_attention_backward: lse is NULL");
  const thdcp_tensor_t good_dq = dq_c_, good_dv = dv_c_;
  dq_c_.dtype = THDCP_DTYPE_FP32;
  EXPECT_C_STATUS(backward(lse.data()), THDCP_ERROR_INVALID_ARGUMENT,
                  "dq has dtype fp32 but must be bf16");
  dq_c_ = good_dq;
  dv_c_.head_dim = 8;
  EXPECT_C_STATUS(backward(lse.data()), THDCP_ERROR_INVALID_ARGUMENT, "dv is [32, 2, 8]");
  dv_c_ = good_dv;
  EXPECT_C_STATUS(thdcp_attention_backward(plan_, &layout_, &q_, &k_, &v_, &out_c_, nullptr, lse.data(), &dq_c_,
                                           &dk_c_, &dv_c_, nullptr),
                  THDCP_ERROR_INVALID_ARGUMENT, "dout is NULL");
  EXPECT_C_STATUS(thdcp_attention_backward(plan_, &layout_, &q_, &k_, &v_, &out_c_, &dout_, lse.data(), &dq_c_,
                                           nullptr, &dv_c_, nullptr),
                  THDCP_ERROR_INVALID_ARGUMENT, "dk is NULL");
  EXPECT_TRUE(snapshot_.unchanged());
}

TEST(CApiCommunicators, BadArgumentsAndQueries) {
  thdcp_communicator_t comms[2] = {reinterpret_cast<thdcp_communicator_t>(0x1),
                                   reinterpret_cast<thdcp_communicator_t>(0x1)};
  EXPECT_C_STATUS(thdcp_communicator_create_in_process_group(0, comms), THDCP_ERROR_INVALID_ARGUMENT,
                  "thdcp_communicator_create_in_process_group: size=0 must be in [1, THDCP_MAX_GROUP_SIZE=1024]");
  // A group's size is bounded before anything is allocated for it (2^30 ranks used to be
  // allocated, then failed for memory or exhausted it).
  for (const int size : {THDCP_MAX_GROUP_SIZE + 1, 1 << 30}) {
    EXPECT_C_STATUS(thdcp_communicator_create_in_process_group(size, comms), THDCP_ERROR_INVALID_ARGUMENT,
                    "size=" + std::to_string(size) + " must be in [1, THDCP_MAX_GROUP_SIZE=1024]",
                    "each driven by a thread of its own");
    EXPECT_C_STATUS(thdcp_communicator_create_shared_gpu_group(size, 0, comms), THDCP_ERROR_INVALID_ARGUMENT,
                    "thdcp_communicator_create_shared_gpu_group: size=" + std::to_string(size));
  }
  {
    std::vector<thdcp_communicator_t> largest(THDCP_MAX_GROUP_SIZE, nullptr);
    ASSERT_C_OK(thdcp_communicator_create_in_process_group(THDCP_MAX_GROUP_SIZE, largest.data()));
    int last = -1;
    EXPECT_C_OK(thdcp_communicator_rank(largest.back(), &last));
    EXPECT_EQ(last, THDCP_MAX_GROUP_SIZE - 1);
    for (thdcp_communicator_t c : largest) EXPECT_C_OK(thdcp_communicator_destroy(c));
  }
  EXPECT_C_STATUS(thdcp_communicator_create_in_process_group(2, nullptr), THDCP_ERROR_INVALID_ARGUMENT,
                  "comms is NULL");
  EXPECT_EQ(comms[0], reinterpret_cast<thdcp_communicator_t>(0x1));
  ASSERT_C_OK(thdcp_communicator_create_in_process_group(2, comms));
  int rank = -1, size = -1, is_device = -1, device = 7;
  const char* kind = nullptr;
  EXPECT_C_OK(thdcp_communicator_rank(comms[1], &rank));
  EXPECT_C_OK(thdcp_communicator_size(comms[1], &size));
  EXPECT_C_OK(thdcp_communicator_is_device(comms[1], &is_device));
  EXPECT_C_OK(thdcp_communicator_device(comms[1], &device));
  EXPECT_C_OK(thdcp_communicator_kind(comms[1], &kind));
  EXPECT_EQ(rank, 1);
  EXPECT_EQ(size, 2);
  EXPECT_EQ(is_device, 0);
  EXPECT_EQ(device, -1);
  EXPECT_STREQ(kind, "in-process");
  EXPECT_C_STATUS(thdcp_communicator_rank(nullptr, &rank), THDCP_ERROR_INVALID_ARGUMENT,
                  "thdcp_communicator_rank: comm is NULL");
  EXPECT_C_STATUS(thdcp_communicator_size(comms[0], nullptr), THDCP_ERROR_INVALID_ARGUMENT, "size is NULL");
  for (thdcp_communicator_t c : comms) EXPECT_C_OK(thdcp_communicator_destroy(c));
  EXPECT_C_OK(thdcp_communicator_destroy(nullptr));
}

TEST(CApiCommunicators, PartsMissingFromTheBuildAreUnsupported) {
  unsigned char id[THDCP_NCCL_UNIQUE_ID_BYTES] = {};
  thdcp_communicator_t comm = nullptr;
  EXPECT_C_STATUS(thdcp_nccl_unique_id(id, 64), THDCP_ERROR_INVALID_ARGUMENT,
                  "bytes=64: an NCCL unique id has THDCP_NCCL_UNIQUE_ID_BYTES=128 bytes");
  EXPECT_C_STATUS(thdcp_communicator_create_nccl(id, sizeof(id), 2, 2, 0, &comm), THDCP_ERROR_INVALID_ARGUMENT,
                  "rank=2 must be in [0, size=2)");
  EXPECT_C_STATUS(thdcp_communicator_borrow_nccl(nullptr, 0, &comm), THDCP_ERROR_INVALID_ARGUMENT,
                  "nccl_comm is NULL");
  if (!built_with(THDCP_FEATURE_NCCL)) {
    EXPECT_C_STATUS(thdcp_nccl_unique_id(id, sizeof(id)), THDCP_ERROR_UNSUPPORTED, "without");
    EXPECT_C_STATUS(thdcp_communicator_create_nccl(id, sizeof(id), 0, 1, 0, &comm), THDCP_ERROR_UNSUPPORTED,
                    "without");
    int fake = 0;
    EXPECT_C_STATUS(thdcp_communicator_borrow_nccl(&fake, 0, &comm), THDCP_ERROR_UNSUPPORTED, "without");
  }
  if (!built_with(THDCP_FEATURE_CUDA)) {
    EXPECT_C_STATUS(thdcp_communicator_create_shared_gpu_group(2, 0, &comm), THDCP_ERROR_UNSUPPORTED,
                    "built without CUDA", "-DTHDCP_WITH_CUDA=ON");
    thdcp_communicator_t host = nullptr;
    ASSERT_C_OK(thdcp_communicator_create_in_process_group(1, &host));
    thdcp_graph_bank_t bank = nullptr;
    EXPECT_C_STATUS(thdcp_graph_bank_create(host, nullptr, &bank), THDCP_ERROR_UNSUPPORTED,
                    "thdcp_graph_bank_create: graph banks: this libthdcp was built without CUDA");
    EXPECT_EQ(bank, nullptr);
    EXPECT_C_OK(thdcp_communicator_destroy(host));
  }
  if (built_with(THDCP_FEATURE_MPI)) {
    // This test never initialises MPI: the communicator says to call MPI_Init first.
    EXPECT_C_STATUS(thdcp_communicator_create_mpi_world(&comm), THDCP_ERROR_INVALID_ARGUMENT,
                    "MPI is not initialised: call MPI_Init");
  } else {
    EXPECT_C_STATUS(thdcp_communicator_create_mpi_world(&comm), THDCP_ERROR_UNSUPPORTED, "-DTHDCP_WITH_MPI=ON");
  }
  EXPECT_EQ(comm, nullptr);
  EXPECT_C_STATUS(thdcp_graph_bank_run(nullptr, nullptr, 0, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr),
                  THDCP_ERROR_INVALID_ARGUMENT, "thdcp_graph_bank_run: bank is NULL");
}

// Causal, bf16, heads 2:1, head_dim 16; capacity 4 sequences, 64 rows.
thdcp_cp_params cp_params(int cp_size) {
  thdcp_cp_params p;
  thdcp_cp_params_init(&p);
  p.cp_size = cp_size;
  test::set_shape(p, test::Shape{DType::kBFloat16, 2, 1, 16, Mask::causal()}, Capacity{4, 64});
  return p;
}

struct BadCpParams {
  void (*spoil)(thdcp_cp_params&);
  std::vector<std::string> message;
};

TEST(CApiCpPlan, BadParamsAndCommunicators) {
  thdcp_communicator_t comm = nullptr;
  ASSERT_C_OK(thdcp_communicator_create_in_process_group(1, &comm));
  thdcp_cp_plan_t plan = reinterpret_cast<thdcp_cp_plan_t>(0x1);
  thdcp_cp_params p = cp_params(2);
  EXPECT_C_STATUS(thdcp_cp_plan_create(comm, &p, nullptr, 0, &plan), THDCP_ERROR_INVALID_ARGUMENT,
                  "thdcp_cp_plan_create: params->cp_size=2 but the communicator has 1 ranks");
  EXPECT_C_STATUS(thdcp_cp_plan_create(nullptr, &p, nullptr, 0, &plan), THDCP_ERROR_INVALID_ARGUMENT,
                  "comm is NULL");
  // A field at a time set to a bad value (of cp_params(1)): the words of the message.
  const BadCpParams bad[] = {
      {[](thdcp_cp_params& q) { q.max_tokens = 63; }, {"params->max_tokens=63 must be a multiple of 2*cp_size=2"}},
      {[](thdcp_cp_params& q) { q.struct_size = 64; }, {"params->struct_size=64", "first version has 72 bytes"}},
      {[](thdcp_cp_params& q) { q.head_dim = 20; }, {"params->head_dim=20"}},
      {[](thdcp_cp_params& q) { q.softmax_scale = -1.0f; }, {"params->softmax_scale=-1 must be finite and >= 0"}},
      {[](thdcp_cp_params& q) { q.softmax_scale = -std::numeric_limits<float>::infinity(); },
       {"params->softmax_scale=-inf"}},
      {[](thdcp_cp_params& q) { q.num_threads = 1 << 30; }, {"params->num_threads=1073741824 must be in [0, "}},
      {[](thdcp_cp_params& q) { q.backward_kv_from_forward = 3; },
       {"params->backward_kv_from_forward=3 is not a thdcp_cp_backward_kv_t", "THDCP_CP_BACKWARD_KV_GATHER (0)",
        "_AUTO (2)"}},
      {[](thdcp_cp_params& q) { q.backward_kv_from_forward = -1; }, {"params->backward_kv_from_forward=-1"}},
      {[](thdcp_cp_params& q) {
         q.q_heads = 4;
         q.kv_heads = 2;
         q.reserved_head_groups = 2;
       },
       {"params->reserved_head_groups=2 must be 0 or 1"}},
      {[](thdcp_cp_params& q) {
         q.q_heads = 4;
         q.kv_heads = 2;
         q.reserved_head_groups = 1;
         q.reserved = 7;
       },
       {"params->reserved=7 must be 0"}},
  };
  for (const BadCpParams& c : bad) {
    p = cp_params(1);
    c.spoil(p);
    EXPECT_TRUE(test::status_is(thdcp_cp_plan_create(comm, &p, nullptr, 0, &plan), THDCP_ERROR_INVALID_ARGUMENT,
                                c.message));
  }
  // A caller compiled against the struct before reserved_head_groups (80 bytes): the bytes
  // past struct_size are not read.
  p = cp_params(1);
  p.struct_size = 80;
  p.reserved_head_groups = 5;  // past struct_size: not read
  thdcp_communicator_t fresh = nullptr;  // `comm` was aborted by the failed plan above
  ASSERT_C_OK(thdcp_communicator_create_in_process_group(1, &fresh));
  thdcp_cp_plan_t older = nullptr;
  EXPECT_C_OK(thdcp_cp_plan_create(fresh, &p, nullptr, 0, &older));
  EXPECT_C_OK(thdcp_cp_plan_destroy(older));
  EXPECT_C_OK(thdcp_communicator_destroy(fresh));
  p = cp_params(1);
  p.backend = THDCP_BACKEND_CUDA;
  p.head_dim = 64;
  if (built_with(THDCP_FEATURE_CUDA)) {
    EXPECT_C_STATUS(thdcp_cp_plan_create(comm, &p, nullptr, 0, &plan), THDCP_ERROR_INVALID_ARGUMENT,
                    "comm is a host communicator (in-process) but THDCP_BACKEND_CUDA needs a device communicator");
  } else {
    EXPECT_C_STATUS(thdcp_cp_plan_create(comm, &p, nullptr, 0, &plan), THDCP_ERROR_UNSUPPORTED,
                    "-DTHDCP_WITH_CUDA=ON");
  }
  EXPECT_EQ(plan, reinterpret_cast<thdcp_cp_plan_t>(0x1));
  p = cp_params(1);
  EXPECT_C_STATUS(thdcp_cp_plan_create(comm, &p, nullptr, 0, nullptr), THDCP_ERROR_INVALID_ARGUMENT, "plan is NULL");
  EXPECT_C_STATUS(thdcp_cp_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr),
                  THDCP_ERROR_INVALID_ARGUMENT, "thdcp_cp_forward: plan is NULL");
  EXPECT_C_OK(thdcp_cp_plan_destroy(nullptr));
  EXPECT_C_OK(thdcp_communicator_destroy(comm));
}

// What thdcp_cp_plan_create gave one rank: its status and thdcp_last_error() on its thread.
struct PlanAttempt {
  thdcp_status_t status = THDCP_SUCCESS;
  std::string message;
};

// Each rank of the two-rank group `comms` creates a CP plan on a thread of its own, with its
// params (none: NULL params), and destroys it.
std::vector<PlanAttempt> create_plans_on_two_threads(const thdcp_communicator_t (&comms)[2],
                                                     const std::optional<thdcp_cp_params>& rank0_params,
                                                     const std::optional<thdcp_cp_params>& rank1_params) {
  const std::optional<thdcp_cp_params>* params[2] = {&rank0_params, &rank1_params};
  std::vector<PlanAttempt> attempts(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      thdcp_cp_plan_t plan = nullptr;
      attempts[r].status = thdcp_cp_plan_create(comms[r], *params[r] ? &**params[r] : nullptr, nullptr, 0, &plan);
      attempts[r].message = thdcp_last_error();
      thdcp_cp_plan_destroy(plan);
    });
  }
  for (auto& t : ranks) t.join();
  return attempts;
}

// A collective call that fails on one rank releases the others: the in-process group is
// aborted, the other rank's call fails with THDCP_ERROR_COMMUNICATION (instead of waiting
// forever), and so does every later collective.
TEST(CApiCpPlan, AFailingRankReleasesTheOthers) {
  thdcp_communicator_t comms[2] = {nullptr, nullptr};
  ASSERT_C_OK(thdcp_communicator_create_in_process_group(2, comms));
  // Rank 0's own check fails before it enters the plan's collective; rank 1 enters it.
  const std::vector<PlanAttempt> got = create_plans_on_two_threads(comms, std::nullopt, cp_params(2));
  EXPECT_EQ(got[0].status, THDCP_ERROR_INVALID_ARGUMENT) << got[0].message;
  EXPECT_NE(got[0].message.find("params is NULL"), std::string::npos) << got[0].message;
  EXPECT_EQ(got[1].status, THDCP_ERROR_COMMUNICATION) << got[1].message;
  EXPECT_NE(got[1].message.find("another rank failed"), std::string::npos) << got[1].message;
  EXPECT_NE(got[1].message.find("rank 0 failed: thdcp_cp_plan_create: params is NULL"), std::string::npos)
      << got[1].message;
  // The group stays aborted.
  thdcp_cp_params p = cp_params(2);
  thdcp_cp_plan_t plan = nullptr;
  EXPECT_C_STATUS(thdcp_cp_plan_create(comms[1], &p, nullptr, 0, &plan), THDCP_ERROR_COMMUNICATION,
                  "another rank failed");
  for (thdcp_communicator_t c : comms) EXPECT_C_OK(thdcp_communicator_destroy(c));
}

// Ranks that plan different problems are told so on every rank, naming the difference.
TEST(CApiCpPlan, RanksThatDisagreeAreRefusedOnEveryRank) {
  thdcp_communicator_t comms[2] = {nullptr, nullptr};
  ASSERT_C_OK(thdcp_communicator_create_in_process_group(2, comms));
  thdcp_cp_params more_heads = cp_params(2);
  more_heads.q_heads = 4;
  const std::vector<PlanAttempt> got = create_plans_on_two_threads(comms, cp_params(2), more_heads);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[r].status, THDCP_ERROR_INVALID_ARGUMENT) << got[r].message;
    EXPECT_NE(got[r].message.find("rank 1 passed heads 4:1 head_dim 16 but rank 0 passed 2:1"), std::string::npos)
        << got[r].message;
  }
  for (thdcp_communicator_t c : comms) EXPECT_C_OK(thdcp_communicator_destroy(c));
}

TEST(CApiSplit, BadArgumentsWriteNothing) {
  const BatchLayout layout = make_layout({5, 11}, 2);  // rows 8 + 12 = 20
  const thdcp_layout_t c = c_layout(layout);
  std::vector<int32_t> rows(10, -7);
  Snapshot snapshot;
  snapshot.add(rows.data(), rows.size() * sizeof(int32_t));
  EXPECT_C_STATUS(thdcp_cp_local_rows(&c, 2, 2, rows.data(), 10), THDCP_ERROR_INVALID_ARGUMENT,
                  "rank=2 must be in [0, cp=2)");
  EXPECT_C_STATUS(thdcp_cp_local_rows(&c, 0, 0, rows.data(), 10), THDCP_ERROR_INVALID_ARGUMENT, "cp=0 must be >= 1");
  EXPECT_C_STATUS(thdcp_cp_local_rows(&c, 2, 1, rows.data(), 9), THDCP_ERROR_INVALID_ARGUMENT,
                  "num_rows=9 but rank 1 of cp=2 holds T / cp = 10 rows");
  EXPECT_C_STATUS(thdcp_cp_local_rows(&c, 3, 1, rows.data(), 10), THDCP_ERROR_INVALID_ARGUMENT, "multiple of 2*cp=6");
  EXPECT_C_STATUS(thdcp_cp_local_rows(nullptr, 2, 1, rows.data(), 10), THDCP_ERROR_INVALID_ARGUMENT,
                  "layout is NULL");
  std::vector<float> global(20, 1.0f), local(10, -1.0f);
  snapshot.add(local);
  EXPECT_C_STATUS(thdcp_cp_split(global.data(), nullptr, 4, &c, 2, 0), THDCP_ERROR_INVALID_ARGUMENT,
                  "local is NULL");
  EXPECT_C_STATUS(thdcp_cp_split(global.data(), local.data(), 0, &c, 2, 0), THDCP_ERROR_INVALID_ARGUMENT,
                  "row_bytes=0");
  EXPECT_TRUE(snapshot.unchanged());
  EXPECT_C_OK(thdcp_cp_local_rows(&c, 2, 1, rows.data(), 10));
  // Rank 1 of cp = 2 holds chunks 1 and 2 of each sequence (chunk rows 2 and 3).
  EXPECT_EQ(rows, (std::vector<int32_t>{2, 3, 4, 5, 11, 12, 13, 14, 15, 16}));
}

TEST(CApiCapacity, HelpersAndTheirErrors) {
  thdcp_capacity_t capacity{};
  EXPECT_C_OK(thdcp_capacity_default(16384, 2, &capacity));
  EXPECT_EQ(capacity.max_tokens, 16384);
  EXPECT_EQ(capacity.max_seqs, 16384 / 4 + 1);
  EXPECT_C_STATUS(thdcp_capacity_default(100, 4, &capacity), THDCP_ERROR_INVALID_ARGUMENT,
                  "max_tokens=100 must be a positive multiple of 2*cp=8");
  const int64_t lengths[] = {5, 0, 11};
  thdcp_fit_t fit = THDCP_FIT_TOO_MANY_TOKENS;
  const thdcp_capacity_t small{32, 3};
  EXPECT_C_OK(thdcp_capacity_check_fit(lengths, 3, 2, &small, &fit));
  EXPECT_EQ(fit, THDCP_FIT_FITS);
  const thdcp_capacity_t two_seqs{32, 2};
  EXPECT_C_OK(thdcp_capacity_check_fit(lengths, 3, 2, &two_seqs, &fit));
  EXPECT_EQ(fit, THDCP_FIT_TOO_MANY_SEQUENCES);
  const int64_t negative[] = {5, -1};
  EXPECT_C_STATUS(thdcp_capacity_check_fit(negative, 2, 2, &small, &fit), THDCP_ERROR_INVALID_ARGUMENT,
                  "lengths[1]=-1 is negative");
  EXPECT_C_STATUS(thdcp_capacity_check_fit(nullptr, 2, 2, &small, &fit), THDCP_ERROR_INVALID_ARGUMENT,
                  "lengths is NULL but num_documents=2");
  int32_t cu[4] = {-1, -1, -1, -1}, cup[4] = {-1, -1, -1, -1};
  EXPECT_C_OK(thdcp_capacity_layout(lengths, 3, 2, &small, cu, cup));
  EXPECT_EQ(std::vector<int32_t>(cu, cu + 4), (std::vector<int32_t>{0, 5, 16, 16}));
  EXPECT_EQ(std::vector<int32_t>(cup, cup + 4), (std::vector<int32_t>{0, 8, 20, 32}));
  int64_t rows = 0;
  EXPECT_C_OK(thdcp_padded_rows(lengths, 3, 2, &rows));
  EXPECT_EQ(rows, 20);
  const int32_t sizes[] = {1, 2, 4};
  int32_t chosen = 0;
  EXPECT_C_OK(thdcp_choose_cp_size(lengths, 3, sizes, 3, 10, &chosen));
  EXPECT_EQ(chosen, 2);

  std::vector<int64_t> docs;
  for (int i = 0; i < 200; ++i) docs.push_back(1 + (i * 37) % 300);
  thdcp_capacity_plan_params params = THDCP_CAPACITY_PLAN_PARAMS_INIT;
  params.tokens = 2048;
  params.cp_size = 2;
  thdcp_capacity_plan_result result{};
  result.struct_size = sizeof(result);
  EXPECT_C_OK(thdcp_plan_capacity(docs.data(), static_cast<int64_t>(docs.size()), &params, &result));
  EXPECT_EQ(result.struct_size, sizeof(result));
  EXPECT_EQ(result.capacity.max_tokens, 2048);
  EXPECT_GE(result.capacity.max_seqs, 2);
  EXPECT_GT(result.batches, 0);
  EXPECT_LE(result.fallback_fraction, 0.01);
  result.struct_size = 40;
  EXPECT_C_STATUS(thdcp_plan_capacity(docs.data(), static_cast<int64_t>(docs.size()), &params, &result),
                  THDCP_ERROR_INVALID_ARGUMENT, "result->struct_size=40", "first version has 64 bytes");
  result.struct_size = sizeof(result);
  params.tokens = 64;
  EXPECT_C_STATUS(thdcp_plan_capacity(docs.data(), static_cast<int64_t>(docs.size()), &params, &result),
                  THDCP_ERROR_INVALID_ARGUMENT, "thdcp_plan_capacity: lengths: document 2 has 75 tokens",
                  "a batch holds tokens=64 rows");
  params.long_documents = 1;  // split them
  EXPECT_C_OK(thdcp_plan_capacity(docs.data(), static_cast<int64_t>(docs.size()), &params, &result));
}

}  // namespace
}  // namespace thdcp
