#include "step/visible_gpus.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdlib>

#include "thdcp/core/error.h"

namespace thdcp::tools {

namespace {

// The NVIDIA kernel driver is loaded (also inside a container given a GPU).
bool nvidia_driver_loaded() { return access("/proc/driver/nvidia/version", F_OK) == 0; }

std::string runtime_version() {
  int version = 0;
  if (cudaRuntimeGetVersion(&version) != cudaSuccess) return "runtime";
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

}  // namespace

int visible_gpus(std::string* why_none) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaSuccess && count > 0) return count;
  (void)cudaGetLastError();
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (status == cudaSuccess || status == cudaErrorNoDevice || !nvidia_driver_loaded()) {
    *why_none = "no GPU found";
    if (visible != nullptr && nvidia_driver_loaded()) *why_none += " (CUDA_VISIBLE_DEVICES=" + quote_excerpt(visible) + ")";
  } else if (status == cudaErrorInsufficientDriver) {
    *why_none = "no usable GPU: the NVIDIA driver is older than the CUDA " + runtime_version() +
                " this thdcp was built with (update the driver)";
  } else {
    *why_none = std::string("no usable GPU: CUDA says ") + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")";
  }
  return 0;
}

}  // namespace thdcp::tools
