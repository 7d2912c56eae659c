// The MPI communicator: one CP rank per process, started with mpirun/srun. This header
// does not include mpi.h, so tools can use it whether or not thdcp was built with MPI.
#pragma once

#include <memory>

#include "thdcp/comm/communicator.h"

namespace thdcp::mpi {

// True when thdcp was built with MPI (THDCP_WITH_MPI).
bool built_with_mpi();

// True when this process was started by an MPI launcher (mpirun, mpiexec, srun with PMI):
// one of OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK is set.
bool launched_by_mpi();

// Initialises MPI for the lifetime of the object (MPI_THREAD_MULTIPLE is not needed: only
// the constructing thread calls MPI) and finalises it on destruction if it initialised it.
// Throws thdcp::Error when thdcp was built without MPI.
class Session {
 public:
  Session(int* argc, char*** argv);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Ends every process of the job with `code` (MPI_Abort). For a tool that stops on an
  // error on one rank while the others may be waiting in a collective.
  [[noreturn]] void abort(int code);

 private:
  bool owns_ = false;
};

// A communicator over MPI_COMM_WORLD. Requires a live Session.
std::unique_ptr<Communicator> world();

}  // namespace thdcp::mpi
