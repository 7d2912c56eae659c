/* The C ABI of thdcp (libthdcp.so): THD packed varlen attention, single device and with
 * AllGather context parallelism, for callers that are not C++17 (C, Python ctypes/cffi,
 * Rust, Julia, other frameworks' extensions). Pure C99; no CUDA, NCCL or MPI header is
 * needed to compile against it.
 *
 * One header on purpose (like TransformerEngine's C layer, one file per area there): it is
 * the whole contract of the shared library, and a binding generator reads one file.
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
 *    enqueues on `stream` (bf16/fp16 storage, head_dim 64 or 128, 16-byte aligned data).
 *    A library built without CUDA, or a process that sees no GPU, refuses the CUDA backend
 *    with THDCP_ERROR_UNSUPPORTED.
 *  - Ownership: handles are the library's, created by *_create and released by *_destroy
 *    (destroy accepts NULL). Tensors, layouts and workspaces are the caller's and are only
 *    borrowed for the duration of a call, except a plan's workspace, which is borrowed for
 *    the life of the plan. Destroy plans and graph banks before the communicator they use.
 *  - Versioned parameter structs (thdcp_*_params) start with `size_t struct_size`, which the
 *    caller sets to sizeof the struct it was compiled with (the THDCP_*_INIT macros and the
 *    thdcp_*_params_init functions do). Fields are only ever appended, each version of a
 *    struct ends on an 8-byte boundary, and fields appended later default to 0. The library
 *    accepts any struct_size that is a multiple of 8 from the size of the first version
 *    (THDCP_*_PARAMS_MIN_SIZE) up: fields past struct_size take their defaults, and bytes
 *    past the fields this library knows must be 0 (else THDCP_ERROR_INVALID_ARGUMENT: the
 *    caller set a field of a newer thdcp.h that this libthdcp cannot honour). Output structs
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

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define THDCP_API
#else
#define THDCP_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status, dtypes, backends ------------------------------------------------------- */

typedef enum thdcp_status_t {
  THDCP_SUCCESS = 0,
  THDCP_ERROR_INVALID_ARGUMENT = 1, /* a NULL handle or pointer, a wrong shape, dtype, size,
                                       layout, struct_size; ranks that disagree */
  THDCP_ERROR_UNSUPPORTED = 2,      /* built without the part (CUDA, NCCL, MPI), or no GPU */
  THDCP_ERROR_CUDA = 3,             /* a CUDA runtime call failed */
  THDCP_ERROR_COMMUNICATION = 4,    /* a collective failed: another rank failed or aborted the
                                       group, NCCL/MPI reported an error or timed out */
  THDCP_ERROR_OUT_OF_MEMORY = 5,    /* host (std::bad_alloc) or device memory */
  THDCP_ERROR_INTERNAL = 6          /* a bug in thdcp: please report the message */
} thdcp_status_t;

/* Storage dtypes. 16-bit values are raw IEEE binary16 / bfloat16 bits. */
typedef enum thdcp_dtype_t {
  THDCP_DTYPE_DEFAULT = 0, /* only in the params' gradient fields: "the plan's dtype" */
  THDCP_DTYPE_BF16 = 1,
  THDCP_DTYPE_FP16 = 2,
  THDCP_DTYPE_FP32 = 3
} thdcp_dtype_t;

typedef enum thdcp_backend_t {
  THDCP_BACKEND_CPU = 0, /* host pointers, computes before returning */
  THDCP_BACKEND_CUDA = 1 /* device pointers of the current device, enqueued on a stream */
} thdcp_backend_t;

/* What this libthdcp was built with (thdcp_built_with). */
typedef enum thdcp_feature_t {
  THDCP_FEATURE_CUDA = 0, /* the CUDA backend, device communicators, graph banks */
  THDCP_FEATURE_NCCL = 1, /* NCCL communicators */
  THDCP_FEATURE_MPI = 2   /* the MPI host communicator */
} thdcp_feature_t;

/* A cudaStream_t, without cuda_runtime.h (cudaStream_t is `struct CUstream_st*`). NULL is
 * the default stream. Ignored by the CPU backend. */
typedef struct CUstream_st* thdcp_stream_t;

/* ---- opaque handles ----------------------------------------------------------------- */

typedef struct thdcp_attention_plan_st* thdcp_attention_plan_t; /* single-device attention */
typedef struct thdcp_cp_plan_st* thdcp_cp_plan_t;               /* AllGather CP attention */
typedef struct thdcp_communicator_st* thdcp_communicator_t;     /* one rank of a group */
typedef struct thdcp_graph_bank_st* thdcp_graph_bank_t;         /* CUDA graphs per capacity */

