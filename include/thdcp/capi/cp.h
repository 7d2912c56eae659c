/* Context parallelism in the C ABI: CP plans, their layouts and communications, and the
 * rank split.
 * Part of the C ABI: include <thdcp/thdcp.h>, whose conventions hold here. Pure C99. */
#ifndef THDCP_CAPI_CP_H_
#define THDCP_CAPI_CP_H_

#include "thdcp/capi/attention.h"
#include "thdcp/capi/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- context parallelism ------------------------------------------------------------ */
/* Every rank holds T/cp rows of each tensor in the order of the plan's CP layout;
 * thdcp_cp_split_ex and thdcp_cp_merge_ex move rows between the global tensor and a rank's
 * local one. Every rank passes the same global layout. */

/* How the rows of a batch are split over the ranks (thdcp_cp_params::cp_layout and the
 * trailing argument of the _ex split helpers). */
typedef enum thdcp_cp_layout_t {
  THDCP_CP_LAYOUT_DUAL_CHUNK = 0, /* DESIGN.md section 3: every sequence is cut into 2*cp
                                     chunks and rank r holds chunk r followed by chunk
                                     2*cp-1-r (balances causal masks). Every padded length
                                     P_b, and so max_tokens, a multiple of 2*cp
                                     (thdcp_make_layout pads them). The default */
  THDCP_CP_LAYOUT_CONTIGUOUS = 1  /* the packed buffer of T rows cut into cp equal pieces:
                                     rank r holds rows [r*T/cp, (r+1)*T/cp). Only T, and so
                                     max_tokens, a multiple of cp; documents need no padding
                                     and may span ranks (thdcp_make_contiguous_layout) */
} thdcp_cp_layout_t;

/* How the ranks exchange what attention needs (thdcp_cp_params::cp_comm). */
typedef enum thdcp_cp_comm_t {
  THDCP_CP_COMM_ALL_GATHER = 0, /* gather K/V over the group, reduce-scatter dK/dV
                                   (DESIGN.md section 5). Any heads. The default */
  THDCP_CP_COMM_ALL_TO_ALL = 1, /* Ulysses: an all-to-all turns the rank's rows of every head
                                   into every row of q_heads/cp query and kv_heads/cp key
                                   heads, attention runs over whole documents, and a second
                                   all-to-all turns the results back. q_heads and kv_heads
                                   multiples of cp */
  THDCP_CP_COMM_A2A_AG = 2      /* a2a+ag: an all-to-all inside each group of a2a_size
                                   consecutive ranks (rank r: member r % a2a_size of group
                                   r / a2a_size), AllGather CP across the cp / a2a_size groups
                                   (the ranks of one member index). a2a_size divides cp,
                                   q_heads and kv_heads. Both backends */
} thdcp_cp_comm_t;

/* Where thdcp_cp_backward takes K/V from (thdcp_cp_params::backward_kv_from_forward; CUDA). */
typedef enum thdcp_cp_backward_kv_t {
  THDCP_CP_BACKWARD_KV_GATHER = 0,       /* gathered again. The default */
  THDCP_CP_BACKWARD_KV_FROM_FORWARD = 1, /* the ones the plan's last forward left in its
                                            workspace (skips a gather): only when that forward
                                            ran on the same k, v and layout on the same stream
                                            and nothing else used the plan since. all_to_all
                                            and a2a+ag keep the forward's head-sharded q, k, v,
                                            out and lse too: the same q, out and lse as well */
  THDCP_CP_BACKWARD_KV_AUTO = 2          /* FROM_FORWARD exactly when it is safe, else GATHER:
                                            when the last forward over the plan's workspace
                                            memory was this plan's, on the same q, k, v, out,
                                            lse, layout arrays and stream, with no backward
                                            since (a host-side record; capture-safe) */
} thdcp_cp_backward_kv_t;

/* Which K/V rows THDCP_CP_COMM_ALL_GATHER moves (thdcp_cp_params::kv_gather). */
typedef enum thdcp_cp_kv_gather_t {
  THDCP_CP_KV_GATHER_AUTO = 0,  /* the halo where it moves fewer bytes than the whole gather,
                                   decided per step from the layout (every rank decides the
                                   same); the CUDA backend decides from the mask: the halo
                                   under THDCP_CP_LAYOUT_CONTIGUOUS with a window on both
                                   sides of left + right < the rows per rank, else whole.
                                   The default */
  THDCP_CP_KV_GATHER_WHOLE = 1, /* every rank's K/V to every rank, dK/dV reduce-scattered */
  THDCP_CP_KV_GATHER_HALO = 2   /* only the key rows this rank's queries can reach under the
                                   mask (its halo), and their dK/dV back to the ranks that
                                   hold them. The same bits as the whole gather. Not with
                                   THDCP_CP_COMM_ALL_TO_ALL. The CUDA backend: under
                                   THDCP_CP_LAYOUT_CONTIGUOUS with a window on both sides,
                                   each at most the rows per rank */
} thdcp_cp_kv_gather_t;

