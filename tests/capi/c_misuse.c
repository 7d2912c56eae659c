/* A hostile caller of the C ABI, compiled as C99 (-pedantic-errors): handles destroyed twice,
 * used after destroy, zeroed or foreign memory passed as handles; struct sizes that are too
 * large, garbage or end where the caller's memory ends; sizes that overflow and buffers that
 * overlap; plan fields a run would refuse; groups too large to make. Every call must return
 * its status with a message naming the function, the argument and what to do, and nothing
 * may crash or read what the caller did not pass (the sanitizer job, tests/sanitize/run.sh,
 * runs this program under ASan and UBSan; a foreign handle points into a page that faults on
 * any access, so a read through it crashes even without them). Exits 0 when every check
 * holds. */
#define _DEFAULT_SOURCE /* mmap with MAP_ANONYMOUS */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "thdcp/thdcp.h"

static int failures = 0;

/* `status` is `expected`, and the last error contains each of the words given (NULL: none). */
static void expect(const char* what, thdcp_status_t status, thdcp_status_t expected, const char* word1,
                   const char* word2, const char* word3) {
  const char* words[3];
  const char* message = thdcp_last_error();
  int i;
  words[0] = word1;
  words[1] = word2;
  words[2] = word3;
  if (status != expected) {
    fprintf(stderr, "FAILED: %s: %s, expected %s (last error: %s)\n", what, thdcp_status_name(status),
            thdcp_status_name(expected), message);
    ++failures;
    return;
  }
  for (i = 0; i < 3; ++i) {
    if (words[i] != NULL && strstr(message, words[i]) == NULL) {
      fprintf(stderr, "FAILED: %s: the message lacks \"%s\": %s\n", what, words[i], message);
      ++failures;
    }
  }
}

static void check(int ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "FAILED: %s (last error: %s)\n", what, thdcp_last_error());
    ++failures;
  }
}

#define ROWS 8
#define HEAD_DIM 8

static thdcp_attention_params attention_params(void) {
  thdcp_attention_params p = THDCP_ATTENTION_PARAMS_INIT;
  p.dtype = THDCP_DTYPE_FP32;
  p.max_tokens = ROWS;
  p.max_seqs = 1;
  p.q_heads = 1;
  p.kv_heads = 1;
  p.head_dim = HEAD_DIM;
  p.window_right = 0;
  p.num_threads = 1;
  return p;
}

static thdcp_cp_params cp_params(void) {
  thdcp_cp_params p = THDCP_CP_PARAMS_INIT;
  p.dtype = THDCP_DTYPE_FP32;
  p.max_tokens = ROWS;
  p.max_seqs = 1;
  p.q_heads = 1;
  p.kv_heads = 1;
  p.head_dim = HEAD_DIM;
  p.cp_size = 1;
  p.num_threads = 1;
  return p;
}

static thdcp_tensor_t tensor(float* data) {
  thdcp_tensor_t t;
  memset(&t, 0, sizeof(t));
  t.data = data;
  t.rows = ROWS;
  t.heads = 1;
  t.head_dim = HEAD_DIM;
  t.dtype = THDCP_DTYPE_FP32;
  return t;
}

/* One batch of one sequence of ROWS tokens, and its tensors. */
static float q_data[ROWS * HEAD_DIM], k_data[ROWS * HEAD_DIM], v_data[ROWS * HEAD_DIM], out_data[ROWS * HEAD_DIM];
static float lse_data[ROWS];
static const int32_t cu_seqlens[2] = {0, ROWS};

static thdcp_status_t attention_forward(thdcp_attention_plan_t plan) {
  thdcp_layout_t layout;
  thdcp_tensor_t q = tensor(q_data), k = tensor(k_data), v = tensor(v_data), out = tensor(out_data);
  layout.cu_seqlens = cu_seqlens;
  layout.cu_seqlens_padded = cu_seqlens;
  layout.num_seqs = 1;
  return thdcp_attention_forward(plan, &layout, &q, &k, &v, &out, lse_data, NULL, NULL);
}

