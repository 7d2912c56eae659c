// The NCCL device communicator (DESIGN.md section 5): the engine of context parallelism
// across GPUs and nodes. This header does not include nccl.h, so callers compile whether
// or not thdcp was built with NCCL (THDCP_WITH_NCCL).
//
// Two ways to start it:
//  - one process per GPU under mpirun/srun: bootstrap = *thdcp::mpi::world(),
//    device = device_for_local_rank(local_rank_from_environment(), device count);
//  - one process driving several GPUs: thdcp::run_in_process(n, body), and in body
//    create(host, host.rank(), ...) on each rank's thread (one thread per GPU).
//
// The communicator is non-blocking underneath, so nothing it does can hang forever: init,
// split and a collective that NCCL has not finished issuing are bounded by
// Options::timeout_seconds, synchronize() by its argument; a failure or a timeout aborts the
// communicator and throws thdcp::Error naming the rank and the device. After that every call
// throws; make a new communicator.
//
// Destroy every CUDA graph that captured its collectives before destroying the communicator:
// NCCL keeps the communicator alive while a graph refers to it.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "thdcp/comm/communicator.h"
#include "thdcp/comm_device/device_communicator.h"

namespace thdcp::nccl {

// True when thdcp was built with NCCL.
bool built_with_nccl();

struct Options {
  // Seconds that init, split, a collective's issue and the destructor's finalize may take,
  // and the wait of warm_up(). <= 0: no limit.
  double timeout_seconds = 300;
  // NCCL's zero-CTA policy (NCCL_CTA_POLICY_ZERO, NCCL >= 2.28.3): an all_gather or
  // all_to_all whose buffers lie in a window of the communicator (register_window, over
  // window_memory) runs on the copy engines and takes no SMs from the kernels beside it,
  // where every rank reaches every other over NVLink; other collectives run as before. The
  // communicator then wants windows (wants_windows()), and split() passes it on. A build with
  // an older NCCL refuses it. borrow() cannot set the policy of the caller's communicator:
  // there copy_engine says that the caller made it with NCCL_CTA_POLICY_ZERO.
  bool copy_engine = false;
};

// `bytes` of device memory on the current device from NCCL's allocator (ncclMemAlloc:
// CUDA virtual memory that a window can map on the peers), freed (ncclMemFree) when the last
// copy of the returned pointer goes. What a copy_engine communicator's plans take as
// workspace. Throws thdcp::Error naming NCCL's message, or when built without NCCL.
std::shared_ptr<void> window_memory(size_t bytes);

// A communicator of bootstrap.size() ranks, one per GPU; rank and size are bootstrap's.
// Collective over `bootstrap`, a host communicator that carries NCCL's unique id from rank
// 0 to every rank (the MPI world, or the in-process group with one thread per GPU).
// `device`: the CUDA device of this rank, made the calling thread's current device; every
// later collective must be called with it current. Two ranks of one communicator may not
// share a device (NCCL refuses it).
// Throws thdcp::Error, on every rank, when a rank's device is not valid; throws (on the
// ranks that see it) when NCCL fails or does not finish within options.timeout_seconds,
// naming the rank, the device and NCCL's message. Throws when built without NCCL.
std::unique_ptr<DeviceCommunicator> create(Communicator& bootstrap, int device, const Options& options = {});

// The third way, for frameworks that carry bytes between their ranks themselves (a
// torch.distributed broadcast, say): one rank makes unique_id(), every rank receives it and
// calls create_from_unique_id with its rank. Collective like create(); a rank that never
// calls it makes the others fail after options.timeout_seconds.
constexpr size_t kUniqueIdBytes = 128;
std::vector<char> unique_id();
std::unique_ptr<DeviceCommunicator> create_from_unique_id(const void* id, size_t id_bytes, int rank, int size,
                                                          int device, const Options& options = {});

// Wraps a communicator the caller made and keeps (an ncclComm_t, passed as void* so that
// this header needs no nccl.h) of `device`: rank and size are the communicator's. thdcp
// never finalizes, destroys or aborts it; after a failure the wrapper only refuses further
// calls, and aborting the communicator is the caller's decision. split() makes communicators
// thdcp owns. The caller keeps it alive longer than the wrapper and every graph captured
// through it.
std::unique_ptr<DeviceCommunicator> borrow(void* nccl_comm, int device, const Options& options = {});

// The rank of this process among the processes of its node, as set by the launcher:
// OMPI_COMM_WORLD_LOCAL_RANK (Open MPI), else SLURM_LOCALID (srun), else MPI_LOCALRANKID
// (MPICH, Intel MPI), else PMI_LOCAL_RANK. -1 when none is set (not started by a launcher).
// Throws thdcp::Error when the variable found is not a non-negative integer.
int local_rank_from_environment();

// The device of the process with this local rank: local_rank % device_count, so that the
// processes of a node spread over its GPUs. local_rank >= 0 (use 0 when
// local_rank_from_environment() returns -1); device_count >= 1 (cudaGetDeviceCount).
int device_for_local_rank(int local_rank, int device_count);

}  // namespace thdcp::nccl
