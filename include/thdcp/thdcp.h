/* The C ABI of thdcp (libthdcp.so): THD packed varlen attention, single device and with
 * AllGather context parallelism, for callers that are not C++17 (C, Python ctypes/cffi,
 * Rust, Julia, other frameworks' extensions). Pure C99; no CUDA, NCCL or MPI header is
 * needed to compile against it.
 *
 * This header is the whole contract of the shared library: a caller (or a binding
 * generator) includes it alone. It includes one header per area, in order (like
 * TransformerEngine's C layer, one file per area): thdcp/capi/types.h (statuses, dtypes,
 * handles, the library, tensors and layouts), attention.h, communicator.h, cp.h,
 * capacity.h, graph.h.
 *
 * Conventions (they hold for every function below):
 *  - Every function returns thdcp_status_t (THDCP_SUCCESS = 0), except thdcp_version_string,
 *    thdcp_abi_version, thdcp_last_error and thdcp_status_name. No C++ exception crosses
 *    this boundary. After a failure, thdcp_last_error() gives the message on the failing
 *    thread: it names the function, the argument, its value and what to change.
 *  - Every argument is checked before anything the caller owns is written: a refused call
 *    leaves outputs, output tensors and handles untouched. NULL handles, NULL pointers that
 *    are not documented as optional and NULL output pointers give
 *    THDCP_ERROR_INVALID_ARGUMENT naming the argument.
 *  - Handles are checked: a handle value is an opaque number the library looks up in its
 *    registry of live handles before using it, never an address it reads through. A non-NULL
 *    handle that is not live (destroyed already: a second destroy or a use after destroy;
 *    never returned by this library: uninitialised, zeroed or foreign memory; a handle of
 *    another type) gives THDCP_ERROR_INVALID_HANDLE naming the function and the argument,
 *    and a destroy of one releases nothing. Handle values are never reused within a process,
 *    so a stale handle cannot reach a newer object.
 *  - Plan, then run (CUTLASS, cudnn-frontend). Plans are made once for a capacity
 *    (max_seqs, max_tokens) and a shape; their workspace size is queried up front and the
 *    caller allocates it. Runs only check with host arithmetic and compute (CPU) or enqueue
 *    on the caller's stream (CUDA): on the CUDA backend they allocate nothing, never
 *    synchronise and never read device memory back, so they can be captured in a CUDA graph.
 *    Single-device attention runs that are not being captured also query every pointer
 *    (device memory of the plan's device, or THDCP_ERROR_INVALID_ARGUMENT naming it); CP
 *    runs and captured runs do not, so there a host pointer is the caller's error.
 *  - Backends: THDCP_BACKEND_CPU takes host pointers and computes before returning (the
 *    reference implementation: fp32 arithmetic, bf16/fp16/fp32 storage, head_dim a multiple
 *    of 8 in [8, 256]); THDCP_BACKEND_CUDA takes device pointers of the current device and
 *    enqueues on `stream` (bf16/fp16 storage; head_dim = v_head_dim in {64, 96, 128, 192,
 *    256}, or head_dim 192 with v_head_dim 128 (MLA); 16-byte aligned data).
 *    A library built without CUDA, or a process that sees no GPU, refuses the CUDA backend
 *    with THDCP_ERROR_UNSUPPORTED.
 *  - Ownership: handles are the library's, created by *_create and released by *_destroy
 *    (destroy accepts NULL, a no-op; destroy each handle once). Tensors, layouts and
 *    workspaces are the caller's and are only borrowed for the duration of a call, except a
 *    plan's workspace, which is borrowed for the life of the plan. A CP plan or graph bank
 *    holds the communicator it was made over: destroying the communicator first ends its
 *    handle, and the communicator itself is released with the last plan or bank using it.
 *  - Versioned parameter structs (thdcp_*_params) start with `size_t struct_size`, which the
 *    caller sets to sizeof the struct it was compiled with (the THDCP_*_INIT macros and the
 *    thdcp_*_params_init functions do). Fields are only ever appended, each version of a
 *    struct ends on an 8-byte boundary, and fields appended later default to 0. The library
 *    accepts any struct_size that is a multiple of 8 from the size of the first version
 *    (THDCP_*_PARAMS_MIN_SIZE) up to THDCP_MAX_STRUCT_SIZE (4096; a larger one is refused
 *    before anything past the field is read): fields past struct_size take their defaults,
 *    and bytes past the fields this library knows, up to struct_size, must be 0 (else
 *    THDCP_ERROR_INVALID_ARGUMENT: the caller set a field of a newer thdcp.h that this
 *    libthdcp cannot honour). Nothing past struct_size is read. Output structs
 *    (thdcp_capacity_plan_result) work the same way in reverse: the library writes the fields
 *    that fit the caller's struct_size.
 *  - Value types without struct_size (thdcp_tensor_t, thdcp_layout_t, thdcp_capacity_t,
 *    thdcp_graph_counters_t) are fixed for ABI version 1; a change makes a new ABI version.
 *  - Thread safety: distinct handles may be used from distinct threads at once. One handle
 *    is used by one thread at a time (a communicator of an in-process group by its rank's
 *    thread).
 *  - Terms (DESIGN.md): THD = one [T, H, D] tensor of all tokens of a batch; cu_seqlens /
 *    cu_seqlens_padded = int32 prefix sums of the valid / padded lengths (padding at the back
 *    of each sequence); masks on absolute positions, FlashAttention's window convention. */
#ifndef THDCP_THDCP_H_
#define THDCP_THDCP_H_

#include "thdcp/capi/types.h"
#include "thdcp/capi/attention.h"
#include "thdcp/capi/communicator.h"
#include "thdcp/capi/cp.h"
#include "thdcp/capi/capacity.h"
#include "thdcp/capi/graph.h"

#endif /* THDCP_THDCP_H_ */
