// What the C ABI's communicator handle holds, and the checks shared by the files that take
// one: its family (host or device) and whether the CUDA backend can run here at all.
#pragma once

#include <memory>
#include <string>

#include "capi_status.h"
#include "thdcp/comm/communicator.h"
#include "thdcp/thdcp.h"

#if defined(THDCP_HAVE_CUDA)
#include "thdcp/comm_device/device_communicator.h"
#include "thdcp/comm_device/shared_gpu.h"
#endif

// One rank of a group: a host communicator or a device one, and the group it can abort.
struct thdcp_communicator_st {
  std::unique_ptr<thdcp::Communicator> host;
  std::shared_ptr<thdcp::InProcessGroup> in_process;  // set for in-process ranks
#if defined(THDCP_HAVE_CUDA)
  std::unique_ptr<thdcp::DeviceCommunicator> device;
  std::shared_ptr<thdcp::SharedGpuGroup> shared_gpu;  // set for shared-GPU ranks
#endif

  bool is_device() const;
  int rank() const;
  int size() const;
  const char* kind() const;
  // After a collective call failed on this rank: releases the group's other ranks (in-process
  // and shared-GPU groups; nothing for MPI and NCCL). Never throws.
  void abort_group(const char* reason) noexcept;
};

namespace thdcp::capi {

// Throws THDCP_ERROR_UNSUPPORTED unless this build has CUDA and a GPU is visible: the
// message says to rebuild with -DTHDCP_WITH_CUDA=ON, or that no GPU is visible. `what`
// names the caller's request ("params->backend=THDCP_BACKEND_CUDA").
void require_cuda_device(const char* what);
// Throws THDCP_ERROR_UNSUPPORTED unless this build has CUDA (no device needed).
void require_cuda_build(const char* what);

// Runs `body` as guarded() does; when it fails, aborts the group of `comm` (may be NULL),
// so that the other ranks of the collective do not wait forever for this one.
template <typename Body>
thdcp_status_t guarded_collective(const char* function, thdcp_communicator_st* comm, Body&& body) noexcept {
  const thdcp_status_t status = guarded(function, body);
  if (status != THDCP_SUCCESS && comm != nullptr) comm->abort_group(last_error());
  return status;
}

}  // namespace thdcp::capi