/* ---- library ------------------------------------------------------------------------ */

/* The project version, e.g. "0.1.0". Never NULL; static storage. */
THDCP_API const char* thdcp_version_string(void);

/* The version of this ABI: 1. A caller compiled against thdcp.h compares it with
 * THDCP_ABI_VERSION to detect a library of another ABI. */
#define THDCP_ABI_VERSION 1
THDCP_API int thdcp_abi_version(void);

/* The message of the last call that failed on the calling thread ("" if none has).
 * Thread-local; valid until the next failing call on this thread. Successful calls leave
 * it unchanged. Never NULL. */
THDCP_API const char* thdcp_last_error(void);

/* "THDCP_SUCCESS", "THDCP_ERROR_INVALID_ARGUMENT", ...; "THDCP_STATUS_UNKNOWN" for a value
 * that is none of them. Static storage. */
THDCP_API const char* thdcp_status_name(thdcp_status_t status);

/* *out = 1 if this libthdcp was built with `feature`, else 0. A build with CUDA may still
 * run where no GPU is visible; the CUDA entry points then return THDCP_ERROR_UNSUPPORTED. */
THDCP_API thdcp_status_t thdcp_built_with(thdcp_feature_t feature, int* out);

/* ---- tensors and layouts ------------------------------------------------------------ */

/* A THD tensor view [rows, heads, head_dim], row-major with head_dim contiguous. Strides are
 * in elements; 0 means contiguous (row_stride = heads * head_dim, head_stride = head_dim),
 * so q, k and v may be views of one packed QKV buffer [T, Hq + 2 Hkv, D]:
 *   q: data = qkv,                  heads = Hq,  row_stride = (Hq + 2 Hkv) * D
 *   k: data = qkv + Hq * D,         heads = Hkv, row_stride = (Hq + 2 Hkv) * D
 *   v: data = qkv + (Hq + Hkv) * D, heads = Hkv, row_stride = (Hq + 2 Hkv) * D
 * `data` is a host pointer (CPU backend) or a device pointer of the current device, 16-byte
 * aligned (CUDA backend; there row_stride and, with several heads, head_stride are
 * multiples of 8 elements and fp32 dk/dv are contiguous). Inputs are only read, although
 * `data` is not const. The caller owns the memory. */
typedef struct thdcp_tensor_t {
  void* data;
  int64_t rows;
  int64_t heads;
  int64_t head_dim;
  int64_t row_stride;  /* elements from one row to the next; 0: heads * head_dim */
  int64_t head_stride; /* elements from one head to the next; 0: head_dim */
  thdcp_dtype_t dtype;
} thdcp_tensor_t;

/* The layout of a packed batch (DESIGN.md section 1): sequence b occupies rows
 * [cu_seqlens_padded[b], cu_seqlens_padded[b + 1]) of every tensor, of which the first
 * cu_seqlens[b + 1] - cu_seqlens[b] are real tokens and the rest is padding. Both arrays
 * have num_seqs + 1 int32 entries, start at 0 and never decrease; the last padded entry is
 * the tensors' rows. With CP every padded length is a multiple of 2 * cp and the layout is
 * the global one (the same on every rank). Host memory (CPU backend, helpers) or device
 * memory (CUDA backend: then in capacity form, num_seqs = the plan's max_seqs, unused
 * trailing entries repeating the last value; thdcp_capacity_layout makes it). */
typedef struct thdcp_layout_t {
  const int32_t* cu_seqlens;
  const int32_t* cu_seqlens_padded;
  int32_t num_seqs;
} thdcp_layout_t;

/* ---- single-device attention -------------------------------------------------------- */

/* The mask: a query at position i and a key at position j of the same sequence see each
 * other iff (window_left < 0 or j >= i - window_left) and (window_right < 0 or
 * j <= i + window_right). -1: unbounded. Full attention = (-1, -1), causal = (-1, 0),
 * sliding-window causal = (W, 0). Positions count from each sequence's first token. */
