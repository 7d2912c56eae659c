/* A hostile caller of the C ABI, compiled as C99 (-pedantic-errors): handles destroyed twice,
 * used after destroy, zeroed or foreign memory passed as handles. Every call must return its
 * status with a message naming the function, the argument and what to do, and nothing may
 * crash or read what the caller did not pass (the sanitizer job, tests/sanitize/run.sh, runs
 * this program under ASan and UBSan; a foreign handle points into a page that faults on any
 * access, so a read through it crashes even without them). Exits 0 when every check holds. */
#define _DEFAULT_SOURCE /* mmap with MAP_ANONYMOUS */

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

int main(void) {
  handles_destroyed_twice_and_used_after_destroy();
  zeroed_and_foreign_handles();
  if (failures == 0) printf("C misuse test (libthdcp %s): PASS\n", thdcp_version_string());
  return failures == 0 ? 0 : 1;
}
