/* Capacities and layouts of the C ABI (host arithmetic): what CUDA graphs are captured for.
 * Part of the C ABI: include <thdcp/thdcp.h>, whose conventions hold here. Pure C99. */
#ifndef THDCP_CAPI_CAPACITY_H_
#define THDCP_CAPI_CAPACITY_H_

#include "thdcp/capi/types.h"

#ifdef __cplusplus
extern "C" {
#endif

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

/* Rows of the documents each padded to a multiple of 2 * cp. A sum past 2^63-1, or a length
 * within 2 * cp of it, is refused (THDCP_ERROR_INVALID_ARGUMENT naming lengths), here and in
 * every helper of this header that pads documents. */
THDCP_API thdcp_status_t thdcp_padded_rows(const int64_t* lengths, int64_t num_documents, int cp, int64_t* rows);

/* The layout of documents packed back to back, each padded to a multiple of 2 * cp:
 * cu_seqlens and cu_seqlens_padded receive num_documents + 1 entries each. */
THDCP_API thdcp_status_t thdcp_make_layout(const int64_t* lengths, int64_t num_documents, int cp,
                                          int32_t* cu_seqlens, int32_t* cu_seqlens_padded);

/* The layout of documents packed back to back with no padding, for
 * THDCP_CP_LAYOUT_CONTIGUOUS: padded lengths equal the lengths except the last document's,
 * padded so that the rows are a multiple of cp. cu_seqlens and cu_seqlens_padded receive
 * num_documents + 1 entries each; num_documents >= 1 (the last document takes the padding). */
THDCP_API thdcp_status_t thdcp_make_contiguous_layout(const int64_t* lengths, int64_t num_documents, int cp,
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
 * per rank (padded rows / size) are at most rows_per_rank (>= 1; rows_per_rank * size must
 * fit 64 bits). Refused when none is. */
THDCP_API thdcp_status_t thdcp_choose_cp_size(const int64_t* lengths, int64_t num_documents, const int32_t* cp_sizes,
                                             int num_sizes, int64_t rows_per_rank, int32_t* cp_size);

/* Capacity planning (thdcp plan): documents in order are packed into batches of at most
 * `tokens` rows (each padded to a multiple of 2 * cp), and the smallest max_seqs whose
 * fallback rate is within the budget is recommended (or the zero-fallback default when it
 * is at most twice as large). */
typedef struct thdcp_capacity_plan_params {
  size_t struct_size;     /* sizeof(thdcp_capacity_plan_params) */
  int64_t tokens;         /* rows per batch (max_tokens), >= 2 * cp, < 2^31 */
  double fallback_budget; /* largest accepted fraction of batches that fall back; default 0.01 */
  int32_t cp_size;        /* >= 1; default 1 */
  int32_t long_documents; /* a document longer than a batch: 0 refuse, 1 split into pieces
                             (at most 2^31-1 documents in all), 2 cut to a batch. Default 0 */
  /* ---- THDCP_CAPACITY_PLAN_PARAMS_MIN_SIZE (32 bytes) ---- */
  int64_t max_memory;     /* bytes of host memory planning may hold (its estimate, made
                             before anything is allocated, is checked against it); 0: this
                             machine's physical memory. Default 0 */
} thdcp_capacity_plan_params;

#define THDCP_CAPACITY_PLAN_PARAMS_MIN_SIZE ((size_t)32)
#define THDCP_CAPACITY_PLAN_PARAMS_INIT {sizeof(thdcp_capacity_plan_params), 0, 0.01, 1, 0, 0}

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

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* THDCP_CAPI_CAPACITY_H_ */
