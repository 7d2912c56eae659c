// The parts of thdcp/comm_device/nccl.h that exist with or without NCCL: which GPU a process
// started by a launcher should use.
#include <cerrno>
#include <climits>
#include <cstdlib>

#include "thdcp/comm_device/nccl.h"
#include "thdcp/core/error.h"

namespace thdcp::nccl {

int local_rank_from_environment() {
  // Launchers that set several (srun running Open MPI sets both OMPI_ and SLURM_) agree;
  // the first one found wins.
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"}) {
    const char* text = std::getenv(name);
    if (text == nullptr) continue;
    char* end = nullptr;
    errno = 0;
    const long value = std::strtol(text, &end, 10);
    THDCP_CHECK(end != text && *end == '\0' && errno == 0 && value >= 0 && value <= INT_MAX,
                name << "='" << text << "' is not a local rank (a non-negative integer): unset it or fix the launcher");
    return static_cast<int>(value);
  }
  return -1;
}

int device_for_local_rank(int local_rank, int device_count) {
  THDCP_CHECK(device_count >= 1, "device_count=" << device_count
                                                 << ": this process sees no CUDA device; check the driver and "
                                                    "CUDA_VISIBLE_DEVICES");
  THDCP_CHECK(local_rank >= 0, "local_rank=" << local_rank
                                             << " must be >= 0; when local_rank_from_environment() returns -1 (no "
                                                "launcher), pass 0");
  return local_rank % device_count;
}

}  // namespace thdcp::nccl