typedef struct thdcp_cp_params {
  size_t struct_size;    /* sizeof(thdcp_cp_params) */
  thdcp_backend_t backend; /* CPU: a host communicator; CUDA: a device communicator.
                              Default CPU */
  thdcp_dtype_t dtype;   /* q, k, v, out, dout; as thdcp_attention_params. Default bf16 */
  int64_t max_tokens;    /* global rows T of the layouts (capacity), in [0, 2^31): a
                            multiple of 2 * cp under THDCP_CP_LAYOUT_DUAL_CHUNK, of cp
                            under THDCP_CP_LAYOUT_CONTIGUOUS (cp_layout below) */
  int64_t q_heads;       /* Hq >= 1 */
  int64_t kv_heads;      /* Hkv >= 1, Hq a multiple of Hkv. THDCP_CP_COMM_ALL_TO_ALL: Hq and
                            Hkv multiples of cp */
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
  int32_t backward_kv_from_forward; /* CUDA: a thdcp_cp_backward_kv_t, where the backward
                                       takes K/V from: gathered again (0, the default), the
                                       forward's (1) or the forward's when that is safe (2).
                                       Another value is refused */
  int32_t reserved_head_groups; /* 0 or 1. Was head_groups (the forward's gather in groups
                                   of heads), removed in 0.2: one group measured fastest */
  int32_t reserved;      /* 0 */
  /* ---- appended in 0.2 (issue 27): struct_size 96 ---- */
  int64_t v_head_dim;    /* D_v of v, out, dout, dv: as thdcp_attention_params (0: head_dim;
                            CPU: a multiple of 8 in [8, 256]; CUDA: the pairs of
                            thdcp_attention_params) */
  /* ---- appended in 0.2 (issue 31): struct_size 104 ---- */
  int32_t cp_layout;     /* a thdcp_cp_layout_t: how rows are split over the ranks; it sets
                            the rule for max_tokens and the layouts above. Default
                            THDCP_CP_LAYOUT_DUAL_CHUNK (0), also what an older, shorter
                            struct gets */
  int32_t cp_comm;       /* a thdcp_cp_comm_t. Default THDCP_CP_COMM_ALL_GATHER (0). Both
                            backends run every (cp_layout, cp_comm) pair */
  /* ---- appended in 0.2 (issue 31, halo gathers and a2a+ag): struct_size 112 ---- */
  int32_t kv_gather;     /* a thdcp_cp_kv_gather_t. Default THDCP_CP_KV_GATHER_AUTO (0), also
                            what an older, shorter struct gets. THDCP_CP_KV_GATHER_HALO as
                            that enum says (with THDCP_CP_COMM_A2A_AG it is the AllGather's
                            across the groups) */
  int32_t a2a_size;      /* THDCP_CP_COMM_A2A_AG: the ranks of an all-to-all group, >= 1 and
                            dividing cp_size, q_heads and kv_heads (1: all_gather's bits,
                            cp_size: all_to_all's). Other modes: 0 or 1. Default 0 */
  /* ---- appended in 0.3 (issue 30): struct_size 120 ---- */
  int32_t reduce_dtype;  /* a thdcp_dtype_t: the dtype the whole gather's dK/dV partial sums
                            cross ranks in. THDCP_DTYPE_DEFAULT (0, the default, also what an
                            older, shorter struct gets) and THDCP_DTYPE_FP32: fp32, summed
                            then rounded once into dk, dv; params->dtype: half the bytes of
                            the reduce-scatter (each rank's partials rounded once to it; the
                            error bound is thdcp/cp/cp.h's). Another value is refused. The
                            halo gather's edges cross in fp32 */
  int32_t head_slices;   /* THDCP_CP_COMM_ALL_TO_ALL: the CUDA backend exchanges and attends a
                            rank's heads in this many slices, each slice's exchange beside
                            another's attention (the same bits for every value): a divisor of
                            q_heads / cp_size and kv_heads / cp_size; the CPU backend computes
                            every head at once. THDCP_CP_COMM_ALL_GATHER: the forward gathers
                            and attends in this many slices of heads, each slice's gather
                            beside the attention of the one before (the same bits): a divisor
                            of q_heads and kv_heads, with the whole gather (not
                            THDCP_CP_KV_GATHER_HALO). 0 or 1 (the default, and what an older
                            struct got: this was reserved2, 0): all heads at once; a2a+ag: 0
                            or 1 */
} thdcp_cp_params;

#define THDCP_CP_PARAMS_MIN_SIZE ((size_t)72)
#define THDCP_CP_PARAMS_INIT                                                                   \
  {sizeof(thdcp_cp_params), THDCP_BACKEND_CPU, THDCP_DTYPE_BF16, 0, 0, 0, 0, 1, 0, -1, -1, 0.0f, \
   1, 0, 0, 0, 0, 0, THDCP_CP_LAYOUT_DUAL_CHUNK, THDCP_CP_COMM_ALL_GATHER,                    \
   THDCP_CP_KV_GATHER_AUTO, 0, THDCP_DTYPE_DEFAULT, 0}

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

