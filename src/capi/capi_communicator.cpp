// Communicators of the C ABI: in-process groups, the MPI world, NCCL (from a unique id or a
// borrowed ncclComm_t) and ranks sharing one GPU.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "capi_handles.h"
#include "capi_status.h"
#include "thdcp/comm/mpi.h"

#if defined(THDCP_HAVE_MPI)
#include <mpi.h>
#endif

#if defined(THDCP_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "thdcp/comm_device/nccl.h"
#endif

using thdcp::capi::ApiError;
using thdcp::capi::Comm;
using thdcp::capi::guarded;

namespace thdcp::capi {

bool Comm::is_device() const {
#if defined(THDCP_HAVE_CUDA)
  return device != nullptr;
#else
  return false;
#endif
}

int Comm::rank() const {
#if defined(THDCP_HAVE_CUDA)
  if (device) return device->rank();
#endif
  return host->rank();
}

int Comm::size() const {
#if defined(THDCP_HAVE_CUDA)
  if (device) return device->size();
#endif
  return host->size();
}

const char* Comm::kind() const {
#if defined(THDCP_HAVE_CUDA)
  if (device) return device->kind();
#endif
  return host->kind();
}

void Comm::abort_group(const char* reason) noexcept {
  try {
    const std::string why = "rank " + std::to_string(rank()) + " failed: " + reason;
    if (in_process) in_process->abort(why);
#if defined(THDCP_HAVE_CUDA)
    if (shared_gpu) shared_gpu->abort(why);
#endif
  } catch (...) {
    // Without memory for the reason the group cannot be told; its ranks stay as they are.
  }
}

void require_cuda_build(const char* what) {
#if !defined(THDCP_HAVE_CUDA)
  throw ApiError(THDCP_ERROR_UNSUPPORTED,
                 std::string(what) + ": this libthdcp was built without CUDA: rebuild thdcp with -DTHDCP_WITH_CUDA=ON "
                                     "(it needs the CUDA toolkit); the CPU backend and host communicators need none");
#endif
}

void require_cuda_device(const char* what) {
  require_cuda_build(what);
#if defined(THDCP_HAVE_CUDA)
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    throw ApiError(THDCP_ERROR_UNSUPPORTED,
                   std::string(what) + ": no CUDA device is visible to this process (cudaGetDeviceCount: " +
                       (status != cudaSuccess ? cudaGetErrorName(status) : "0 devices") +
                       "): run where a GPU is visible (check CUDA_VISIBLE_DEVICES and the driver); the CPU "
                       "backend and host communicators need none");
  }
#endif
}

namespace {

// The size of a group made in this process (in-process, shared-GPU), checked before anything
// is allocated for it: its ranks are threads of this process.
void check_group_size(int size) {
  THDCP_CAPI_REQUIRE(size >= 1 && size <= THDCP_MAX_GROUP_SIZE,
                     "size=" << size << " must be in [1, THDCP_MAX_GROUP_SIZE=" << THDCP_MAX_GROUP_SIZE
                             << "]: the ranks of a group in this process, each driven by a thread of its own");
}

// The `size` ranks of a group made in this process, attach(comm, rank) filling each; the
// handles reach the caller only once every one of them exists.
template <typename Attach>
void publish_group(int size, thdcp_communicator_t* comms, Attach attach) {
  std::vector<std::shared_ptr<Comm>> made;
  for (int r = 0; r < size; ++r) {
    made.push_back(std::make_shared<Comm>());
    attach(*made.back(), r);
  }
  const std::vector<thdcp_communicator_t> handles = publish_all(made);
  std::copy(handles.begin(), handles.end(), comms);
}

void require_nccl(const char* what) {
  require_cuda_build(what);
#if !defined(THDCP_HAVE_NCCL)
  throw ApiError(THDCP_ERROR_UNSUPPORTED,
                 std::string(what) + ": this libthdcp was built without NCCL: install NCCL and rebuild thdcp with "
                                     "-DTHDCP_WITH_CUDA=ON -DTHDCP_WITH_NCCL=ON (NCCL_HOME where it is installed)");
#endif
}

// An NCCL communicator handle for `device` into *comm, from make() (create or borrow), after
// the checks both entry points share.
template <typename Make>
void make_nccl_communicator(int device, thdcp_communicator_t* comm, Make make) {
  THDCP_CAPI_REQUIRE(device >= 0, "device=" << device << " must be a CUDA device index >= 0");
  THDCP_CAPI_NOT_NULL(comm, "a thdcp_communicator_t to receive the communicator");
  require_nccl("NCCL communicators");
  require_cuda_device("NCCL communicators");
#if defined(THDCP_HAVE_NCCL)
  auto made = std::make_shared<Comm>();
  made->device = make();
  *comm = publish(std::move(made));
#else
  (void)make;
#endif
}

}  // namespace

}  // namespace thdcp::capi

