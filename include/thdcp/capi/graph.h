/* CUDA graph banks of the C ABI.
 * Part of the C ABI: include <thdcp/thdcp.h>, whose conventions hold here. Pure C99. */
#ifndef THDCP_CAPI_GRAPH_H_
#define THDCP_CAPI_GRAPH_H_

#include "thdcp/capi/types.h"

#ifdef __cplusplus
extern "C" {
#endif

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

/* A bank over `comm` (a device communicator, which the bank holds until
 * thdcp_graph_bank_destroy). `params` may be NULL for the defaults. */
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

#endif /* THDCP_CAPI_GRAPH_H_ */