static thdcp_status_t cp_forward(thdcp_cp_plan_t plan) {
  thdcp_layout_t layout;
  thdcp_tensor_t q = tensor(q_data), k = tensor(k_data), v = tensor(v_data), out = tensor(out_data);
  layout.cu_seqlens = cu_seqlens;
  layout.cu_seqlens_padded = cu_seqlens;
  layout.num_seqs = 1;
  return thdcp_cp_forward(plan, &layout, &q, &k, &v, &out, lse_data, NULL, NULL);
}

static void poison_outputs(void) {
  int i;
  for (i = 0; i < ROWS * HEAD_DIM; ++i) out_data[i] = -77.0f;
  for (i = 0; i < ROWS; ++i) lse_data[i] = -77.0f;
}

static int outputs_poisoned(void) {
  int i;
  for (i = 0; i < ROWS * HEAD_DIM; ++i) {
    if (out_data[i] != -77.0f) return 0;
  }
  for (i = 0; i < ROWS; ++i) {
    if (lse_data[i] != -77.0f) return 0;
  }
  return 1;
}

static void handles_destroyed_twice_and_used_after_destroy(void) {
  const thdcp_attention_params ap = attention_params();
  const thdcp_cp_params cpp = cp_params();
  thdcp_attention_plan_t plan = NULL;
  thdcp_communicator_t comm = NULL;
  thdcp_cp_plan_t cp_plan = NULL;
  int rank = -3;

  check(thdcp_attention_plan_create(&ap, NULL, 0, &plan) == THDCP_SUCCESS, "attention plan");
  poison_outputs();
  check(attention_forward(plan) == THDCP_SUCCESS && !outputs_poisoned(), "a live plan runs");
  check(thdcp_attention_plan_destroy(plan) == THDCP_SUCCESS, "destroy");
  expect("attention plan destroyed twice", thdcp_attention_plan_destroy(plan), THDCP_ERROR_INVALID_HANDLE,
         "thdcp_attention_plan_destroy: plan=0x", "is not a live thdcp_attention_plan_t", "destroyed already");
  poison_outputs();
  expect("attention forward after destroy", attention_forward(plan), THDCP_ERROR_INVALID_HANDLE,
         "thdcp_attention_forward: plan=0x", "is not a live thdcp_attention_plan_t", NULL);
  check(outputs_poisoned(), "a use after destroy writes nothing");

  check(thdcp_communicator_create_in_process_group(1, &comm) == THDCP_SUCCESS, "communicator");
  check(thdcp_cp_plan_create(comm, &cpp, NULL, 0, &cp_plan) == THDCP_SUCCESS, "CP plan");
  check(thdcp_cp_plan_destroy(cp_plan) == THDCP_SUCCESS, "destroy");
  expect("CP plan destroyed twice", thdcp_cp_plan_destroy(cp_plan), THDCP_ERROR_INVALID_HANDLE,
         "thdcp_cp_plan_destroy: plan=0x", "is not a live thdcp_cp_plan_t", "destroyed already");
  poison_outputs();
  expect("CP forward after destroy", cp_forward(cp_plan), THDCP_ERROR_INVALID_HANDLE, "thdcp_cp_forward: plan=0x",
         "is not a live thdcp_cp_plan_t", NULL);
  check(outputs_poisoned(), "a use after destroy writes nothing");

  check(thdcp_communicator_destroy(comm) == THDCP_SUCCESS, "destroy");
  expect("communicator destroyed twice", thdcp_communicator_destroy(comm), THDCP_ERROR_INVALID_HANDLE,
         "thdcp_communicator_destroy: comm=0x", "is not a live thdcp_communicator_t", "destroyed already");
  expect("communicator used after destroy", thdcp_communicator_rank(comm, &rank), THDCP_ERROR_INVALID_HANDLE,
         "thdcp_communicator_rank: comm=0x", "is not a live thdcp_communicator_t", NULL);
  check(rank == -3, "a refused query writes nothing");
  expect("CP plan over a destroyed communicator", thdcp_cp_plan_create(comm, &cpp, NULL, 0, &cp_plan),
         THDCP_ERROR_INVALID_HANDLE, "thdcp_cp_plan_create: comm=0x", "is not a live thdcp_communicator_t", NULL);

  check(thdcp_attention_plan_destroy(NULL) == THDCP_SUCCESS && thdcp_communicator_destroy(NULL) == THDCP_SUCCESS &&
            thdcp_cp_plan_destroy(NULL) == THDCP_SUCCESS && thdcp_graph_bank_destroy(NULL) == THDCP_SUCCESS,
        "destroy(NULL) is a no-op");
}

