/* AllGather context parallelism in the C ABI: CP plans and the dual-chunk split.
 * Part of the C ABI: include <thdcp/thdcp.h>, whose conventions hold here. Pure C99. */
#ifndef THDCP_CAPI_CP_H_
#define THDCP_CAPI_CP_H_

#include "thdcp/capi/attention.h"
#include "thdcp/capi/types.h"

#ifdef __cplusplus
extern "C" {
#endif

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
  int64_t head_dim;      /* D_qk: as thdcp_attention_params (max_tokens * q_heads * head_dim
                            < 2^53) */
  int32_t cp_size;       /* ranks cp >= 1: must equal the communicator's size (it sizes the
                            workspace before there is a communicator) */
  int32_t max_seqs;      /* sequences of a layout (capacity), >= 1 */
  int32_t window_left;   /* mask, as thdcp_attention_params. Default -1 */
  int32_t window_right;  /* Default -1 */
  float softmax_scale;   /* finite and >= 0; 0: 1/sqrt(head_dim) */
  int32_t deterministic; /* CUDA: as thdcp_attention_params. Default 1 */
  /* ---- THDCP_CP_PARAMS_MIN_SIZE (72 bytes) ends here: optional from here on ---- */
  int32_t num_threads;   /* CPU worker threads per rank in [0, THDCP_MAX_THREADS]; 0: every
                            hardware thread */
  int32_t backward_kv_from_forward; /* CUDA: nonzero = thdcp_cp_backward takes the gathered
                                       K/V the plan's last forward left in its workspace
                                       (skips a gather) — only when that forward ran on the
                                       same k, v and layout on the same stream and nothing
                                       else used the plan since. Default 0 */
  int32_t reserved_head_groups; /* 0 or 1. Was head_groups (the forward's gather in groups
                                   of heads), removed in 0.2: one group measured fastest */
  int32_t reserved;      /* 0 */
  /* ---- appended in 0.2 (issue 27): struct_size 96 ---- */
  int64_t v_head_dim;    /* D_v of v, out, dout, dv: as thdcp_attention_params (0: head_dim;
                            CPU: a multiple of 8 in [8, 256]; CUDA: the pairs of
                            thdcp_attention_params) */
} thdcp_cp_params;

#define THDCP_CP_PARAMS_MIN_SIZE ((size_t)72)
#define THDCP_CP_PARAMS_INIT                                                                   \
  {sizeof(thdcp_cp_params), THDCP_BACKEND_CPU, THDCP_DTYPE_BF16, 0, 0, 0, 0, 1, 0, -1, -1, 0.0f, \
   1, 0, 0, 0, 0, 0}

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
 *              its device must be current) of params->cp_size ranks; the plan holds it until
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
 *   q          [max_tokens / cp, Hq, D_qk] this rank's rows; k [max_tokens / cp, Hkv, D_qk]
 *   v          [max_tokens / cp, Hkv, D_v]; out [max_tokens / cp, Hq, D_v]
 *   lse        Hq * (max_tokens / cp) floats, [Hq, T/cp]
 *   max_logit  Hq floats (max-reduced over the group), or NULL
 *   stream     CUDA: the stream of this rank; CPU: ignored */
THDCP_API thdcp_status_t thdcp_cp_forward(thdcp_cp_plan_t plan, const thdcp_layout_t* layout,
                                         const thdcp_tensor_t* q, const thdcp_tensor_t* k, const thdcp_tensor_t* v,
                                         const thdcp_tensor_t* out, float* lse, float* max_logit,
                                         thdcp_stream_t stream);

/* thdcp_cp_forward with optional tensors (thdcp_attention_extras, attention.h): its sinks,
 * the same [Hq] on every rank (a rank's query rows see every key they may, so each row counts
 * its sink once); dsinks must be NULL. NULL extras: thdcp_cp_forward. CPU backend; the CUDA
 * backend refuses sinks until its kernels of issue 27. */
THDCP_API thdcp_status_t thdcp_cp_forward_ex(thdcp_cp_plan_t plan, const thdcp_layout_t* layout,
                                            const thdcp_tensor_t* q, const thdcp_tensor_t* k,
                                            const thdcp_tensor_t* v, const thdcp_tensor_t* out, float* lse,
                                            float* max_logit, const thdcp_attention_extras* extras,
                                            thdcp_stream_t stream);

/* One CP backward step of this rank. Collective. Shapes as the forward's; dq has q's dtype
 * or fp32, dk and dv k's dtype or fp32 (their fp32 partial sums are reduce-scattered and
 * rounded once). */
THDCP_API thdcp_status_t thdcp_cp_backward(thdcp_cp_plan_t plan, const thdcp_layout_t* layout,
                                          const thdcp_tensor_t* q, const thdcp_tensor_t* k, const thdcp_tensor_t* v,
                                          const thdcp_tensor_t* out, const thdcp_tensor_t* dout, const float* lse,
                                          const thdcp_tensor_t* dq, const thdcp_tensor_t* dk,
                                          const thdcp_tensor_t* dv, thdcp_stream_t stream);

/* thdcp_cp_backward with optional tensors: the forward's sinks and, optionally, dsinks, which
 * receives on every rank the whole [Hq] gradient summed over every rank's rows, added in rank
 * order (the same bits on every rank and every run). Collective. */
THDCP_API thdcp_status_t thdcp_cp_backward_ex(thdcp_cp_plan_t plan, const thdcp_layout_t* layout,
                                             const thdcp_tensor_t* q, const thdcp_tensor_t* k,
                                             const thdcp_tensor_t* v, const thdcp_tensor_t* out,
                                             const thdcp_tensor_t* dout, const float* lse,
                                             const thdcp_tensor_t* dq, const thdcp_tensor_t* dk,
                                             const thdcp_tensor_t* dv, const thdcp_attention_extras* extras,
                                             thdcp_stream_t stream);

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
 *   global     T * row_bytes bytes; local (T / cp) * row_bytes bytes, written. Host memory.
 *              They may not overlap: overlapping buffers are refused
 *              (THDCP_ERROR_INVALID_ARGUMENT naming both), as the copy is not in place
 *   row_bytes  >= 1; T * row_bytes must be at most 2^63-1 (else refused, naming row_bytes) */
THDCP_API thdcp_status_t thdcp_cp_split(const void* global, void* local, size_t row_bytes,
                                       const thdcp_layout_t* layout, int cp, int rank);

/* The inverse: writes the local rows of `rank` into their rows of `global` (other rows are
 * left as they are). The same checks: the buffers apart, T * row_bytes at most 2^63-1. */
THDCP_API thdcp_status_t thdcp_cp_merge(const void* local, void* global, size_t row_bytes,
                                       const thdcp_layout_t* layout, int cp, int rank);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* THDCP_CAPI_CP_H_ */