typedef struct thdcp_attention_params {
  size_t struct_size;    /* sizeof(thdcp_attention_params) */
  thdcp_backend_t backend; /* default THDCP_BACKEND_CPU */
  thdcp_dtype_t dtype;   /* q, k, v, out, dout. CPU: bf16, fp16, fp32; CUDA: bf16, fp16.
                            Default bf16 */
  int64_t max_tokens;    /* rows T of every tensor of a run (capacity), >= 0, < 2^31 */
  int64_t q_heads;       /* Hq >= 1 */
  int64_t kv_heads;      /* Hkv >= 1, Hq a multiple of Hkv (GQA/MQA) */
  int64_t head_dim;      /* D. CPU: a multiple of 8 in [8, 256]; CUDA: 64 or 128 */
  int32_t max_seqs;      /* sequences a layout may have (capacity), >= 1 */
  int32_t window_left;   /* mask, see above; >= -1. Default -1 */
  int32_t window_right;  /* >= -1. Default -1 (full attention) */
  float softmax_scale;   /* scale of q.k; 0: 1/sqrt(head_dim). Default 0 */
  /* ---- THDCP_ATTENTION_PARAMS_MIN_SIZE (64 bytes) ends here: optional from here on ---- */
  int32_t deterministic; /* CUDA backward: nonzero = the same bits on every run (default 1);
                            0 lets the portable kernels add dQ with atomics. CPU: always
                            deterministic */
  thdcp_dtype_t dq_dtype;  /* backward dq: the plan's dtype or fp32. Default
                              THDCP_DTYPE_DEFAULT: the plan's dtype */
  thdcp_dtype_t dkv_dtype; /* backward dk and dv: the plan's dtype or fp32. Default: dtype */
  int32_t num_threads;   /* CPU worker threads; 0: every hardware thread. Default 0 */
} thdcp_attention_params;

#define THDCP_ATTENTION_PARAMS_MIN_SIZE ((size_t)64)
#define THDCP_ATTENTION_PARAMS_INIT                                                              \
  {sizeof(thdcp_attention_params), THDCP_BACKEND_CPU, THDCP_DTYPE_BF16, 0, 0, 0, 0, 0, -1, -1, \
   0.0f, 1, THDCP_DTYPE_DEFAULT, THDCP_DTYPE_DEFAULT, 0}

static inline void thdcp_attention_params_init(thdcp_attention_params* params) {
  const thdcp_attention_params defaults = THDCP_ATTENTION_PARAMS_INIT;
  *params = defaults;
}

/* Bytes of workspace thdcp_attention_plan_create needs for `params`: 0 on the CPU backend
 * (the reference allocates what it needs per call); on the CUDA backend device memory for
 * the segment table, the forward's tile schedule and the backward's fp32 accumulators. It
 * depends only on the params (the capacity), never on a batch. Validates the params like
 * create, except what needs a device. */
THDCP_API thdcp_status_t thdcp_attention_plan_workspace_size(const thdcp_attention_params* params,
                                                            size_t* workspace_bytes);

/* Makes a plan for `params`.
 *   workspace        CPU: ignored (may be NULL). CUDA: at least
 *                    thdcp_attention_plan_workspace_size bytes of device memory of the
 *                    current device, 256-byte aligned (cudaMalloc's), borrowed until
 *                    thdcp_attention_plan_destroy; its contents need not be kept between runs
 *   workspace_bytes  its size
 *   plan             receives the handle
 * CUDA: the current device becomes the plan's device; the kernels' attributes are set on it.
 * Runs of one plan share its workspace: do not let them overlap in time (one stream). */
THDCP_API thdcp_status_t thdcp_attention_plan_create(const thdcp_attention_params* params, void* workspace,
                                                    size_t workspace_bytes, thdcp_attention_plan_t* plan);

/* Releases the plan (not its workspace). NULL is accepted. CUDA: only once the work it
 * enqueued is done or after synchronising its stream, as for the workspace itself. */
THDCP_API thdcp_status_t thdcp_attention_plan_destroy(thdcp_attention_plan_t plan);

/* Forward attention over the batch `layout`.
 *   layout     CPU: host arrays, 1 <= num_seqs <= max_seqs; CUDA: device arrays in capacity
 *              form, num_seqs == max_seqs. cu_seqlens_padded[num_seqs] == max_tokens
 *   q          [max_tokens, Hq, D], the plan's dtype
 *   k, v       [max_tokens, Hkv, D], the plan's dtype
 *   out        [max_tokens, Hq, D], the plan's dtype. Every row is written: padding rows and
 *              rows that see no key get 0
 *   lse        Hq * max_tokens floats, [Hq, max_tokens]: natural log of each row's softmax
 *              denominator of the scaled scores; -inf for padding rows and rows that see no
 *              key. Same memory space as the tensors
 *   max_logit  Hq floats, or NULL: the max over allowed pairs of the scaled score per head
 *              (-inf if none)
 *   stream     CUDA: the stream the work is enqueued on; CPU: ignored
 * CPU: returns when the results are written. CUDA: returns once enqueued. */
THDCP_API thdcp_status_t thdcp_attention_forward(thdcp_attention_plan_t plan, const thdcp_layout_t* layout,
                                                const thdcp_tensor_t* q, const thdcp_tensor_t* k,
                                                const thdcp_tensor_t* v, const thdcp_tensor_t* out, float* lse,
                                                float* max_logit, thdcp_stream_t stream);

