/* thdcp.h is C: this translation unit is compiled as C99 (-pedantic-errors) and calls the
 * library through it. One sequence of one token in a batch of two rows (the second is
 * padding): softmax over one key is 1, so out equals v exactly, lse is the scaled q.k, and
 * the padding row gets out = 0 and lse = -inf. Exits 0 when every check holds. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "thdcp/thdcp.h"

#define HEAD_DIM 8

static int failures = 0;

static void check(int ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "FAILED: %s (last error: %s)\n", what, thdcp_last_error());
    ++failures;
  }
}

static thdcp_tensor_t tensor(float* data) {
  thdcp_tensor_t t;
  memset(&t, 0, sizeof(t));
  t.data = data;
  t.rows = 2;
  t.heads = 1;
  t.head_dim = HEAD_DIM;
  t.dtype = THDCP_DTYPE_FP32;
  return t;
}

/* The CP layouts from C: documents of 3 and 2 tokens packed with no padding but the last's
 * (6 rows at cp 2); rank 1 of the contiguous layout holds global rows 3, 4, 5, and a CP
 * params struct starts at the dual-chunk, all-gather defaults. */
static void cp_layouts(void) {
  const int64_t lengths[2] = {3, 2};
  int32_t cu_seqlens[3], cu_seqlens_padded[3], rows[3] = {-1, -1, -1};
  thdcp_layout_t layout;
  const thdcp_cp_params params = THDCP_CP_PARAMS_INIT;
  const thdcp_cp_layout_t contiguous = THDCP_CP_LAYOUT_CONTIGUOUS;
  const thdcp_cp_comm_t all_gather = THDCP_CP_COMM_ALL_GATHER;

  check(params.cp_layout == THDCP_CP_LAYOUT_DUAL_CHUNK && params.cp_comm == all_gather, "CP params defaults");
  check(thdcp_make_contiguous_layout(lengths, 2, 2, cu_seqlens, cu_seqlens_padded) == THDCP_SUCCESS,
        "contiguous layout");
  check(cu_seqlens[2] == 5 && cu_seqlens_padded[1] == 3 && cu_seqlens_padded[2] == 6, "only the last is padded");
  layout.cu_seqlens = cu_seqlens;
  layout.cu_seqlens_padded = cu_seqlens_padded;
  layout.num_seqs = 2;
  check(thdcp_cp_local_rows_ex(&layout, 2, 1, rows, 3, contiguous) == THDCP_SUCCESS, "contiguous rows");
  check(rows[0] == 3 && rows[1] == 4 && rows[2] == 5, "rank 1 holds the second half");
  check(thdcp_cp_local_rows(&layout, 2, 1, rows, 3) == THDCP_ERROR_INVALID_ARGUMENT,
        "the dual-chunk split refuses unpadded documents");
}

int main(void) {
  /* Row 0 is the token; row 1 is padding, filled with values that must never be read. */
  float q[2 * HEAD_DIM] = {1, 2, 3, 4, 5, 6, 7, 8, 99, 99, 99, 99, 99, 99, 99, 99};
  float k[2 * HEAD_DIM] = {0.5f, 0.25f, 0, 0, 0, 0, 0, 1, 99, 99, 99, 99, 99, 99, 99, 99};
  float v[2 * HEAD_DIM] = {9, 8, 7, 6, 5, 4, 3, 2, 99, 99, 99, 99, 99, 99, 99, 99};
  float out[2 * HEAD_DIM];
  float lse[2] = {0, 0};
  const int32_t cu_seqlens[2] = {0, 1};
  const int32_t cu_seqlens_padded[2] = {0, 2};
  const float scale = 0.5f;
  thdcp_attention_params params = THDCP_ATTENTION_PARAMS_INIT;
  thdcp_attention_plan_t plan = NULL;
  thdcp_layout_t layout;
  thdcp_tensor_t tq, tk, tv, tout;
  size_t workspace = 1;
  float qk = 0;
  const float sink = 5.0f;
  float share = 0;
  thdcp_attention_extras extras = THDCP_ATTENTION_EXTRAS_INIT;
  int i;

  check(thdcp_abi_version() == THDCP_ABI_VERSION, "thdcp_abi_version() == THDCP_ABI_VERSION");
  check(strlen(thdcp_version_string()) > 0, "a version string");
  check(thdcp_attention_plan_create(NULL, NULL, 0, &plan) == THDCP_ERROR_INVALID_ARGUMENT, "NULL params refused");
  check(strstr(thdcp_last_error(), "params is NULL") != NULL, "the message names params");
  check(plan == NULL, "a refused create writes no handle");
  check(strcmp(thdcp_status_name(THDCP_ERROR_UNSUPPORTED), "THDCP_ERROR_UNSUPPORTED") == 0, "status names");

  thdcp_attention_params_init(&params);
  params.dtype = THDCP_DTYPE_FP32;
  params.max_tokens = 2;
  params.max_seqs = 1;
  params.q_heads = 1;
  params.kv_heads = 1;
  params.head_dim = HEAD_DIM;
  params.window_left = -1;
  params.window_right = 0;
  params.softmax_scale = scale;
  check(thdcp_attention_plan_workspace_size(&params, &workspace) == THDCP_SUCCESS && workspace == 0,
        "no workspace on the CPU backend");
  check(thdcp_attention_plan_create(&params, NULL, 0, &plan) == THDCP_SUCCESS, "plan create");

  layout.cu_seqlens = cu_seqlens;
  layout.cu_seqlens_padded = cu_seqlens_padded;
  layout.num_seqs = 1;
  tq = tensor(q);
  tk = tensor(k);
  tv = tensor(v);
  tout = tensor(out);
  for (i = 0; i < 2 * HEAD_DIM; ++i) out[i] = -1.0f;
  check(thdcp_attention_forward(plan, &layout, &tq, &tk, &tv, &tout, lse, NULL, NULL) == THDCP_SUCCESS, "forward");
  for (i = 0; i < HEAD_DIM; ++i) qk += q[i] * k[i];
  for (i = 0; i < HEAD_DIM; ++i) check(out[i] == v[i], "out = v for a single key");
  for (i = HEAD_DIM; i < 2 * HEAD_DIM; ++i) check(out[i] == 0.0f, "the padding row of out is 0");
  check(fabsf(lse[0] - scale * qk) <= 1e-6f * fabsf(scale * qk), "lse = scale * q.k");
  check(isinf(lse[1]) && lse[1] < 0, "lse of the padding row is -inf");

  /* An attention sink of logit `sink`: the key keeps e^s / (e^s + e^sink) of the weight. */
  extras.sinks = &sink;
  check(thdcp_attention_forward_ex(plan, &layout, &tq, &tk, &tv, &tout, lse, NULL, &extras, NULL) == THDCP_SUCCESS,
        "forward with a sink");
  share = 1.0f / (1.0f + expf(sink - scale * qk));
  for (i = 0; i < HEAD_DIM; ++i) check(fabsf(out[i] - share * v[i]) <= 1e-5f * fabsf(v[i]), "out = share * v");
  check(fabsf(lse[0] - logf(expf(scale * qk) + expf(sink))) <= 1e-5f * fabsf(lse[0]), "lse includes the sink");
  check(thdcp_attention_plan_destroy(plan) == THDCP_SUCCESS, "plan destroy");
  cp_layouts();
  if (failures == 0) printf("C header test (libthdcp %s, ABI %d): PASS\n", thdcp_version_string(), thdcp_abi_version());
  return failures == 0 ? 0 : 1;
}
