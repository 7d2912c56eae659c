/* Single-device attention plans of the C ABI.
 * Part of the C ABI: include <thdcp/thdcp.h>, whose conventions hold here. Pure C99. */
#ifndef THDCP_CAPI_ATTENTION_H_
#define THDCP_CAPI_ATTENTION_H_

#include "thdcp/capi/types.h"

#ifdef __cplusplus
extern "C" {
#endif

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
  int64_t head_dim;      /* D_qk, of q and k. CPU: a multiple of 8 in [8, 256]; CUDA: 64, 96,
                            128, 192 or 256, with v_head_dim below. max_tokens * q_heads *
                            head_dim < 2^53 (every size the plan derives then fits 64 bits;
                            larger is refused as an overflow) */
  int32_t max_seqs;      /* sequences a layout may have (capacity), >= 1 */
  int32_t window_left;   /* mask, see above; >= -1. Default -1 */
  int32_t window_right;  /* >= -1. Default -1 (full attention) */
  float softmax_scale;   /* scale of q.k, finite and >= 0; 0: 1/sqrt(head_dim) (D_qk).
                            Default 0 */
  /* ---- THDCP_ATTENTION_PARAMS_MIN_SIZE (64 bytes) ends here: optional from here on ---- */
  int32_t deterministic; /* CUDA backward: nonzero = the same bits on every run (default 1);
                            0 lets the portable kernels add dQ with atomics. CPU: always
                            deterministic */
  thdcp_dtype_t dq_dtype;  /* backward dq: the plan's dtype or fp32. Default
                              THDCP_DTYPE_DEFAULT: the plan's dtype */
  thdcp_dtype_t dkv_dtype; /* backward dk and dv: the plan's dtype or fp32. Default: dtype */
  int32_t num_threads;   /* CPU worker threads in [0, THDCP_MAX_THREADS]; 0: every hardware
                            thread. Default 0 */
  /* ---- appended in 0.2 (issue 27): struct_size 88 ---- */
  int64_t v_head_dim;    /* D_v, of v, out, dout and dv; 0: D_v = head_dim. Default 0. CPU:
                            a multiple of 8 in [8, 256], any pair with head_dim (MLA: 192 and
                            128); CUDA: head_dim (or 0) with head_dim in {64, 96, 128, 192,
                            256}, or 128 with head_dim 192 (MLA); another pair is refused
                            when the plan is made.
                            max_tokens * q_heads * v_head_dim < 2^53 */
} thdcp_attention_params;

#define THDCP_ATTENTION_PARAMS_MIN_SIZE ((size_t)64)
#define THDCP_ATTENTION_PARAMS_INIT                                                              \
  {sizeof(thdcp_attention_params), THDCP_BACKEND_CPU, THDCP_DTYPE_BF16, 0, 0, 0, 0, 0, -1, -1, \
   0.0f, 1, THDCP_DTYPE_DEFAULT, THDCP_DTYPE_DEFAULT, 0, 0}

static inline void thdcp_attention_params_init(thdcp_attention_params* params) {
  const thdcp_attention_params defaults = THDCP_ATTENTION_PARAMS_INIT;
  *params = defaults;
}

/* The optional tensors of a forward or backward call (thdcp_attention_forward_ex,
 * thdcp_attention_backward_ex; thdcp_cp_forward_ex, thdcp_cp_backward_ex), a versioned struct like the params: struct_size first (the
 * sizeof the caller was compiled with; THDCP_ATTENTION_EXTRAS_INIT sets it), fields only
 * appended, later ones default to NULL/0, the same struct_size rules
 * (THDCP_ATTENTION_EXTRAS_MIN_SIZE to THDCP_MAX_STRUCT_SIZE, bytes this library does not know
 * must be 0). NULL instead of the struct: none of them.
 *
 * Attention sinks (gpt-oss): one learnable logit per query head. Each query row's softmax
 * denominator gains exp(sinks[h] - m) (m the row's running max, the sink included); the sink
 * adds no value and is not scaled by softmax_scale. lse includes the sink (a row that sees no
 * key has lse = sinks[h] and out 0); max_logit excludes it. Backends: the CPU backend; the
 * CUDA backend refuses sinks (THDCP_ERROR_INVALID_ARGUMENT naming them) until the kernels of
 * issue 27. */