/* Each of the four handle types made of `memory`, which the library never returned. */
static void foreign_handles(void* memory, const char* what) {
  char label[128];
  int size = -3;
  size_t bytes = 5;
  sprintf(label, "%s as an attention plan", what);
  expect(label, thdcp_attention_plan_destroy((thdcp_attention_plan_t)memory), THDCP_ERROR_INVALID_HANDLE,
         "thdcp_attention_plan_destroy: plan=0x", "is not a live thdcp_attention_plan_t", "nothing was released");
  poison_outputs();
  expect(label, attention_forward((thdcp_attention_plan_t)memory), THDCP_ERROR_INVALID_HANDLE,
         "is not a live thdcp_attention_plan_t", NULL, NULL);
  check(outputs_poisoned(), "a foreign plan writes nothing");
  sprintf(label, "%s as a communicator", what);
  expect(label, thdcp_communicator_destroy((thdcp_communicator_t)memory), THDCP_ERROR_INVALID_HANDLE,
         "thdcp_communicator_destroy: comm=0x", "is not a live thdcp_communicator_t", NULL);
  expect(label, thdcp_communicator_size((thdcp_communicator_t)memory, &size), THDCP_ERROR_INVALID_HANDLE,
         "thdcp_communicator_size: comm=0x", NULL, NULL);
  check(size == -3, "a refused query writes nothing");
  sprintf(label, "%s as a CP plan", what);
  expect(label, thdcp_cp_plan_destroy((thdcp_cp_plan_t)memory), THDCP_ERROR_INVALID_HANDLE,
         "thdcp_cp_plan_destroy: plan=0x", "is not a live thdcp_cp_plan_t", NULL);
  sprintf(label, "%s as a graph bank", what);
  expect(label, thdcp_graph_bank_destroy((thdcp_graph_bank_t)memory), THDCP_ERROR_INVALID_HANDLE,
         "thdcp_graph_bank_destroy: bank=0x", "is not a live thdcp_graph_bank_t", NULL);
  expect(label, thdcp_graph_bank_device_bytes((thdcp_graph_bank_t)memory, &bytes), THDCP_ERROR_INVALID_HANDLE,
         "thdcp_graph_bank_device_bytes: bank=0x", NULL, NULL);
  check(bytes == 5, "a refused query writes nothing");
}

static void zeroed_and_foreign_handles(void) {
  struct {
    double words[16];
  } on_stack;
  void* zeroed = calloc(1, 512);
  void* page = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  check(zeroed != NULL && page != MAP_FAILED, "test memory");
  memset(&on_stack, 0, sizeof(on_stack));
  foreign_handles(zeroed, "zeroed heap memory");
  foreign_handles(&on_stack, "a stack struct");
  foreign_handles((char*)page + 128, "an unreadable page");
  munmap(page, 4096);
  free(zeroed);
}

/* Two pages, the second faulting on any access: end_of_page(bytes) is where a struct of
 * `bytes` bytes ends exactly at the boundary, so a read past its struct_size crashes. */
static unsigned char* guarded_pages = NULL;

static void* end_of_page(size_t bytes) {
  memset(guarded_pages, 0, 4096);
  return guarded_pages + 4096 - bytes;
}