namespace {

// A communicator getter: the handle and the output pointer checked, then *out = value(comm).
template <typename T, typename Value>
thdcp_status_t query(const char* function, thdcp_communicator_t comm, T* out, const char* out_name,
                     const char* out_hint, Value value) {
  return thdcp::capi::guarded(function, [&] {
    const std::shared_ptr<Comm> c = thdcp::capi::lookup<Comm>(comm, "comm");
    THDCP_CAPI_REQUIRE(out != nullptr, out_name << " is NULL: pass " << out_hint);
    *out = value(*c);
  });
}

}  // namespace

extern "C" {

thdcp_status_t thdcp_communicator_create_in_process_group(int size, thdcp_communicator_t* comms) {
  return guarded(__func__, [&] {
    thdcp::capi::check_group_size(size);
    THDCP_CAPI_NOT_NULL(comms, "an array of size=" << size << " thdcp_communicator_t to receive the ranks");
    auto group = std::make_shared<thdcp::InProcessGroup>(size);
    thdcp::capi::publish_group(size, comms, [&](Comm& comm, int r) {
      comm.host = group->communicator(r);
      comm.in_process = group;
    });
  });
}

thdcp_status_t thdcp_communicator_create_mpi_world(thdcp_communicator_t* comm) {
  return guarded(__func__, [&] {
    THDCP_CAPI_NOT_NULL(comm, "a thdcp_communicator_t to receive the communicator");
    if (!thdcp::mpi::built_with_mpi()) {
      throw ApiError(THDCP_ERROR_UNSUPPORTED,
                     "this libthdcp was built without MPI: install an MPI (e.g. libopenmpi-dev) and rebuild thdcp "
                     "with -DTHDCP_WITH_MPI=ON");
    }
#if defined(THDCP_HAVE_MPI)
    int initialized = 0;
    MPI_Initialized(&initialized);
    THDCP_CAPI_REQUIRE(initialized, "MPI is not initialised: call MPI_Init (or MPI_Init_thread) before "
                                    "thdcp_communicator_create_mpi_world, and MPI_Finalize after destroying it");
#endif
    auto made = std::make_shared<Comm>();
    made->host = thdcp::mpi::world();
    *comm = thdcp::capi::publish(std::move(made));
  });
}

thdcp_status_t thdcp_nccl_unique_id(void* id, size_t bytes) {
  return guarded(__func__, [&] {
    THDCP_CAPI_NOT_NULL(id, THDCP_NCCL_UNIQUE_ID_BYTES << " bytes to receive the unique id");
    THDCP_CAPI_REQUIRE(bytes == THDCP_NCCL_UNIQUE_ID_BYTES,
                       "bytes=" << bytes << ": an NCCL unique id has THDCP_NCCL_UNIQUE_ID_BYTES="
                                << THDCP_NCCL_UNIQUE_ID_BYTES << " bytes");
    thdcp::capi::require_nccl("NCCL unique ids");
#if defined(THDCP_HAVE_NCCL)
    static_assert(thdcp::nccl::kUniqueIdBytes == THDCP_NCCL_UNIQUE_ID_BYTES, "thdcp.h and nccl.h disagree");
    const std::vector<char> made = thdcp::nccl::unique_id();
    THDCP_CAPI_REQUIRE(made.size() == bytes, "internal: nccl::unique_id gave " << made.size() << " bytes");
    std::memcpy(id, made.data(), made.size());
#endif
  });
}

thdcp_status_t thdcp_communicator_create_nccl(const void* id, size_t bytes, int rank, int size, int device,
                                              thdcp_communicator_t* comm) {
  return guarded(__func__, [&] {
    THDCP_CAPI_NOT_NULL(id, "the " << THDCP_NCCL_UNIQUE_ID_BYTES << "-byte id of thdcp_nccl_unique_id");
    THDCP_CAPI_REQUIRE(bytes == THDCP_NCCL_UNIQUE_ID_BYTES,
                       "bytes=" << bytes << ": an NCCL unique id has THDCP_NCCL_UNIQUE_ID_BYTES="
                                << THDCP_NCCL_UNIQUE_ID_BYTES << " bytes");
    THDCP_CAPI_REQUIRE(size >= 1, "size=" << size << " must be >= 1");
    THDCP_CAPI_REQUIRE(rank >= 0 && rank < size, "rank=" << rank << " must be in [0, size=" << size << ")");
    thdcp::capi::make_nccl_communicator(device, comm, [&] {
#if defined(THDCP_HAVE_NCCL)  // without NCCL, make_nccl_communicator refuses before calling this
      return thdcp::nccl::create_from_unique_id(id, bytes, rank, size, device);
#endif
    });
  });
}

thdcp_status_t thdcp_communicator_borrow_nccl(void* nccl_comm, int device, thdcp_communicator_t* comm) {
  return guarded(__func__, [&] {
    THDCP_CAPI_NOT_NULL(nccl_comm, "an initialised ncclComm_t");
    thdcp::capi::make_nccl_communicator(device, comm, [&] {
#if defined(THDCP_HAVE_NCCL)
      return thdcp::nccl::borrow(nccl_comm, device);
#endif
    });
  });
}

thdcp_status_t thdcp_communicator_create_shared_gpu_group(int size, int device, thdcp_communicator_t* comms) {
  return guarded(__func__, [&] {
    thdcp::capi::check_group_size(size);
    THDCP_CAPI_REQUIRE(device >= 0, "device=" << device << " must be a CUDA device index >= 0");
    THDCP_CAPI_NOT_NULL(comms, "an array of size=" << size << " thdcp_communicator_t to receive the ranks");
    thdcp::capi::require_cuda_device("shared-GPU groups");
#if defined(THDCP_HAVE_CUDA)
    thdcp::SharedGpuOptions options;
    options.device = device;
    auto group = std::make_shared<thdcp::SharedGpuGroup>(size, options);
    thdcp::capi::publish_group(size, comms, [&](Comm& comm, int r) {
      comm.device = group->communicator(r);
      comm.shared_gpu = group;
    });
#endif
  });
}

thdcp_status_t thdcp_communicator_destroy(thdcp_communicator_t comm) {
  return guarded(__func__, [&] { thdcp::capi::retire<Comm>(comm, "comm"); });
}

thdcp_status_t thdcp_communicator_rank(thdcp_communicator_t comm, int* rank) {
  return query(__func__, comm, rank, "rank", "an int to receive the rank", [](const Comm& c) {
    return c.rank();
  });
}

thdcp_status_t thdcp_communicator_size(thdcp_communicator_t comm, int* size) {
  return query(__func__, comm, size, "size", "an int to receive the size", [](const Comm& c) {
    return c.size();
  });
}

thdcp_status_t thdcp_communicator_is_device(thdcp_communicator_t comm, int* is_device) {
  return query(__func__, comm, is_device, "is_device", "an int to receive 0 or 1", [](const Comm& c) {
    return c.is_device() ? 1 : 0;
  });
}

thdcp_status_t thdcp_communicator_device(thdcp_communicator_t comm, int* device) {
  return query(__func__, comm, device, "device", "an int to receive the device", [](const Comm& c) {
#if defined(THDCP_HAVE_CUDA)
    if (c.device) return c.device->device();
#endif
    return -1;
  });
}

thdcp_status_t thdcp_communicator_kind(thdcp_communicator_t comm, const char** kind) {
  return query(__func__, comm, kind, "kind", "a const char* to receive the kind", [](const Comm& c) {
    return c.kind();
  });
}

}  // extern "C"