typedef struct thdcp_attention_extras {
  size_t struct_size;  /* sizeof(thdcp_attention_extras) */
  const float* sinks;  /* NULL, or q_heads floats [Hq], in the memory space of the tensors. A
                          backward takes the forward's sinks */
  float* dsinks;       /* backward only: NULL, or q_heads floats [Hq] where d(loss)/d(sinks[h])
                          is written, summed over every valid query row in a fixed order (the
                          same bits every run). Needs sinks; must not overlap them. A forward
                          refuses it */
} thdcp_attention_extras;

#define THDCP_ATTENTION_EXTRAS_MIN_SIZE ((size_t)24)
#define THDCP_ATTENTION_EXTRAS_INIT {sizeof(thdcp_attention_extras), NULL, NULL}

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
 *   q          [max_tokens, Hq, D_qk], the plan's dtype (D_qk = params->head_dim)
 *   k          [max_tokens, Hkv, D_qk], the plan's dtype
 *   v          [max_tokens, Hkv, D_v], the plan's dtype (D_v = params->v_head_dim, or
 *              head_dim where that is 0)
 *   out        [max_tokens, Hq, D_v], the plan's dtype. Every row is written: padding rows and
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

/* thdcp_attention_forward with optional tensors: `extras` NULL, or its sinks (dsinks must be
 * NULL). thdcp_attention_forward(...) is thdcp_attention_forward_ex(..., NULL, stream). */
THDCP_API thdcp_status_t thdcp_attention_forward_ex(thdcp_attention_plan_t plan, const thdcp_layout_t* layout,
                                                   const thdcp_tensor_t* q, const thdcp_tensor_t* k,
                                                   const thdcp_tensor_t* v, const thdcp_tensor_t* out, float* lse,
                                                   float* max_logit, const thdcp_attention_extras* extras,
                                                   thdcp_stream_t stream);

/* Backward attention from the forward's out and lse.
 *   layout, q, k, v, stream  as for the forward
 *   out, lse   the forward's results for this batch
 *   dout       [max_tokens, Hq, D_v], the plan's dtype
 *   dq         [max_tokens, Hq, D_qk], the plan's dq_dtype. Every row is written
 *   dk, dv     [max_tokens, Hkv, D_qk] and [max_tokens, Hkv, D_v], the plan's dkv_dtype.
 *              Summed in fp32 over the query heads of each KV group, rounded once; rows no
 *              query saw are exactly 0 */
THDCP_API thdcp_status_t thdcp_attention_backward(thdcp_attention_plan_t plan, const thdcp_layout_t* layout,
                                                 const thdcp_tensor_t* q, const thdcp_tensor_t* k,
                                                 const thdcp_tensor_t* v, const thdcp_tensor_t* out,
                                                 const thdcp_tensor_t* dout, const float* lse,
                                                 const thdcp_tensor_t* dq, const thdcp_tensor_t* dk,
                                                 const thdcp_tensor_t* dv, thdcp_stream_t stream);

/* thdcp_attention_backward with optional tensors: `extras` NULL, or the forward's sinks and,
 * optionally, dsinks to receive their gradient (dsinks without sinks is refused).
 * thdcp_attention_backward(...) is thdcp_attention_backward_ex(..., NULL, stream). */
THDCP_API thdcp_status_t thdcp_attention_backward_ex(thdcp_attention_plan_t plan, const thdcp_layout_t* layout,
                                                    const thdcp_tensor_t* q, const thdcp_tensor_t* k,
                                                    const thdcp_tensor_t* v, const thdcp_tensor_t* out,
                                                    const thdcp_tensor_t* dout, const float* lse,
                                                    const thdcp_tensor_t* dq, const thdcp_tensor_t* dk,
                                                    const thdcp_tensor_t* dv, const thdcp_attention_extras* extras,
                                                    thdcp_stream_t stream);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* THDCP_CAPI_ATTENTION_H_ */