/* Backward attention from the forward's out and lse.
 *   layout, q, k, v, stream  as for the forward
 *   out, lse   the forward's results for this batch
 *   dout       [max_tokens, Hq, D], the plan's dtype
 *   dq         [max_tokens, Hq, D], the plan's dq_dtype. Every row is written
 *   dk, dv     [max_tokens, Hkv, D], the plan's dkv_dtype. Summed in fp32 over the query
 *              heads of each KV group, rounded once; rows no query saw are exactly 0 */
THDCP_API thdcp_status_t thdcp_attention_backward(thdcp_attention_plan_t plan, const thdcp_layout_t* layout,
                                                 const thdcp_tensor_t* q, const thdcp_tensor_t* k,
                                                 const thdcp_tensor_t* v, const thdcp_tensor_t* out,
                                                 const thdcp_tensor_t* dout, const float* lse,
                                                 const thdcp_tensor_t* dq, const thdcp_tensor_t* dk,
                                                 const thdcp_tensor_t* dv, thdcp_stream_t stream);

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
 * bounded by its timeout.) */

/* `size` host communicators of one group in this process, one per rank: comms[r] is rank r.
 * Each is used by its own thread, and every rank's thread must enter each collective.
 *   size   ranks, >= 1
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
 * the caller keeps it alive longer than the handle and every graph captured through it. */
THDCP_API thdcp_status_t thdcp_communicator_borrow_nccl(void* nccl_comm, int device, thdcp_communicator_t* comm);

/* `size` device communicators of ranks that share one GPU (`device`), one per rank, for
 * tests and single-GPU use of cp > 1: comms[r] is rank r, each used by its own thread, with
 * `device` current. Collectives are device copies ordered by events; capture-safe. */
THDCP_API thdcp_status_t thdcp_communicator_create_shared_gpu_group(int size, int device,
                                                                   thdcp_communicator_t* comms);

/* Releases one rank's communicator; NULL is accepted. A borrowed NCCL communicator is left
 * to its owner. The other ranks of an in-process or shared-GPU group stay usable for
 * non-collective calls; the group's state lives until its last communicator is destroyed. */
THDCP_API thdcp_status_t thdcp_communicator_destroy(thdcp_communicator_t comm);

THDCP_API thdcp_status_t thdcp_communicator_rank(thdcp_communicator_t comm, int* rank);
THDCP_API thdcp_status_t thdcp_communicator_size(thdcp_communicator_t comm, int* size);
/* *is_device = 1 for a device communicator (NCCL, shared GPU), 0 for a host one. */
THDCP_API thdcp_status_t thdcp_communicator_is_device(thdcp_communicator_t comm, int* is_device);
/* The CUDA device of a device communicator; -1 for a host communicator. */
THDCP_API thdcp_status_t thdcp_communicator_device(thdcp_communicator_t comm, int* device);
/* "in-process", "mpi", "nccl", "shared-gpu", ...: static storage. */
THDCP_API thdcp_status_t thdcp_communicator_kind(thdcp_communicator_t comm, const char** kind);

/* ---- AllGather context parallelism ------------------------------------------------- */
/* Every rank holds T/cp rows of each tensor in the dual-chunk order (DESIGN.md section 3:
 * of every sequence, chunk `rank` followed by chunk 2*cp-1-rank); thdcp_cp_split and
 * thdcp_cp_merge move rows between the global tensor and a rank's local one. Every rank
 * passes the same global layout. */

typedef struct thdcp_cp_params {
  size_t struct_size;    /* sizeof(thdcp_cp_params) */
  thdcp_backend_t backend; /* CPU: a host communicator; CUDA: a device communicator.
                              Default CPU */
  thdcp_dtype_t dtype;   /* q, k, v, out, dout; as thdcp_attention_params. Default bf16 */
  int64_t max_tokens;    /* global rows T of the layouts (capacity), a multiple of 2 * cp */
  int64_t q_heads;       /* Hq >= 1 */
  int64_t kv_heads;      /* Hkv >= 1, Hq a multiple of Hkv */
  int64_t head_dim;      /* D: as thdcp_attention_params */
  int32_t cp_size;       /* ranks cp >= 1: must equal the communicator's size (it sizes the
                            workspace before there is a communicator) */
  int32_t max_seqs;      /* sequences of a layout (capacity), >= 1 */
  int32_t window_left;   /* mask, as thdcp_attention_params. Default -1 */
  int32_t window_right;  /* Default -1 */
  float softmax_scale;   /* 0: 1/sqrt(head_dim) */
  int32_t deterministic; /* CUDA: as thdcp_attention_params. Default 1 */
  /* ---- THDCP_CP_PARAMS_MIN_SIZE (72 bytes) ends here: optional from here on ---- */
  int32_t num_threads;   /* CPU worker threads per rank; 0: every hardware thread */
  int32_t backward_kv_from_forward; /* CUDA: nonzero = thdcp_cp_backward takes the gathered
                                       K/V the plan's last forward left in its workspace
                                       (skips a gather) — only when that forward ran on the
                                       same k, v and layout on the same stream and nothing
                                       else used the plan since. Default 0 */
  int32_t reserved_head_groups; /* 0 or 1. Was head_groups (the forward's gather in groups
                                   of heads), removed in 0.2: one group measured fastest */
  int32_t reserved;      /* 0 */
} thdcp_cp_params;

