// The ledger behind KvSource::kAuto: for each workspace (by its base address, which plans
// sharing a graph::WorkspaceArena have in common), the plan whose forward last wrote it and
// on which tensors, layout and stream. A backward on kAuto takes the forward's K/V when the
// ledger says that forward is still what the workspace holds, and gathers them again
// otherwise. Host only (a mutex and pointer comparisons): capture-safe; plans enter the
// ledger at plan time, so the run path allocates nothing.
#pragma once

#include <cuda_runtime_api.h>

#include "thdcp/plan/attention_shape.h"
#include "thdcp/plan/layout.h"

namespace thdcp::cp::detail {

// What a forward ran on, as far as its backward must match it to reuse what it left.
struct ForwardStamp {
  const void* plan = nullptr;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* out = nullptr;
  const float* lse = nullptr;
  int64_t strides[6] = {};  // q, k, v row and head strides
  const int32_t* cu_seqlens = nullptr;
  const int32_t* cu_seqlens_padded = nullptr;
  cudaStream_t stream = nullptr;
};

ForwardStamp stamp_of(const void* plan, const DeviceLayout& layout, const ForwardTensors& t, cudaStream_t stream);
ForwardStamp stamp_of(const void* plan, const DeviceLayout& layout, const BackwardTensors& t, cudaStream_t stream);

// A plan over the workspace at `base` enters (plan time) and leaves (its destructor).
void ledger_enter(const void* base);
void ledger_leave(const void* base);

// A forward of `stamp.plan` wrote the workspace at `base`.
void ledger_forward(const void* base, const ForwardStamp& stamp);
// A backward is about to run on the workspace at `base`: whether the forward the ledger holds
// is `stamp`'s (same plan, tensors, layout and stream). The entry is cleared either way (the
// backward uses the workspace; a later backward gathers again unless a forward comes first).
bool ledger_backward(const void* base, const ForwardStamp& stamp);

}  // namespace thdcp::cp::detail
