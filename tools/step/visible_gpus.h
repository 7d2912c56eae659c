// How many GPUs this process can use, and in words why none when there are none. The one
// place the tool asks CUDA for its devices (run, run --graph, bench and its modes).
#pragma once

#include <string>

namespace thdcp::tools {

// The CUDA devices this process sees. When there are none, returns 0 and sets `why_none`:
// "no GPU found" on a machine without an NVIDIA driver or device (where the CUDA runtime says
// "CUDA driver version is insufficient for CUDA runtime version": it finds no driver at all,
// and that text misleads), naming CUDA_VISIBLE_DEVICES when it hides them; or, when a driver
// is loaded but CUDA cannot use it, what to change.
int visible_gpus(std::string* why_none);

}  // namespace thdcp::tools