#define THDCP_CP_PARAMS_MIN_SIZE ((size_t)72)
#define THDCP_CP_PARAMS_INIT                                                                   \
  {sizeof(thdcp_cp_params), THDCP_BACKEND_CPU, THDCP_DTYPE_BF16, 0, 0, 0, 0, 1, 0, -1, -1, 0.0f, \
   1, 0, 0, 0, 0}

static inline void thdcp_cp_params_init(thdcp_cp_params* params) {
  const thdcp_cp_params defaults = THDCP_CP_PARAMS_INIT;
  *params = defaults;
}

/* Bytes of workspace thdcp_cp_plan_create needs: 0 on the CPU backend (the plan allocates
 * its host buffers when it is made); on the CUDA backend device memory for the gathered K/V,
 * the segment table, the reorder maps and the attention workspaces. Depends only on the
 * params. Not collective. */
THDCP_API thdcp_status_t thdcp_cp_plan_workspace_size(const thdcp_cp_params* params, size_t* workspace_bytes);

/* Makes this rank's plan. Collective over `comm`: every rank calls it, with the same params
 * (checked across the ranks: a disagreement fails on every rank, naming it).
 *   comm       a host communicator (CPU backend) or a device communicator (CUDA backend;
 *              its device must be current) of params->cp_size ranks; borrowed until
 *              thdcp_cp_plan_destroy
 *   workspace  CUDA: thdcp_cp_plan_workspace_size bytes of device memory of the
 *              communicator's device, borrowed for the plan's life; forward and backward
 *              share it (run them in order on one stream). CPU: ignored (may be NULL) */
THDCP_API thdcp_status_t thdcp_cp_plan_create(thdcp_communicator_t comm, const thdcp_cp_params* params,
                                             void* workspace, size_t workspace_bytes, thdcp_cp_plan_t* plan);

/* Releases the plan (not its workspace or communicator). NULL is accepted. Not collective. */
THDCP_API thdcp_status_t thdcp_cp_plan_destroy(thdcp_cp_plan_t plan);

/* One CP forward step of this rank. Collective over the plan's communicator.
 *   layout     the global layout (as thdcp_attention_forward's; every padded length a
 *              multiple of 2 * cp; cu_seqlens_padded[num_seqs] == max_tokens), the same on
 *              every rank. CPU: host, num_seqs <= max_seqs; CUDA: device, capacity form
 *   q, out     [max_tokens / cp, Hq, D] this rank's rows; k, v [max_tokens / cp, Hkv, D]
 *   lse        Hq * (max_tokens / cp) floats, [Hq, T/cp]
 *   max_logit  Hq floats (max-reduced over the group), or NULL
 *   stream     CUDA: the stream of this rank; CPU: ignored */
THDCP_API thdcp_status_t thdcp_cp_forward(thdcp_cp_plan_t plan, const thdcp_layout_t* layout,
                                         const thdcp_tensor_t* q, const thdcp_tensor_t* k, const thdcp_tensor_t* v,
                                         const thdcp_tensor_t* out, float* lse, float* max_logit,
                                         thdcp_stream_t stream);

/* One CP backward step of this rank. Collective. Shapes as the forward's; dq has q's dtype
 * or fp32, dk and dv k's dtype or fp32 (their fp32 partial sums are reduce-scattered and
 * rounded once). */
THDCP_API thdcp_status_t thdcp_cp_backward(thdcp_cp_plan_t plan, const thdcp_layout_t* layout,
                                          const thdcp_tensor_t* q, const thdcp_tensor_t* k, const thdcp_tensor_t* v,
                                          const thdcp_tensor_t* out, const thdcp_tensor_t* dout, const float* lse,
                                          const thdcp_tensor_t* dq, const thdcp_tensor_t* dk,
                                          const thdcp_tensor_t* dv, thdcp_stream_t stream);

