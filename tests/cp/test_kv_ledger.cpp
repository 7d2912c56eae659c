// The ledger behind cp::KvSource::kAuto (host only, no GPU): a backward reuses the forward's
// K/V only when the last forward over its workspace was its own plan's, on the same tensors,
// strides, layout and stream, with no backward since; anything else, including another plan
// over the same memory (a graph::WorkspaceArena), makes it gather again.
#include <gtest/gtest.h>

#include "cp/kv_ledger.h"

namespace thdcp::cp::detail {
namespace {

// Addresses that are never dereferenced: the ledger compares them only.
const void* at(uintptr_t address) { return reinterpret_cast<const void*>(address); }

ForwardStamp stamp(const void* plan, uintptr_t k = 0x2000) {
  ForwardStamp s;
  s.plan = plan;
  s.q = at(0x1000);
  s.k = at(k);
  s.v = at(0x3000);
  s.out = at(0x4000);
  s.lse = static_cast<const float*>(at(0x5000));
  for (int i = 0; i < 6; ++i) s.strides[i] = 128 * (i + 1);
  s.cu_seqlens = static_cast<const int32_t*>(at(0x6000));
  s.cu_seqlens_padded = static_cast<const int32_t*>(at(0x7000));
  s.stream = reinterpret_cast<cudaStream_t>(0x8000);
  return s;
}

class KvLedger : public ::testing::Test {
 protected:
  void SetUp() override { ledger_enter(base_); }
  void TearDown() override { ledger_leave(base_); }
  const void* base_ = at(0x100000);
  const void* plan_ = at(0x10);
};

TEST_F(KvLedger, ABackwardRightAfterItsForwardReusesItOnce) {
  ledger_forward(base_, stamp(plan_));
  EXPECT_TRUE(ledger_backward(base_, stamp(plan_)));
  EXPECT_FALSE(ledger_backward(base_, stamp(plan_))) << "a second backward must gather again";
  ledger_forward(base_, stamp(plan_));  // activation checkpointing's recompute
  EXPECT_TRUE(ledger_backward(base_, stamp(plan_)));
}

TEST_F(KvLedger, NoForwardYetMeansGather) { EXPECT_FALSE(ledger_backward(base_, stamp(plan_))); }

TEST_F(KvLedger, AnyDifferenceFromTheForwardMeansGather) {
  auto differs = [&](auto change) {
    ledger_forward(base_, stamp(plan_));
    ForwardStamp s = stamp(plan_);
    change(s);
    return !ledger_backward(base_, s);
  };
  EXPECT_TRUE(differs([](ForwardStamp& s) { s.q = at(0x1100); }));
  EXPECT_TRUE(differs([](ForwardStamp& s) { s.k = at(0x2100); }));
  EXPECT_TRUE(differs([](ForwardStamp& s) { s.v = at(0x3100); }));
  EXPECT_TRUE(differs([](ForwardStamp& s) { s.out = at(0x4100); }));
  EXPECT_TRUE(differs([](ForwardStamp& s) { s.lse = static_cast<const float*>(at(0x5100)); }));
  EXPECT_TRUE(differs([](ForwardStamp& s) { s.strides[3] += 1; }));
  EXPECT_TRUE(differs([](ForwardStamp& s) { s.cu_seqlens = static_cast<const int32_t*>(at(0x6100)); }));
  EXPECT_TRUE(differs([](ForwardStamp& s) { s.cu_seqlens_padded = static_cast<const int32_t*>(at(0x7100)); }));
  EXPECT_TRUE(differs([](ForwardStamp& s) { s.stream = reinterpret_cast<cudaStream_t>(0x8100); }));
  EXPECT_TRUE(differs([&](ForwardStamp& s) { s.plan = at(0x20); }));
  EXPECT_FALSE(differs([](ForwardStamp&) {}));  // the same stamp: reused
}

TEST_F(KvLedger, AnotherForwardOnTheSameWorkspaceInBetweenMeansGather) {
  // The same plan on another layer's tensors (the forwards of a stack before its backwards).
  ledger_forward(base_, stamp(plan_));
  ledger_forward(base_, stamp(plan_, 0x2200));
  EXPECT_FALSE(ledger_backward(base_, stamp(plan_)));
  // Another plan over the same memory (an arena shared by every CP size).
  const void* other = at(0x30);
  ledger_enter(base_);
  ledger_forward(base_, stamp(plan_));
  ledger_forward(base_, stamp(other));
  EXPECT_FALSE(ledger_backward(base_, stamp(plan_)));
  // Its backward in between clears the forward too.
  ledger_forward(base_, stamp(plan_));
  EXPECT_FALSE(ledger_backward(base_, stamp(other)));
  EXPECT_FALSE(ledger_backward(base_, stamp(plan_)));
  ledger_leave(base_);
}

TEST_F(KvLedger, WorkspacesAreKeptApartAndAPlanLeavingClearsItsMemory) {
  const void* second = at(0x200000);
  ledger_enter(second);
  ledger_forward(base_, stamp(plan_));
  ledger_forward(second, stamp(at(0x40)));  // another plan's own workspace: no effect on base_
  EXPECT_TRUE(ledger_backward(base_, stamp(plan_)));
  EXPECT_TRUE(ledger_backward(second, stamp(at(0x40))));
  ledger_leave(second);
  // A workspace no plan entered (or every plan left) records nothing.
  ledger_forward(second, stamp(at(0x40)));
  EXPECT_FALSE(ledger_backward(second, stamp(at(0x40))));
  // A plan that leaves shared memory takes what it wrote with it: a new plan at its address
  // must not find it.
  ledger_enter(base_);
  ledger_forward(base_, stamp(plan_));
  ledger_leave(base_);
  EXPECT_FALSE(ledger_backward(base_, stamp(plan_)));
}

}  // namespace
}  // namespace thdcp::cp::detail
