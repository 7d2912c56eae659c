/* The C ABI's common types: statuses, dtypes, backends, features, streams, the opaque
 * handles, the library's version and errors, tensors and layouts.
 * Part of the C ABI: include <thdcp/thdcp.h>, whose conventions hold here. Pure C99. */
#ifndef THDCP_CAPI_TYPES_H_
#define THDCP_CAPI_TYPES_H_

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

typedef enum thdcp_status_t {
  THDCP_SUCCESS = 0,
  THDCP_ERROR_INVALID_ARGUMENT = 1, /* a NULL handle or pointer, a wrong shape, dtype, size,
                                       layout, struct_size; ranks that disagree */
  THDCP_ERROR_UNSUPPORTED = 2,      /* built without the part (CUDA, NCCL, MPI), or no GPU */
  THDCP_ERROR_CUDA = 3,             /* a CUDA runtime call failed */
  THDCP_ERROR_COMMUNICATION = 4,    /* a collective failed: another rank failed or aborted the
                                       group, NCCL/MPI reported an error or timed out */
  THDCP_ERROR_OUT_OF_MEMORY = 5,    /* host (std::bad_alloc) or device memory */
  THDCP_ERROR_INTERNAL = 6,         /* a bug in thdcp: please report the message */
  THDCP_ERROR_INVALID_HANDLE = 7    /* a non-NULL handle that is not live: destroyed already
                                       (a second destroy, a use after destroy), never returned
                                       by this library (uninitialised, zeroed or foreign
                                       memory), or a handle of another type. Nothing is read
                                       through it, and a destroy releases nothing */
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

/* The largest struct_size a versioned struct (thdcp_*_params, thdcp_capacity_plan_result)
 * may have: a larger one is refused (THDCP_ERROR_INVALID_ARGUMENT) before any byte past the
 * struct_size field is read, as a value no version of a struct reaches (an unset field). */
#define THDCP_MAX_STRUCT_SIZE ((size_t)4096)

/* The most CPU worker threads a plan may ask for (num_threads of thdcp_attention_params
 * and thdcp_cp_params); more is refused when the plan is made. */
#define THDCP_MAX_THREADS 4096

/* The most ranks of a group made in one process (thdcp_communicator_create_in_process_group,
 * thdcp_communicator_create_shared_gpu_group), whose ranks are threads of the process; a
 * larger size is refused before anything is allocated. */
#define THDCP_MAX_GROUP_SIZE 1024

/* ---- opaque handles ----------------------------------------------------------------- */

typedef struct thdcp_attention_plan_st* thdcp_attention_plan_t; /* single-device attention */
typedef struct thdcp_cp_plan_st* thdcp_cp_plan_t;               /* AllGather CP attention */
typedef struct thdcp_communicator_st* thdcp_communicator_t;     /* one rank of a group */
typedef struct thdcp_graph_bank_st* thdcp_graph_bank_t;         /* CUDA graphs per capacity */

/* ---- library ------------------------------------------------------------------------ */

/* The project version, e.g. "0.2.0". Never NULL; static storage. */
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

/* A THD tensor view [rows, heads, head_dim] with head_dim contiguous: element (r, h, d) is at
 * data + (r * row_stride + h * head_stride + d) elements. Strides are in elements, >= 0, in
 * any order; 0 means contiguous (row_stride = heads * head_dim, head_stride = head_dim). So
 * q, k and v may be views of one packed QKV buffer [T, Hq + 2 Hkv, D]:
 *   q: data = qkv,                  heads = Hq,  row_stride = (Hq + 2 Hkv) * D
 *   k: data = qkv + Hq * D,         heads = Hkv, row_stride = (Hq + 2 Hkv) * D
 *   v: data = qkv + (Hq + Hkv) * D, heads = Hkv, row_stride = (Hq + 2 Hkv) * D
 * or head-major memory [H, S, D] (heads before rows, as a KV cache holds K/V; S >= rows):
 *   row_stride = D, head_stride = S * D
 * Every backend takes every such view, forward and backward, with no copy (CP plans: the
 * local tensors too). Inputs (q, k, v, dout, and out where the backward reads it) are only
 * read, although `data` is not const, and may overlap; outputs (out, dq, dk, dv) must not
 * overlap themselves or any other tensor of the call (refused, naming the tensors and the
 * colliding elements). `data` is a host pointer (CPU backend) or a device pointer of the
 * current device (CUDA backend; there `data` and each stride a tensor applies -- row_stride
 * with more than one row, head_stride with more than one head -- are multiples of 16 bytes,
 * i.e. 8 elements of bf16/fp16, and fp32 dk/dv of the single-device plan are contiguous).
 * The caller owns the memory. A tensor whose last element's byte offset overflows 64 bits (a
 * garbage stride) is refused, naming it. */
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

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* THDCP_CAPI_TYPES_H_ */
