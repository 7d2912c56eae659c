// Checked handles: a handle destroyed already, one the library never made (zeroed memory, a
// stack object, an unreadable page), or one of another type is refused with
// THDCP_ERROR_INVALID_HANDLE, naming the function and the argument, without being read
// through (the unreadable page would fault) and without anything being written or released;
// a stale handle never reaches a newer object; and a communicator destroyed before its CP
// plan stays usable by the plan.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "support/capi/capi_support.h"
#include "support/outputs.h"
#include "support/random_batch.h"
#include "thdcp/thdcp.h"

namespace thdcp {
namespace {

using test::c_layout;
using test::c_tensor;
using test::Outputs;
using test::Snapshot;

// Causal, fp32, heads 2:1, head_dim 8; capacity 2 sequences, 16 rows.
thdcp_attention_params attention_params() {
  thdcp_attention_params p = THDCP_ATTENTION_PARAMS_INIT;
  test::set_shape(p, test::Shape{DType::kFloat32, 2, 1, 8, Mask::causal()}, Capacity{2, 16});
  p.num_threads = 1;
  return p;
}

thdcp_cp_params cp_params() {
  thdcp_cp_params p = THDCP_CP_PARAMS_INIT;
  test::set_shape(p, test::Shape{DType::kFloat32, 2, 1, 8, Mask::causal()}, Capacity{2, 16});
  p.cp_size = 1;
  p.num_threads = 1;
  return p;
}

// A page that faults on any access: a handle pointing into it proves that no check reads
// through the handle (ASan aside, the read would crash the test).
class UnreadablePage {
 public:
  UnreadablePage() {
    page_ = mmap(nullptr, kBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(page_, MAP_FAILED);
  }
  ~UnreadablePage() { munmap(page_, kBytes); }
  template <typename Handle>
  Handle as() const {
    return reinterpret_cast<Handle>(static_cast<unsigned char*>(page_) + 64);
  }

 private:
  static constexpr size_t kBytes = 4096;
  void* page_ = nullptr;
};

// The words of every refusal of a handle that is not live.
std::vector<std::string> not_live(const std::string& function, const std::string& argument, const char* type) {
  return {function + ": " + argument + "=0x", std::string("is not a live ") + type, "destroyed already"};
}

TEST(CApiHandles, StatusName) {
  EXPECT_STREQ(thdcp_status_name(THDCP_ERROR_INVALID_HANDLE), "THDCP_ERROR_INVALID_HANDLE");
  EXPECT_EQ(static_cast<int>(THDCP_ERROR_INVALID_HANDLE), 7) << "appended: earlier statuses keep their values";
}

TEST(CApiHandles, ASecondDestroyIsRefusedForEveryType) {
  const thdcp_attention_params ap = attention_params();
  thdcp_attention_plan_t plan = nullptr;
  ASSERT_C_OK(thdcp_attention_plan_create(&ap, nullptr, 0, &plan));
  EXPECT_C_OK(thdcp_attention_plan_destroy(plan));
  EXPECT_TRUE(test::status_is(thdcp_attention_plan_destroy(plan), THDCP_ERROR_INVALID_HANDLE,
                              not_live("thdcp_attention_plan_destroy", "plan", "thdcp_attention_plan_t")));
  EXPECT_NE(std::string(thdcp_last_error()).find("nothing was released"), std::string::npos) << thdcp_last_error();

  thdcp_communicator_t comm = nullptr;
  ASSERT_C_OK(thdcp_communicator_create_in_process_group(1, &comm));
  const thdcp_cp_params cpp = cp_params();
  thdcp_cp_plan_t cp_plan = nullptr;
  ASSERT_C_OK(thdcp_cp_plan_create(comm, &cpp, nullptr, 0, &cp_plan));
  EXPECT_C_OK(thdcp_cp_plan_destroy(cp_plan));
  EXPECT_TRUE(test::status_is(thdcp_cp_plan_destroy(cp_plan), THDCP_ERROR_INVALID_HANDLE,
                              not_live("thdcp_cp_plan_destroy", "plan", "thdcp_cp_plan_t")));
  EXPECT_C_OK(thdcp_communicator_destroy(comm));
  EXPECT_TRUE(test::status_is(thdcp_communicator_destroy(comm), THDCP_ERROR_INVALID_HANDLE,
                              not_live("thdcp_communicator_destroy", "comm", "thdcp_communicator_t")));

  // Graph banks need CUDA and a GPU to exist; a value the library never returned stands in.
  const UnreadablePage page;
  EXPECT_TRUE(test::status_is(thdcp_graph_bank_destroy(page.as<thdcp_graph_bank_t>()), THDCP_ERROR_INVALID_HANDLE,
                              not_live("thdcp_graph_bank_destroy", "bank", "thdcp_graph_bank_t")));
  // NULL stays a no-op.
  EXPECT_C_OK(thdcp_attention_plan_destroy(nullptr));
  EXPECT_C_OK(thdcp_communicator_destroy(nullptr));
  EXPECT_C_OK(thdcp_cp_plan_destroy(nullptr));
  EXPECT_C_OK(thdcp_graph_bank_destroy(nullptr));
}

TEST(CApiHandles, ValuesTheLibraryNeverMadeAreRefusedWithoutBeingRead) {
  const UnreadablePage page;
  std::vector<unsigned char> zeroed(256, 0);
  struct Foreign {
    int64_t words[8];
  } on_stack{};
  const std::vector<std::pair<std::string, void*>> values = {
      {"an unreadable page", page.as<void*>()}, {"zeroed memory", zeroed.data()}, {"a stack struct", &on_stack}};
  for (const auto& [label, value] : values) {
    SCOPED_TRACE(label);
    auto* plan = static_cast<thdcp_attention_plan_t>(value);
    auto* comm = static_cast<thdcp_communicator_t>(value);
    auto* cp_plan = static_cast<thdcp_cp_plan_t>(value);
    auto* bank = static_cast<thdcp_graph_bank_t>(value);
    EXPECT_TRUE(test::status_is(thdcp_attention_plan_destroy(plan), THDCP_ERROR_INVALID_HANDLE,
                                not_live("thdcp_attention_plan_destroy", "plan", "thdcp_attention_plan_t")));
    EXPECT_TRUE(test::status_is(thdcp_communicator_destroy(comm), THDCP_ERROR_INVALID_HANDLE,
                                not_live("thdcp_communicator_destroy", "comm", "thdcp_communicator_t")));
    EXPECT_TRUE(test::status_is(thdcp_cp_plan_destroy(cp_plan), THDCP_ERROR_INVALID_HANDLE,
                                not_live("thdcp_cp_plan_destroy", "plan", "thdcp_cp_plan_t")));
    EXPECT_TRUE(test::status_is(thdcp_graph_bank_destroy(bank), THDCP_ERROR_INVALID_HANDLE,
                                not_live("thdcp_graph_bank_destroy", "bank", "thdcp_graph_bank_t")));
    int rank = -5;
    EXPECT_TRUE(test::status_is(thdcp_communicator_rank(comm, &rank), THDCP_ERROR_INVALID_HANDLE,
                                not_live("thdcp_communicator_rank", "comm", "thdcp_communicator_t")));
    EXPECT_EQ(rank, -5);
    EXPECT_TRUE(test::status_is(
        thdcp_attention_forward(plan, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr),
        THDCP_ERROR_INVALID_HANDLE, not_live("thdcp_attention_forward", "plan", "thdcp_attention_plan_t")));
    EXPECT_TRUE(test::status_is(
        thdcp_cp_backward(cp_plan, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                          nullptr, nullptr),
        THDCP_ERROR_INVALID_HANDLE, not_live("thdcp_cp_backward", "plan", "thdcp_cp_plan_t")));
    const thdcp_cp_params p = cp_params();
    thdcp_cp_plan_t made = nullptr;
    EXPECT_TRUE(test::status_is(thdcp_cp_plan_create(comm, &p, nullptr, 0, &made), THDCP_ERROR_INVALID_HANDLE,
                                not_live("thdcp_cp_plan_create", "comm", "thdcp_communicator_t")));
    EXPECT_EQ(made, nullptr);
    size_t bytes = 77;
    EXPECT_TRUE(test::status_is(thdcp_graph_bank_device_bytes(bank, &bytes), THDCP_ERROR_INVALID_HANDLE,
                                not_live("thdcp_graph_bank_device_bytes", "bank", "thdcp_graph_bank_t")));
    EXPECT_EQ(bytes, 77u);
  }
  EXPECT_EQ(zeroed, std::vector<unsigned char>(256, 0)) << "nothing was written through a foreign handle";
}

// A handle of one type passed as another is named for what it is, and nothing is released.
TEST(CApiHandles, AHandleOfAnotherTypeIsRefused) {
  thdcp_communicator_t comm = nullptr;
  ASSERT_C_OK(thdcp_communicator_create_in_process_group(1, &comm));
  auto* as_plan = reinterpret_cast<thdcp_attention_plan_t>(comm);
  EXPECT_C_STATUS(thdcp_attention_plan_destroy(as_plan), THDCP_ERROR_INVALID_HANDLE,
                  "thdcp_attention_plan_destroy: plan=0x",
                  "is a live thdcp_communicator_t, not a thdcp_attention_plan_t, so nothing was released",
                  "thdcp_communicator_destroy");
  EXPECT_C_STATUS(
      thdcp_attention_forward(as_plan, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr),
      THDCP_ERROR_INVALID_HANDLE, "is a live thdcp_communicator_t, not a thdcp_attention_plan_t");
  int size = 0;
  EXPECT_C_OK(thdcp_communicator_size(comm, &size));
  EXPECT_EQ(size, 1) << "the communicator survived";
  EXPECT_C_OK(thdcp_communicator_destroy(comm));
}

// Destroying A and making B (which the allocator may place where A was) leaves A's handle
// dead: a second destroy of A does not release B, and B still runs.
TEST(CApiHandles, AStaleHandleNeverReachesANewerObject) {
  const thdcp_attention_params p = attention_params();
  thdcp_attention_plan_t first = nullptr, second = nullptr;
  ASSERT_C_OK(thdcp_attention_plan_create(&p, nullptr, 0, &first));
  ASSERT_C_OK(thdcp_attention_plan_destroy(first));
  ASSERT_C_OK(thdcp_attention_plan_create(&p, nullptr, 0, &second));
  EXPECT_NE(first, second) << "handle values are never reused";
  EXPECT_C_STATUS(thdcp_attention_plan_destroy(first), THDCP_ERROR_INVALID_HANDLE, "is not a live");

  const test::Batch b = test::make_batch(make_layout({5, 9}, 1), DType::kFloat32, 2, 1, 8, 21);
  Outputs r = test::poisoned_outputs(b, b.q.tokens(), DType::kFloat32, DType::kFloat32);
  const thdcp_layout_t layout = c_layout(b.layout);
  const thdcp_tensor_t q = c_tensor(b.q), k = c_tensor(b.k), v = c_tensor(b.v), out = c_tensor(r.out);
  Snapshot snapshot;
  snapshot.add(r.out).add(r.lse);
  EXPECT_C_STATUS(thdcp_attention_forward(first, &layout, &q, &k, &v, &out, r.lse.data(), nullptr, nullptr),
                  THDCP_ERROR_INVALID_HANDLE, "thdcp_attention_forward: plan=0x", "is not a live");
  EXPECT_TRUE(snapshot.unchanged()) << "a use after destroy wrote the outputs";
  EXPECT_C_OK(thdcp_attention_forward(second, &layout, &q, &k, &v, &out, r.lse.data(), nullptr, nullptr));
  EXPECT_FALSE(snapshot.unchanged()) << "the live plan ran";
  EXPECT_C_OK(thdcp_attention_plan_destroy(second));
}

// A CP forward of cp = 1 over `plan` into poisoned outputs.
Outputs cp_forward(thdcp_cp_plan_t plan, const test::Batch& b, thdcp_status_t expected) {
  Outputs r = test::poisoned_outputs(b, b.q.tokens(), DType::kFloat32, DType::kFloat32);
  const thdcp_layout_t layout = c_layout(b.layout);
  const thdcp_tensor_t q = c_tensor(b.q), k = c_tensor(b.k), v = c_tensor(b.v), out = c_tensor(r.out);
  EXPECT_TRUE(test::status_is(
      thdcp_cp_forward(plan, &layout, &q, &k, &v, &out, r.lse.data(), r.max_logit.data(), nullptr), expected));
  return r;
}

// The plan holds its communicator: destroying the communicator first ends its handle only.
TEST(CApiHandles, ACommunicatorDestroyedBeforeItsPlanStaysUsableByThePlan) {
  const test::Batch b = test::make_batch(make_layout({5, 9}, 1), DType::kFloat32, 2, 1, 8, 22);
  thdcp_communicator_t comm = nullptr;
  ASSERT_C_OK(thdcp_communicator_create_in_process_group(1, &comm));
  const thdcp_cp_params p = cp_params();
  thdcp_cp_plan_t plan = nullptr;
  ASSERT_C_OK(thdcp_cp_plan_create(comm, &p, nullptr, 0, &plan));
  const Outputs before = cp_forward(plan, b, THDCP_SUCCESS);
  EXPECT_C_OK(thdcp_communicator_destroy(comm));
  int rank = -1;
  EXPECT_C_STATUS(thdcp_communicator_rank(comm, &rank), THDCP_ERROR_INVALID_HANDLE, "is not a live");
  const Outputs after = cp_forward(plan, b, THDCP_SUCCESS);
  EXPECT_TRUE(test::same_bits(after.out, before.out));
  EXPECT_TRUE(test::same_bits(after.lse, before.lse));
  EXPECT_FALSE(std::isnan(before.lse[0])) << "the forward wrote lse";
  EXPECT_C_OK(thdcp_cp_plan_destroy(plan));
  const Outputs destroyed = cp_forward(plan, b, THDCP_ERROR_INVALID_HANDLE);
  EXPECT_FALSE(test::same_bits(destroyed.out, before.out)) << "a destroyed plan wrote the outputs";
}

}  // namespace
}  // namespace thdcp