/* ---- the dual-chunk split (host memory) --------------------------------------------- */

/* The global padded row of every local row of `rank`: global_rows[i] is the row of the
 * global tensor that local row i of `rank` holds.
 *   layout        the global host layout, every padded length a multiple of 2 * cp
 *   cp, rank      cp >= 1, 0 <= rank < cp
 *   global_rows   num_rows int32 entries, written
 *   num_rows      must be T / cp (T = cu_seqlens_padded[num_seqs]) */
THDCP_API thdcp_status_t thdcp_cp_local_rows(const thdcp_layout_t* layout, int cp, int rank, int32_t* global_rows,
                                            int64_t num_rows);

/* Copies the rows of `rank` out of a global tensor: local[i] = global[global_rows[i]], rows
 * of row_bytes bytes (e.g. heads * head_dim * element size of a contiguous THD tensor; an
 * lse [H, T] is H planes of rows of 4 bytes).
 *   global  T * row_bytes bytes; local (T / cp) * row_bytes bytes, written. Host memory,
 *           not overlapping */
THDCP_API thdcp_status_t thdcp_cp_split(const void* global, void* local, size_t row_bytes,
                                       const thdcp_layout_t* layout, int cp, int rank);

/* The inverse: writes the local rows of `rank` into their rows of `global` (other rows are
 * left as they are). */
THDCP_API thdcp_status_t thdcp_cp_merge(const void* local, void* global, size_t row_bytes,
                                       const thdcp_layout_t* layout, int cp, int rank);

/* ---- capacities and layouts (host arithmetic) ---------------------------------------- */

/* The fixed shape a plan or a captured graph is made for: layouts of max_seqs sequences
 * (max_seqs + 1 entries; one placeholder is always reserved, so at most max_seqs - 1 real
 * documents) and max_tokens rows. */
typedef struct thdcp_capacity_t {
  int64_t max_tokens;
  int32_t max_seqs;
} thdcp_capacity_t;

typedef enum thdcp_fit_t {
  THDCP_FIT_FITS = 0,
  THDCP_FIT_TOO_MANY_SEQUENCES = 1, /* the padded rows fit, the documents exceed max_seqs - 1 */
  THDCP_FIT_TOO_MANY_TOKENS = 2     /* the padded rows exceed max_tokens */
} thdcp_fit_t;

/* (max_tokens / (2 * cp) + 1, max_tokens): with it the document count never forces an
 * eager fallback. max_tokens a positive multiple of 2 * cp, cp >= 1. */
THDCP_API thdcp_status_t thdcp_capacity_default(int64_t max_tokens, int cp, thdcp_capacity_t* capacity);

/* Whether documents of `lengths` (num_documents tokens counts >= 0; zero-length documents
 * take no row and are dropped), each padded to a multiple of 2 * cp, fit `capacity`.
 * `lengths` may be NULL when num_documents is 0. */
THDCP_API thdcp_status_t thdcp_capacity_check_fit(const int64_t* lengths, int64_t num_documents, int cp,
                                                 const thdcp_capacity_t* capacity, thdcp_fit_t* fit);

/* Rows of the documents each padded to a multiple of 2 * cp. */
THDCP_API thdcp_status_t thdcp_padded_rows(const int64_t* lengths, int64_t num_documents, int cp, int64_t* rows);

/* The layout of documents packed back to back, each padded to a multiple of 2 * cp:
 * cu_seqlens and cu_seqlens_padded receive num_documents + 1 entries each. */
THDCP_API thdcp_status_t thdcp_make_layout(const int64_t* lengths, int64_t num_documents, int cp,
                                          int32_t* cu_seqlens, int32_t* cu_seqlens_padded);

/* The capacity form of a batch that fits `capacity` (zero-length documents dropped, unused
 * entries repeating the last offset, cu_seqlens_padded[max_seqs] = max_tokens): the layout
 * the CUDA backend and graphs read. cu_seqlens and cu_seqlens_padded receive
 * capacity->max_seqs + 1 entries each. A batch that does not fit is refused
 * (THDCP_ERROR_INVALID_ARGUMENT naming the limit). */
THDCP_API thdcp_status_t thdcp_capacity_layout(const int64_t* lengths, int64_t num_documents, int cp,
                                              const thdcp_capacity_t* capacity, int32_t* cu_seqlens,
                                              int32_t* cu_seqlens_padded);

/* Dynamic CP's policy: the smallest size in `cp_sizes` (num_sizes entries >= 1) whose rows
 * per rank (padded rows / size) are at most rows_per_rank. Refused when none is. */