static void struct_sizes(void) {
  const thdcp_attention_params good = attention_params();
  thdcp_attention_params* p;
  thdcp_capacity_plan_params plan_params = THDCP_CAPACITY_PLAN_PARAMS_INIT;
  thdcp_capacity_plan_result* result;
  thdcp_attention_plan_t plan = NULL;
  const int64_t lengths[2] = {5, 9};
  size_t bytes = 0;
  unsigned char* extra;
  thdcp_cp_params good_cp;
  thdcp_cp_params* cp;

  guarded_pages = mmap(NULL, 2 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  check(guarded_pages != MAP_FAILED && mprotect(guarded_pages + 4096, 4096, PROT_NONE) == 0, "guarded pages");

  /* The first version, 64 bytes, at the end of the page: the later fields are not read. */
  p = end_of_page(THDCP_ATTENTION_PARAMS_MIN_SIZE);
  memcpy(p, &good, THDCP_ATTENTION_PARAMS_MIN_SIZE);
  p->struct_size = THDCP_ATTENTION_PARAMS_MIN_SIZE;
  check(thdcp_attention_plan_create(p, NULL, 0, &plan) == THDCP_SUCCESS, "the first version of the params");
  check(thdcp_attention_plan_destroy(plan) == THDCP_SUCCESS, "destroy");
  plan = NULL;

  /* A newer struct, 16 bytes longer: accepted with the extra bytes 0, refused naming the
   * first nonzero one. */
  p = end_of_page(sizeof(thdcp_attention_params) + 16);
  memcpy(p, &good, sizeof(good));
  p->struct_size = sizeof(thdcp_attention_params) + 16;
  check(thdcp_attention_plan_workspace_size(p, &bytes) == THDCP_SUCCESS, "a newer struct, its extra bytes 0");
  extra = (unsigned char*)p + sizeof(thdcp_attention_params);
  extra[9] = 1;
  expect("a newer struct with a field set", thdcp_attention_plan_workspace_size(p, &bytes),
         THDCP_ERROR_INVALID_ARGUMENT, "params->struct_size=", "is not 0", "link the libthdcp of that thdcp.h");

  /* Garbage struct_size: refused before anything past the field is read. */
  p = end_of_page(sizeof(thdcp_attention_params));
  memcpy(p, &good, sizeof(good));
  p->struct_size = (size_t)1 << 40;
  expect("struct_size 2^40", thdcp_attention_plan_create(p, NULL, 0, &plan), THDCP_ERROR_INVALID_ARGUMENT,
         "thdcp_attention_plan_create: params->struct_size=1099511627776", "larger than THDCP_MAX_STRUCT_SIZE=4096",
         "set struct_size = sizeof(thdcp_attention_params)");
  p->struct_size = THDCP_MAX_STRUCT_SIZE + 8;
  expect("struct_size past the maximum", thdcp_attention_plan_create(p, NULL, 0, &plan),
         THDCP_ERROR_INVALID_ARGUMENT, "params->struct_size=4104", "THDCP_MAX_STRUCT_SIZE", NULL);
  p->struct_size = 68;
  expect("struct_size not a multiple of 8", thdcp_attention_plan_create(p, NULL, 0, &plan),
         THDCP_ERROR_INVALID_ARGUMENT, "params->struct_size=68", "a multiple of 8", NULL);
  p->struct_size = 56;
  expect("struct_size below the first version", thdcp_attention_plan_create(p, NULL, 0, &plan),
         THDCP_ERROR_INVALID_ARGUMENT, "params->struct_size=56", "the first version has 64 bytes", NULL);
  check(plan == NULL, "a refused create writes no handle");

  /* The output struct: its first version at the end of the page receives only what fits. */
  plan_params.tokens = 64;
  result = end_of_page(THDCP_CAPACITY_PLAN_RESULT_MIN_SIZE);
  result->struct_size = THDCP_CAPACITY_PLAN_RESULT_MIN_SIZE;
  check(thdcp_plan_capacity(lengths, 2, &plan_params, result) == THDCP_SUCCESS && result->batches == 1,
        "the first version of the result");
  result->struct_size = (size_t)-8;
  result->batches = -1;
  expect("a garbage result struct_size", thdcp_plan_capacity(lengths, 2, &plan_params, result),
         THDCP_ERROR_INVALID_ARGUMENT, "result->struct_size=", "THDCP_MAX_STRUCT_SIZE", NULL);
  check(result->batches == -1, "a refused call writes no result");

  /* CP params of the version before cp_layout and cp_comm (96 bytes) at the end of the page:
   * the two fields are not read, and the plan gets dual chunk and all-gather. */
  good_cp = cp_params();
  cp = end_of_page(96);
  memcpy(cp, &good_cp, 96);
  cp->struct_size = 96;
  check(thdcp_cp_plan_workspace_size(cp, &bytes) == THDCP_SUCCESS, "the CP params before cp_layout");
  munmap(guarded_pages, 2 * 4096);
}

static void sizes_that_overflow(void) {
  /* Two documents of 5 and 11 tokens at cp = 2: T = 8 + 12 = 20 rows, 10 per rank. */
  const int32_t cu[3] = {0, 5, 16}, cu_padded[3] = {0, 8, 20};
  const int64_t too_long[2] = {(int64_t)1 << 62, (int64_t)1 << 62};
  float memory[40];
  float local[10];
  thdcp_layout_t layout;
  int64_t rows = -1;
  int i, untouched = 1;
  layout.cu_seqlens = cu;
  layout.cu_seqlens_padded = cu_padded;
  layout.num_seqs = 2;
  for (i = 0; i < 40; ++i) memory[i] = (float)i;
  for (i = 0; i < 10; ++i) local[i] = -1.0f;

  expect("split with row_bytes 2^62", thdcp_cp_split(memory, local, (size_t)1 << 62, &layout, 2, 0),
         THDCP_ERROR_INVALID_ARGUMENT, "thdcp_cp_split: row_bytes=4611686018427387904",
         "times the layout's T=20 rows", "the bytes of one row");
  expect("merge with row_bytes 2^62", thdcp_cp_merge(local, memory, (size_t)1 << 62, &layout, 2, 1),
         THDCP_ERROR_INVALID_ARGUMENT, "thdcp_cp_merge: row_bytes=4611686018427387904", NULL, NULL);
  expect("split into an overlapping local", thdcp_cp_split(memory, memory + 10, 4, &layout, 2, 0),
         THDCP_ERROR_INVALID_ARGUMENT, "thdcp_cp_split: global=", "and local=", "overlap");
  expect("merge from an overlapping local", thdcp_cp_merge(memory + 19, memory, 4, &layout, 2, 1),
         THDCP_ERROR_INVALID_ARGUMENT, "thdcp_cp_merge: local=", "and global=", "overlap");
  for (i = 0; i < 10; ++i) untouched = untouched && local[i] == -1.0f;
  for (i = 0; i < 40; ++i) untouched = untouched && memory[i] == (float)i;
  check(untouched, "refused splits and merges write nothing");
  check(thdcp_cp_split(memory, memory + 20, 4, &layout, 2, 0) == THDCP_SUCCESS && memory[20] == 0.0f &&
            memory[21] == 1.0f && memory[24] == 8.0f,
        "buffers side by side are accepted: rank 0 holds rows 0, 1, 6, 7 of the first document");

  expect("padded rows past 2^63-1", thdcp_padded_rows(too_long, 2, 1, &rows), THDCP_ERROR_INVALID_ARGUMENT,
         "thdcp_padded_rows: lengths: the documents padded to multiples of 2*cp=2", "more than 2^63-1 rows",
         "lengths[1]=4611686018427387904");
  check(rows == -1, "a refused call writes no rows");
  check(thdcp_padded_rows(too_long, 1, 1, &rows) == THDCP_SUCCESS && rows == (int64_t)1 << 62, "2^62 rows fit");
}

/* Every field a plan stores is checked when it is made, not first at a run. */
static void plan_fields(void) {
  thdcp_attention_params ap = attention_params();
  thdcp_cp_params cpp = cp_params();
  thdcp_attention_plan_t plan = NULL;
  thdcp_cp_plan_t cp_plan = NULL;
  thdcp_communicator_t comm = NULL;
  size_t bytes = 3;

  ap.softmax_scale = -1.0f;
  expect("softmax_scale -1", thdcp_attention_plan_create(&ap, NULL, 0, &plan), THDCP_ERROR_INVALID_ARGUMENT,
         "thdcp_attention_plan_create: params->softmax_scale=-1", "must be finite and >= 0",
         "0 for 1/sqrt(head_dim)");
  ap.softmax_scale = NAN;
  expect("softmax_scale NaN", thdcp_attention_plan_create(&ap, NULL, 0, &plan), THDCP_ERROR_INVALID_ARGUMENT,
         "params->softmax_scale=", "nan must be finite and >= 0", NULL);
  expect("softmax_scale NaN, workspace size", thdcp_attention_plan_workspace_size(&ap, &bytes),
         THDCP_ERROR_INVALID_ARGUMENT, "thdcp_attention_plan_workspace_size: params->softmax_scale=", NULL, NULL);
  check(plan == NULL && bytes == 3, "refused plans write nothing");
  ap = attention_params();
  ap.num_threads = THDCP_MAX_THREADS + 1;
  expect("num_threads past the limit", thdcp_attention_plan_create(&ap, NULL, 0, &plan),
         THDCP_ERROR_INVALID_ARGUMENT, "params->num_threads=4097", "THDCP_MAX_THREADS=4096", NULL);

  check(thdcp_communicator_create_in_process_group(1, &comm) == THDCP_SUCCESS, "communicator");
  cpp.softmax_scale = -1.0f;
  expect("CP softmax_scale -1", thdcp_cp_plan_create(comm, &cpp, NULL, 0, &cp_plan), THDCP_ERROR_INVALID_ARGUMENT,
         "thdcp_cp_plan_create: params->softmax_scale=-1", "must be finite and >= 0", NULL);
  cpp.softmax_scale = NAN;
  expect("CP softmax_scale NaN", thdcp_cp_plan_workspace_size(&cpp, &bytes), THDCP_ERROR_INVALID_ARGUMENT,
         "thdcp_cp_plan_workspace_size: params->softmax_scale=", "must be finite and >= 0", NULL);
  check(cp_plan == NULL, "a refused CP plan writes no handle");
  check(thdcp_communicator_destroy(comm) == THDCP_SUCCESS, "destroy");
}

static void group_sizes(void) {
  thdcp_communicator_t comms[2] = {NULL, NULL};
  expect("an in-process group of 2^30 ranks", thdcp_communicator_create_in_process_group(1 << 30, comms),
         THDCP_ERROR_INVALID_ARGUMENT, "thdcp_communicator_create_in_process_group: size=1073741824",
         "must be in [1, THDCP_MAX_GROUP_SIZE=1024]", NULL);
  expect("a shared-GPU group of 2^30 ranks", thdcp_communicator_create_shared_gpu_group(1 << 30, 0, comms),
         THDCP_ERROR_INVALID_ARGUMENT, "thdcp_communicator_create_shared_gpu_group: size=1073741824",
         "THDCP_MAX_GROUP_SIZE", NULL);
  expect("an in-process group of -1 ranks", thdcp_communicator_create_in_process_group(-1, comms),
         THDCP_ERROR_INVALID_ARGUMENT, "size=-1", NULL, NULL);
  check(comms[0] == NULL && comms[1] == NULL, "refused groups write no handle");
}

int main(void) {
  handles_destroyed_twice_and_used_after_destroy();
  zeroed_and_foreign_handles();
  struct_sizes();
  sizes_that_overflow();
  plan_fields();
  group_sizes();
  if (failures == 0) printf("C misuse test (libthdcp %s): PASS\n", thdcp_version_string());
  return failures == 0 ? 0 : 1;
}
