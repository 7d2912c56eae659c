// The parts of thdcp/mpi.h that exist with or without MPI.
#include <cstdlib>

#include "thdcp/core/error.h"
#include "thdcp/comm/mpi.h"

namespace thdcp::mpi {

bool launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

#if !defined(THDCP_HAVE_MPI)
bool built_with_mpi() { return false; }

Session::Session(int*, char***) {
  THDCP_FAIL_AS(ErrorKind::kUnsupported,
                "this thdcp was built without MPI: install an MPI (e.g. libopenmpi-dev) and rebuild "
                "with -DTHDCP_WITH_MPI=ON");
}
Session::~Session() = default;
void Session::abort(int) { std::abort(); }

std::unique_ptr<Communicator> world() {
  THDCP_FAIL_AS(ErrorKind::kUnsupported, "this thdcp was built without MPI: rebuild with -DTHDCP_WITH_MPI=ON");
}
#endif

}  // namespace thdcp::mpi