THDCP_API thdcp_status_t thdcp_choose_cp_size(const int64_t* lengths, int64_t num_documents, const int32_t* cp_sizes,
                                             int num_sizes, int64_t rows_per_rank, int32_t* cp_size);

/* Capacity planning (thdcp plan): documents in order are packed into batches of at most
 * `tokens` rows (each padded to a multiple of 2 * cp), and the smallest max_seqs whose
 * fallback rate is within the budget is recommended (or the zero-fallback default when it
 * is at most twice as large). */
typedef struct thdcp_capacity_plan_params {
  size_t struct_size;     /* sizeof(thdcp_capacity_plan_params) */
  int64_t tokens;         /* rows per batch (max_tokens), >= 2 * cp */
  double fallback_budget; /* largest accepted fraction of batches that fall back; default 0.01 */
  int32_t cp_size;        /* >= 1; default 1 */
  int32_t long_documents; /* a document longer than a batch: 0 refuse, 1 split into pieces,
                             2 cut to a batch. Default 0 */
  /* ---- THDCP_CAPACITY_PLAN_PARAMS_MIN_SIZE (32 bytes) ---- */
} thdcp_capacity_plan_params;

#define THDCP_CAPACITY_PLAN_PARAMS_MIN_SIZE ((size_t)32)
#define THDCP_CAPACITY_PLAN_PARAMS_INIT {sizeof(thdcp_capacity_plan_params), 0, 0.01, 1, 0}

static inline void thdcp_capacity_plan_params_init(thdcp_capacity_plan_params* params) {
  const thdcp_capacity_plan_params defaults = THDCP_CAPACITY_PLAN_PARAMS_INIT;
  *params = defaults;
}

typedef struct thdcp_capacity_plan_result {
  size_t struct_size;        /* set by the caller (sizeof); the library writes what fits */
  thdcp_capacity_t capacity; /* the recommendation: (max_seqs, tokens) */
  int64_t batches;           /* batches the documents packed into */
  int64_t fallback_batches;  /* batches with more than max_seqs - 1 documents */
  double fallback_fraction;  /* fallback_batches / batches */
  double padding_fraction;   /* rows that are padding to 2 * cp / padded rows */
  int64_t metadata_bytes;    /* per rank: layouts and the CP segment table of the capacity */
  /* ---- THDCP_CAPACITY_PLAN_RESULT_MIN_SIZE (64 bytes) ---- */
} thdcp_capacity_plan_result;

#define THDCP_CAPACITY_PLAN_RESULT_MIN_SIZE ((size_t)64)

/* `lengths`: num_documents document lengths >= 1, in order. */
THDCP_API thdcp_status_t thdcp_plan_capacity(const int64_t* lengths, int64_t num_documents,
                                            const thdcp_capacity_plan_params* params,
                                            thdcp_capacity_plan_result* result);

/* ---- CUDA graph banks ---------------------------------------------------------------- */
/* A bank belongs to one rank of one CP group (a device communicator): one CUDA graph per
 * capacity, captured from the caller's work after a warm-up and replayed for every later
 * batch that fits, whatever its packing (DESIGN.md section 7). Every call is collective;
 * every rank passes the same batches in the same order. Warm the communicator up (NCCL
 * connects lazily) by running a step eagerly before the first capture (the warm-up runs
 * do). Needs a build with CUDA; else THDCP_ERROR_UNSUPPORTED. */

/* What the work of one run reads: the batch in capacity form, at device addresses that
 * never change for a capacity, so a captured graph reads each new batch. Valid during the
 * callback only. */
typedef struct thdcp_static_batch_info {
  size_t struct_size;       /* sizeof at the library's version; fields past it are absent */
  thdcp_layout_t layout;    /* device arrays, num_seqs = capacity.max_seqs: pass it to
                               thdcp_cp_forward / thdcp_cp_backward */
  const int32_t* start_offsets; /* device, capacity.max_seqs RoPE start offsets (0 unless
                                   given to thdcp_graph_bank_run) */
  thdcp_capacity_t capacity; /* what this run is at: a bucket, or its zero-fallback capacity */
  int32_t cp_size;
} thdcp_static_batch_info;

/* Enqueues one step on `stream` (typically thdcp_cp_forward/backward with plans made for
 * batch->capacity and tensors of bank buffers), and nothing that synchronises, allocates or
 * reads back: it may be under stream capture. Return THDCP_SUCCESS, or the failing call's
 * status: thdcp_graph_bank_run then fails with it (and abandons a capture in progress). */
typedef thdcp_status_t (*thdcp_graph_work_fn)(const thdcp_static_batch_info* batch, thdcp_stream_t stream,
                                              void* user_data);

