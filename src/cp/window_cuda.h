// The workspace of a CUDA CP plan as a window of its communicator, where the communicator
// wants one (a copy-engine NCCL communicator: nccl::Options::copy_engine), so that the
// plan's all-gathers and all-to-alls run on the copy engines.
#pragma once

#include <cstddef>
#include <memory>

#include "thdcp/comm_device/device_communicator.h"

namespace thdcp::cp::detail {

// `workspace` (`bytes`, from nccl::window_memory, the same bytes on every rank) registered
// with `comm`, then one all_gather and one all_to_all into it on a stream of its own, waited
// for: NCCL sets up its copy-engine path on first use, which must not happen inside a step
// that may be captured. Collective; plan time. nullptr where comm wants no window.
std::unique_ptr<DeviceCommunicator::Window> workspace_window(DeviceCommunicator& comm, void* workspace, size_t bytes);

}  // namespace thdcp::cp::detail
