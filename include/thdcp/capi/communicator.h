/* Communicators of the C ABI: host (in-process, MPI) and device (NCCL, shared GPU).
 * Part of the C ABI: include <thdcp/thdcp.h>, whose conventions hold here. Pure C99. */
#ifndef THDCP_CAPI_COMMUNICATOR_H_
#define THDCP_CAPI_COMMUNICATOR_H_

#include "thdcp/capi/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- communicators ------------------------------------------------------------------ */
/* Two families (docs/ARCHITECTURE.md): host communicators (in-process threads, MPI) block
 * on host memory and serve the CPU backend; device communicators (NCCL, ranks sharing one
 * GPU) enqueue on a stream and serve the CUDA backend and graph banks. A CP plan checks that
 * it got the family its backend needs.
 *
 * When a collective call (thdcp_cp_plan_create, thdcp_cp_forward, thdcp_cp_backward,
 * thdcp_graph_bank_run) fails on one rank of an in-process or a shared-GPU group, that
 * rank aborts the group, so that no other rank waits forever for it: the other ranks' calls
 * then fail with THDCP_ERROR_COMMUNICATION, and so does every later collective of the
 * group. Destroy the group's plans and communicators and make a new group. (MPI has no such
 * release: a failed rank leaves the others waiting, as in any MPI program; NCCL's waits are
 * bounded by its timeout. A call refused for its handle, THDCP_ERROR_INVALID_HANDLE, has no
 * group it could abort.) */

/* `size` host communicators of one group in this process, one per rank: comms[r] is rank r.
 * Each is used by its own thread, and every rank's thread must enter each collective.
 *   size   ranks in [1, THDCP_MAX_GROUP_SIZE] (1024)
 *   comms  an array of `size` handles, all written on success, none on failure */
THDCP_API thdcp_status_t thdcp_communicator_create_in_process_group(int size, thdcp_communicator_t* comms);

/* A host communicator over MPI_COMM_WORLD (one rank per process). MPI must have been
 * initialised by the caller (MPI_Init) and be finalised by the caller after every
 * communicator over it is destroyed. THDCP_ERROR_UNSUPPORTED when built without MPI. */
THDCP_API thdcp_status_t thdcp_communicator_create_mpi_world(thdcp_communicator_t* comm);

/* NCCL's unique id (ncclGetUniqueId), made on one rank and carried to the others by the
 * caller (a broadcast of its framework, a file, MPI_Bcast).
 *   id     receives the id's bytes
 *   bytes  size of `id`: THDCP_NCCL_UNIQUE_ID_BYTES
 * THDCP_ERROR_UNSUPPORTED when built without NCCL. */
#define THDCP_NCCL_UNIQUE_ID_BYTES 128
THDCP_API thdcp_status_t thdcp_nccl_unique_id(void* id, size_t bytes);

/* A device communicator of `size` ranks, one per GPU, from the id of thdcp_nccl_unique_id.
 * Collective: every rank calls it with the same id and its own rank (a rank that never
 * calls makes the others fail after NCCL's timeout, 300 s).
 *   id, bytes  the unique id, THDCP_NCCL_UNIQUE_ID_BYTES bytes
 *   rank       this rank in [0, size)
 *   size       ranks >= 1
 *   device     this rank's CUDA device; made the calling thread's current device. Two ranks
 *              may not share a device (NCCL refuses it: use a shared-GPU group) */
THDCP_API thdcp_status_t thdcp_communicator_create_nccl(const void* id, size_t bytes, int rank, int size,
                                                       int device, thdcp_communicator_t* comm);

/* Wraps a communicator the caller made and keeps: `nccl_comm` is an ncclComm_t of `device`.
 * Rank and size are the communicator's. thdcp never finalizes, destroys or aborts it;
 * the caller keeps it alive longer than the handle, every CP plan and graph bank made over
 * it, and every graph captured through it. */
THDCP_API thdcp_status_t thdcp_communicator_borrow_nccl(void* nccl_comm, int device, thdcp_communicator_t* comm);

/* `size` device communicators of ranks that share one GPU (`device`), one per rank, for
 * tests and single-GPU use of cp > 1: comms[r] is rank r, each used by its own thread, with
 * `device` current. Collectives are device copies ordered by events; capture-safe. `size`
 * in [1, THDCP_MAX_GROUP_SIZE]; `comms` as for an in-process group. */
THDCP_API thdcp_status_t thdcp_communicator_create_shared_gpu_group(int size, int device,
                                                                   thdcp_communicator_t* comms);

/* Ends one rank's communicator handle; NULL is accepted. The communicator is released now,
 * or with the last CP plan or graph bank made over it. A borrowed NCCL communicator is left
 * to its owner. The other ranks of an in-process or shared-GPU group stay usable for
 * non-collective calls; the group's state lives until its last communicator is released. */
THDCP_API thdcp_status_t thdcp_communicator_destroy(thdcp_communicator_t comm);

THDCP_API thdcp_status_t thdcp_communicator_rank(thdcp_communicator_t comm, int* rank);
THDCP_API thdcp_status_t thdcp_communicator_size(thdcp_communicator_t comm, int* size);
/* *is_device = 1 for a device communicator (NCCL, shared GPU), 0 for a host one. */
THDCP_API thdcp_status_t thdcp_communicator_is_device(thdcp_communicator_t comm, int* is_device);
/* The CUDA device of a device communicator; -1 for a host communicator. */
THDCP_API thdcp_status_t thdcp_communicator_device(thdcp_communicator_t comm, int* device);
/* "in-process", "mpi", "nccl", "shared-gpu", ...: static storage. */
THDCP_API thdcp_status_t thdcp_communicator_kind(thdcp_communicator_t comm, const char** kind);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* THDCP_CAPI_COMMUNICATOR_H_ */