typedef struct thdcp_graph_bank_params {
  size_t struct_size;          /* sizeof(thdcp_graph_bank_params) */
  int32_t warmup_runs;         /* eager runs of a capacity before its capture, >= 1; default 1 */
  int32_t thread_local_capture; /* nonzero: cudaStreamCaptureModeThreadLocal (several groups
                                   of one process capturing at once); default 0: Global */
  /* ---- THDCP_GRAPH_BANK_PARAMS_MIN_SIZE (16 bytes) ---- */
} thdcp_graph_bank_params;

#define THDCP_GRAPH_BANK_PARAMS_MIN_SIZE ((size_t)16)
#define THDCP_GRAPH_BANK_PARAMS_INIT {sizeof(thdcp_graph_bank_params), 1, 0}

static inline void thdcp_graph_bank_params_init(thdcp_graph_bank_params* params) {
  const thdcp_graph_bank_params defaults = THDCP_GRAPH_BANK_PARAMS_INIT;
  *params = defaults;
}

typedef enum thdcp_graph_how_t {
  THDCP_GRAPH_WARM_UP = 0,  /* ran eagerly before the capture */
  THDCP_GRAPH_CAPTURED = 1, /* captured now (and launched) */
  THDCP_GRAPH_REPLAYED = 2, /* replayed the captured graph */
  THDCP_GRAPH_FALLBACK = 3  /* too many documents for the bucket: ran eagerly on its
                               zero-fallback capacity */
} thdcp_graph_how_t;

typedef struct thdcp_graph_counters_t {
  int64_t warmups;
  int64_t captures;
  int64_t replays;
  int64_t fallbacks;
} thdcp_graph_counters_t;

/* A bank over `comm` (a device communicator, borrowed until thdcp_graph_bank_destroy).
 * `params` may be NULL for the defaults. */
THDCP_API thdcp_status_t thdcp_graph_bank_create(thdcp_communicator_t comm, const thdcp_graph_bank_params* params,
                                                thdcp_graph_bank_t* bank);

/* Frees the graphs and the static buffers: only once the streams that ran them are idle
 * (synchronise them first). NULL is accepted. */
THDCP_API thdcp_status_t thdcp_graph_bank_destroy(thdcp_graph_bank_t bank);

/* Adds a capacity (bucket): max_tokens a positive multiple of 2 * cp, max_seqs >= 1.
 * Allocates its static batch on the current device. Collective over the group. */
THDCP_API thdcp_status_t thdcp_graph_bank_add_capacity(thdcp_graph_bank_t bank, const thdcp_capacity_t* capacity);

/* Device memory of `capacity` named `name` (a NUL-terminated string): zeroed and allocated
 * on the first request, the same pointer for every later one (which may not ask for more
 * bytes). Shared by every layer that names it. Owned by the bank. */
THDCP_API thdcp_status_t thdcp_graph_bank_buffer(thdcp_graph_bank_t bank, const thdcp_capacity_t* capacity,
                                                const char* name, size_t bytes, void** buffer);

/* One batch: the smallest capacity whose rows it fits takes it; its static batch is filled
 * (one copy on `stream`), then `work` runs eagerly (warm-up), is captured and launched, or
 * the graph is replayed; a batch over the bucket's documents runs eagerly on the bucket's
 * zero-fallback capacity. Collective.
 *   lengths        num_documents document lengths >= 0 (zero-length ones are dropped)
 *   start_offsets  NULL, or num_documents int32 RoPE start offsets >= 0
 *   work, user_data  the step; user_data is passed through
 *   how, capacity  optional (NULL): how it ran, and at which capacity
 * A batch over every capacity's rows is refused before anything is enqueued. */
THDCP_API thdcp_status_t thdcp_graph_bank_run(thdcp_graph_bank_t bank, const int64_t* lengths, int64_t num_documents,
                                             const int32_t* start_offsets, thdcp_graph_work_fn work, void* user_data,
                                             thdcp_stream_t stream, thdcp_graph_how_t* how,
                                             thdcp_capacity_t* capacity);

/* The counters of a bucket (all 0 for a capacity the bank does not hold). */
THDCP_API thdcp_status_t thdcp_graph_bank_counters(thdcp_graph_bank_t bank, const thdcp_capacity_t* capacity,
                                                  thdcp_graph_counters_t* counters);

/* Device bytes of every static batch, named buffer and instantiated graph of the bank. */
THDCP_API thdcp_status_t thdcp_graph_bank_device_bytes(thdcp_graph_bank_t bank, size_t* bytes);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* THDCP_THDCP_H_ */