/* The K/V traffic of a step of `layout` (host arrays, as thdcp_cp_forward's on the CPU
 * backend) under a THDCP_BACKEND_CPU plan of THDCP_CP_COMM_ALL_GATHER or _A2A_AG (its
 * AllGather across the groups; the all-to-alls are not counted): which gather the step runs
 * (*gather: THDCP_CP_KV_GATHER_WHOLE or _HALO, never _AUTO) and, for every rank r of the
 * group, the bytes r receives in the forward (K and V rows) and in the backward (K and V
 * rows, then the fp32 dK/dV rows other ranks return): forward_bytes and backward_bytes hold
 * cp_size entries each. Not collective: every rank computes every rank's figures. */
THDCP_API thdcp_status_t thdcp_cp_plan_kv_traffic(thdcp_cp_plan_t plan, const thdcp_layout_t* layout,
                                                 thdcp_cp_kv_gather_t* gather, int64_t* forward_bytes,
                                                 int64_t* backward_bytes);

/* One CP forward step of this rank. Collective over the plan's communicator.
 *   layout     the global layout (as thdcp_attention_forward's;
 *              cu_seqlens_padded[num_seqs] == max_tokens; under THDCP_CP_LAYOUT_DUAL_CHUNK
 *              every padded length a multiple of 2 * cp, under THDCP_CP_LAYOUT_CONTIGUOUS
 *              any padding), the same on every rank. CPU: host, num_seqs <= max_seqs;
 *              CUDA: device, capacity form
 *   q          [max_tokens / cp, Hq, D_qk] this rank's rows, in the order of
 *              params->cp_layout (thdcp_cp_split_ex makes them), as are those of every
 *              tensor and of lse; k [max_tokens / cp, Hkv, D_qk]
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

/* ---- the rank split (host memory) ----------------------------------------------------- */
/* The plain functions split by THDCP_CP_LAYOUT_DUAL_CHUNK; their _ex twins take the layout
 * as a trailing argument (any other value is refused, naming it). */

/* The global padded row of every local row of `rank`: global_rows[i] is the row of the
 * global tensor that local row i of `rank` holds.
 *   layout        the global host layout: every padded length a multiple of 2 * cp
 *                 (dual chunk), or T = cu_seqlens_padded[num_seqs] a multiple of cp
 *                 (contiguous)
 *   cp, rank      cp >= 1, 0 <= rank < cp
 *   global_rows   num_rows int32 entries, written
 *   num_rows      must be T / cp */
THDCP_API thdcp_status_t thdcp_cp_local_rows(const thdcp_layout_t* layout, int cp, int rank, int32_t* global_rows,
                                            int64_t num_rows);
THDCP_API thdcp_status_t thdcp_cp_local_rows_ex(const thdcp_layout_t* layout, int cp, int rank,
                                               int32_t* global_rows, int64_t num_rows, thdcp_cp_layout_t cp_layout);

/* Copies the rows of `rank` out of a global tensor: local[i] = global[global_rows[i]], rows
 * of row_bytes bytes (e.g. heads * head_dim * element size of a contiguous THD tensor; an
 * lse [H, T] is H planes of rows of 4 bytes).
 *   global     T * row_bytes bytes; local (T / cp) * row_bytes bytes, written. Host memory.
 *              They may not overlap: overlapping buffers are refused
 *              (THDCP_ERROR_INVALID_ARGUMENT naming both), as the copy is not in place
 *   row_bytes  >= 1; T * row_bytes must be at most 2^63-1 (else refused, naming row_bytes)
 *   layout     as for thdcp_cp_local_rows */
THDCP_API thdcp_status_t thdcp_cp_split(const void* global, void* local, size_t row_bytes,
                                       const thdcp_layout_t* layout, int cp, int rank);
THDCP_API thdcp_status_t thdcp_cp_split_ex(const void* global, void* local, size_t row_bytes,
                                          const thdcp_layout_t* layout, int cp, int rank,
                                          thdcp_cp_layout_t cp_layout);

/* The inverse: writes the local rows of `rank` into their rows of `global` (other rows are
 * left as they are). The same checks: the buffers apart, T * row_bytes at most 2^63-1. */
THDCP_API thdcp_status_t thdcp_cp_merge(const void* local, void* global, size_t row_bytes,
                                       const thdcp_layout_t* layout, int cp, int rank);
THDCP_API thdcp_status_t thdcp_cp_merge_ex(const void* local, void* global, size_t row_bytes,
                                          const thdcp_layout_t* layout, int cp, int rank,
                                          thdcp_cp_layout_t cp_layout);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* THDCP_CAPI_CP_H_ */
