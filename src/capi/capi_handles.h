// The C ABI's handles: the registry that checks them, what a communicator handle holds, and
// the checks shared by the files that take one.
//
// A handle the library gives out is not the address of its object: it is a value drawn once
// per process that a registry maps to the object while the handle lives. Every entry point
// looks its handles up before using them and destroy removes a handle first, so a handle that
// was destroyed, that the library never made (zeroed or foreign memory, a stack struct cast
// to a handle) or that is of another kind is refused with THDCP_ERROR_INVALID_HANDLE without
// anything being read through it (the checks of CUDA's and NCCL's handles, without their
// dereference). Values are never reused, so a stale handle cannot reach a newer object that
// happens to live at the old address. The C handle types stay incomplete in the library, so
// the compiler refuses a dereference of a handle.
//
// The registry owns each object through a shared_ptr, and a lookup hands the call its own
// reference: a plan or bank also holds its communicator's, so a communicator destroyed before
// them (or a handle destroyed by another thread during a call) is released only once nothing
// uses it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "capi_status.h"
#include "thdcp/comm/communicator.h"
#include "thdcp/thdcp.h"

#if defined(THDCP_HAVE_CUDA)
#include "thdcp/comm_device/device_communicator.h"
#include "thdcp/comm_device/shared_gpu.h"
#endif

namespace thdcp::capi {

// The library's objects behind the handles (each defined in the file of its area).
struct AttentionPlan;
struct Comm;
struct CpPlan;
struct GraphBank;

enum class HandleKind { kAttentionPlan, kCommunicator, kCpPlan, kGraphBank };

template <typename Object>
struct HandleTraits;
template <>
struct HandleTraits<AttentionPlan> {
  using Handle = thdcp_attention_plan_t;
  static constexpr HandleKind kKind = HandleKind::kAttentionPlan;
};
template <>
struct HandleTraits<Comm> {
  using Handle = thdcp_communicator_t;
  static constexpr HandleKind kKind = HandleKind::kCommunicator;
};
template <>
struct HandleTraits<CpPlan> {
  using Handle = thdcp_cp_plan_t;
  static constexpr HandleKind kKind = HandleKind::kCpPlan;
};
template <>
struct HandleTraits<GraphBank> {
  using Handle = thdcp_graph_bank_t;
  static constexpr HandleKind kKind = HandleKind::kGraphBank;
};

template <typename Object>
using HandleOf = typename HandleTraits<Object>::Handle;

namespace detail {

// Registers every object (all or none: bad_alloc registers none) and returns their values.
std::vector<uintptr_t> publish(HandleKind kind, const std::vector<std::shared_ptr<void>>& objects);
// The object of a live handle of `kind`; with `retire`, the handle is removed as well. A
// value that is not one throws THDCP_ERROR_INVALID_HANDLE naming `argument`; NULL throws
// THDCP_ERROR_INVALID_ARGUMENT ("<argument> is NULL"). Never reads through `value`.
std::shared_ptr<void> find(HandleKind kind, uintptr_t value, const char* argument, bool retire);

}  // namespace detail

// The handles of new objects, registered together (a group's ranks): written by the caller
// to its outputs only after this returns.
template <typename Object>
std::vector<HandleOf<Object>> publish_all(const std::vector<std::shared_ptr<Object>>& objects) {
  const std::vector<std::shared_ptr<void>> erased(objects.begin(), objects.end());
  const std::vector<uintptr_t> values = detail::publish(HandleTraits<Object>::kKind, erased);
  std::vector<HandleOf<Object>> handles;
  handles.reserve(values.size());
  for (uintptr_t value : values) handles.push_back(reinterpret_cast<HandleOf<Object>>(value));
  return handles;
}

template <typename Object>
HandleOf<Object> publish(std::shared_ptr<Object> object) {
  return publish_all<Object>({std::move(object)}).front();
}

// The live object of `handle` (argument: its parameter's name, "plan"), kept alive for the
// caller's call. NULL: THDCP_ERROR_INVALID_ARGUMENT; not a live handle of this kind:
// THDCP_ERROR_INVALID_HANDLE.
template <typename Object>
std::shared_ptr<Object> lookup(HandleOf<Object> handle, const char* argument) {
  return std::static_pointer_cast<Object>(
      detail::find(HandleTraits<Object>::kKind, reinterpret_cast<uintptr_t>(handle), argument, false));
}

// Ends `handle`: removes it from the registry and returns its object, released when the
// last reference goes. NULL: nullptr (destroy(NULL) is a no-op). Not a live handle of this
// kind: THDCP_ERROR_INVALID_HANDLE, and nothing is released.
template <typename Object>
std::shared_ptr<Object> retire(HandleOf<Object> handle, const char* argument) {
  if (handle == nullptr) return nullptr;
  return std::static_pointer_cast<Object>(
      detail::find(HandleTraits<Object>::kKind, reinterpret_cast<uintptr_t>(handle), argument, true));
}

// One rank of a group: a host communicator or a device one, and the group it can abort.
struct Comm {
  std::unique_ptr<Communicator> host;
  std::shared_ptr<InProcessGroup> in_process;  // set for in-process ranks
#if defined(THDCP_HAVE_CUDA)
  std::unique_ptr<DeviceCommunicator> device;
  std::shared_ptr<SharedGpuGroup> shared_gpu;  // set for shared-GPU ranks
#endif

  bool is_device() const;
  int rank() const;
  int size() const;
  const char* kind() const;
  // After a collective call failed on this rank: releases the group's other ranks (in-process
  // and shared-GPU groups; nothing for MPI and NCCL). Never throws.
  void abort_group(const char* reason) noexcept;
};

// Throws THDCP_ERROR_UNSUPPORTED unless this build has CUDA and a GPU is visible: the
// message says to rebuild with -DTHDCP_WITH_CUDA=ON, or that no GPU is visible. `what`
// names the caller's request ("params->backend=THDCP_BACKEND_CUDA").
void require_cuda_device(const char* what);
// Throws THDCP_ERROR_UNSUPPORTED unless this build has CUDA (no device needed).
void require_cuda_build(const char* what);

// Runs body(group) as guarded() does. The body sets `group` to the communicator of the
// collective as soon as it has looked it up; when the call fails, that group is aborted so
// that its other ranks do not wait forever for this one. A call that fails before it has the
// communicator (a bad handle) cannot tell the group.
template <typename Body>
thdcp_status_t guarded_collective(const char* function, Body&& body) noexcept {
  std::shared_ptr<Comm> group;
  const thdcp_status_t status = guarded(function, [&] { body(group); });
  if (status != THDCP_SUCCESS && group) group->abort_group(last_error());
  return status;
}

}  // namespace thdcp::capi
