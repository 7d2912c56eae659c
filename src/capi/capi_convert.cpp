#include "capi_convert.h"

#include <cmath>
#include <cstddef>
#include <limits>

#include "thdcp/cpu/attention.h"
#if defined(THDCP_HAVE_CUDA)
#include "thdcp/cuda/attention.h"
#endif

namespace thdcp::capi {

// The first version of each params struct ends where thdcp.h says, on an 8-byte boundary,
// and every struct is a whole number of 8-byte words (so an older struct's padding never
// covers a newer field).
static_assert(offsetof(thdcp_attention_params, deterministic) == THDCP_ATTENTION_PARAMS_MIN_SIZE);
static_assert(offsetof(thdcp_cp_params, num_threads) == THDCP_CP_PARAMS_MIN_SIZE);
static_assert(offsetof(thdcp_capacity_plan_params, max_memory) == THDCP_CAPACITY_PLAN_PARAMS_MIN_SIZE);
static_assert(sizeof(thdcp_capacity_plan_result) == THDCP_CAPACITY_PLAN_RESULT_MIN_SIZE);
static_assert(sizeof(thdcp_graph_bank_params) == THDCP_GRAPH_BANK_PARAMS_MIN_SIZE);
static_assert(sizeof(thdcp_attention_extras) == THDCP_ATTENTION_EXTRAS_MIN_SIZE);
// The second version of thdcp_attention_params (v_head_dim) starts on the first one's 8-byte end.
static_assert(offsetof(thdcp_attention_params, v_head_dim) == 80 && sizeof(thdcp_attention_params) == 88);
static_assert(offsetof(thdcp_cp_params, v_head_dim) == 88);
// The third version of thdcp_cp_params (cp_layout, cp_comm) starts on the second one's end.
static_assert(offsetof(thdcp_cp_params, cp_layout) == 96 && offsetof(thdcp_cp_params, cp_comm) == 100);
// The fourth (kv_gather, a2a_size) on the third one's end; the fifth (reduce_dtype, head_slices)
// on the fourth's.
static_assert(offsetof(thdcp_cp_params, kv_gather) == 104 && offsetof(thdcp_cp_params, reduce_dtype) == 112 &&
              sizeof(thdcp_cp_params) == 120);
static_assert(sizeof(thdcp_attention_params) % 8 == 0 && sizeof(thdcp_cp_params) % 8 == 0 &&
              sizeof(thdcp_capacity_plan_params) % 8 == 0 && sizeof(thdcp_static_batch_info) % 8 == 0);

void check_struct_size(size_t size, size_t min_size, const char* argument, const char* type, const char* hint) {
  THDCP_CAPI_REQUIRE(size <= THDCP_MAX_STRUCT_SIZE,
                     argument << "->struct_size=" << size << " is larger than THDCP_MAX_STRUCT_SIZE="
                              << THDCP_MAX_STRUCT_SIZE << ", which no version of " << type
                              << " reaches: the field is not set (uninitialised memory?); set struct_size = sizeof("
                              << type << "), " << hint);
  THDCP_CAPI_REQUIRE(size >= min_size && size % 8 == 0,
                     argument << "->struct_size=" << size << " is not the size of a " << type
                              << " (the first version has " << min_size << " bytes, every version a multiple of 8)"
                              << ": set struct_size = sizeof(" << type << "), " << hint);
}

void check_softmax_scale(float softmax_scale, const char* params) {
  THDCP_CAPI_REQUIRE(std::isfinite(softmax_scale) && softmax_scale >= 0.0f,
                     params << "->softmax_scale=" << softmax_scale
                            << " must be finite and >= 0: the scale of q.k, or 0 for 1/sqrt(head_dim)");
}

void check_num_threads(int32_t num_threads, const char* params) {
  THDCP_CAPI_REQUIRE(num_threads >= 0 && num_threads <= THDCP_MAX_THREADS,
                     params << "->num_threads=" << num_threads << " must be in [0, THDCP_MAX_THREADS="
                            << THDCP_MAX_THREADS << "] (0: every hardware thread)");
}

void check_plan_elements(int64_t max_tokens, int64_t q_heads, int64_t head_dim, const char* params,
                         const char* head_dim_name) {
  int64_t rows_heads = 0, elements = 0;
  const bool fits = multiply(max_tokens, q_heads, &rows_heads) && multiply(rows_heads, head_dim, &elements) &&
                    elements < kMaxPlanElements;
  THDCP_CAPI_REQUIRE(fits, params << "->max_tokens=" << max_tokens << " * q_heads=" << q_heads << " * "
                                  << head_dim_name << "=" << head_dim
                                  << " elements of a tensor are 2^53 or more (or overflow 64 bits): no plan's tensors "
                                     "are that large; lower max_tokens or q_heads");
}

int64_t checked_padded_rows(const std::vector<int64_t>& lengths, int cp, const char* argument) {
  THDCP_CAPI_REQUIRE(cp >= 1, "cp=" << cp << " must be >= 1");
  const int64_t align = 2 * static_cast<int64_t>(cp);
  int64_t rows = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    // The layout and planner code pads with (length + align - 1) / align * align: a length
    // within align of 2^63 would overflow there even where the padded length fits.
    int64_t headroom = 0;
    THDCP_CAPI_REQUIRE(add(lengths[i], align, &headroom),
                       argument << "[" << i << "]=" << lengths[i] << " is within 2*cp=" << align
                                << " of 2^63-1: no padded length that large can be computed; pass real lengths");
    const int64_t chunks = lengths[i] / align + (lengths[i] % align != 0 ? 1 : 0);
    int64_t padded = 0;
    THDCP_CAPI_REQUIRE(multiply(chunks, align, &padded) && add(rows, padded, &rows),
                       argument << ": the documents padded to multiples of 2*cp=" << align
                                << " add up to more than 2^63-1 rows at " << argument << "[" << i
                                << "]=" << lengths[i] << ": pass the lengths of one batch");
  }
  return rows;
}

const char* dtype_c_name(int dtype) {
  switch (dtype) {
    case THDCP_DTYPE_DEFAULT: return "THDCP_DTYPE_DEFAULT";
    case THDCP_DTYPE_BF16: return "THDCP_DTYPE_BF16";
    case THDCP_DTYPE_FP16: return "THDCP_DTYPE_FP16";
    case THDCP_DTYPE_FP32: return "THDCP_DTYPE_FP32";
  }
  return "an unknown dtype";
}

DType storage_dtype(int dtype, const char* argument) {
  switch (dtype) {
    case THDCP_DTYPE_BF16: return DType::kBFloat16;
    case THDCP_DTYPE_FP16: return DType::kFloat16;
    case THDCP_DTYPE_FP32: return DType::kFloat32;
  }
  THDCP_CAPI_REQUIRE(false, argument << "=" << dtype << " (" << dtype_c_name(dtype)
                                     << ") is not a storage dtype: use THDCP_DTYPE_BF16 (1), THDCP_DTYPE_FP16 (2) "
                                        "or THDCP_DTYPE_FP32 (3)");
  return DType::kFloat32;
}

DType gradient_dtype(int given, DType dtype, const char* argument) {
  if (given == THDCP_DTYPE_DEFAULT) return dtype;
  const DType d = storage_dtype(given, argument);
  THDCP_CAPI_REQUIRE(d == dtype || d == DType::kFloat32,
                     argument << "=" << dtype_c_name(given) << " is neither the plan's dtype (" << dtype_name(dtype)
                              << ") nor fp32: gradients are stored in the plan's dtype or in fp32");
  return d;
}

thdcp_backend_t backend_of(int backend, const char* argument) {
  THDCP_CAPI_REQUIRE(backend == THDCP_BACKEND_CPU || backend == THDCP_BACKEND_CUDA,
                     argument << "=" << backend
                              << " is not a thdcp_backend_t: use THDCP_BACKEND_CPU (0) or THDCP_BACKEND_CUDA (1)");
  return backend == THDCP_BACKEND_CPU ? THDCP_BACKEND_CPU : THDCP_BACKEND_CUDA;
}

const char* cp_layout_c_name(CpLayout layout) {
  return layout == CpLayout::kDualChunk ? "THDCP_CP_LAYOUT_DUAL_CHUNK" : "THDCP_CP_LAYOUT_CONTIGUOUS";
}

CpLayout cp_layout_of(int cp_layout, const char* argument) {
  THDCP_CAPI_REQUIRE(cp_layout == THDCP_CP_LAYOUT_DUAL_CHUNK || cp_layout == THDCP_CP_LAYOUT_CONTIGUOUS,
                     argument << "=" << cp_layout
                              << " is not a thdcp_cp_layout_t: use THDCP_CP_LAYOUT_DUAL_CHUNK (0) or "
                                 "THDCP_CP_LAYOUT_CONTIGUOUS (1)");
  return cp_layout == THDCP_CP_LAYOUT_DUAL_CHUNK ? CpLayout::kDualChunk : CpLayout::kContiguous;
}

namespace {

template <typename View>
View view_of(const thdcp_tensor_t* tensor, const char* argument) {
  THDCP_CAPI_REQUIRE(tensor != nullptr, argument << " is NULL: pass a thdcp_tensor_t that describes it");
  const thdcp_tensor_t& t = *tensor;
  const DType dtype = storage_dtype(raw_enum(t.dtype), (std::string(argument) + "->dtype").c_str());
  THDCP_CAPI_REQUIRE(t.rows >= 0 && t.heads >= 0 && t.head_dim >= 0,
                     argument << " is [" << t.rows << ", " << t.heads << ", " << t.head_dim
                              << "]: rows, heads and head_dim must be >= 0");
  THDCP_CAPI_REQUIRE(t.row_stride >= 0 && t.head_stride >= 0,
                     argument << " has row_stride=" << t.row_stride << " and head_stride=" << t.head_stride
                              << ": strides are elements >= 0 (0: contiguous)");
  const bool empty = t.rows == 0 || t.heads == 0 || t.head_dim == 0;
  THDCP_CAPI_REQUIRE(t.data != nullptr || empty, argument << "->data is NULL for a tensor of [" << t.rows << ", "
                                                          << t.heads << ", " << t.head_dim
                                                          << "] elements: pass its memory");
  if (!empty) {
    // The byte offset of the last element: (rows-1)*row_step + (heads-1)*head_step + head_dim-1
    // elements, every product and sum checked (the library indexes with these).
    int64_t row_step = t.row_stride, head_step = t.head_stride != 0 ? t.head_stride : t.head_dim;
    int64_t last_row = 0, last_head = 0, last = 0, bytes = 0;
    const bool fits = (row_step != 0 || multiply(t.heads, t.head_dim, &row_step)) &&
                      multiply(t.rows - 1, row_step, &last_row) && multiply(t.heads - 1, head_step, &last_head) &&
                      add(last_row, last_head, &last) && add(last, t.head_dim, &last) &&
                      multiply(last, static_cast<int64_t>(dtype_size(dtype)), &bytes);
    THDCP_CAPI_REQUIRE(fits, argument << " is [" << t.rows << ", " << t.heads << ", " << t.head_dim
                                      << "] with row_stride=" << t.row_stride << " and head_stride=" << t.head_stride
                                      << ": the byte offset of its last element overflows 64 bits; pass the "
                                         "strides in elements (0: contiguous)");
  }
  return View(t.data, dtype, t.rows, t.heads, t.head_dim, t.row_stride, t.head_stride);
}

}  // namespace

ConstThdTensor const_view(const thdcp_tensor_t* tensor, const char* argument) {
  return view_of<ConstThdTensor>(tensor, argument);
}

ThdTensor view(const thdcp_tensor_t* tensor, const char* argument) { return view_of<ThdTensor>(tensor, argument); }

ForwardTensors forward_tensors(const thdcp_tensor_t* q, const thdcp_tensor_t* k, const thdcp_tensor_t* v,
                               const thdcp_tensor_t* out, float* lse, float* max_logit) {
  return ForwardTensors{const_view(q, "q"), const_view(k, "k"), const_view(v, "v"), view(out, "out"), lse, max_logit};
}

BackwardTensors backward_tensors(const thdcp_tensor_t* q, const thdcp_tensor_t* k, const thdcp_tensor_t* v,
                                 const thdcp_tensor_t* out, const thdcp_tensor_t* dout, const float* lse,
                                 const thdcp_tensor_t* dq, const thdcp_tensor_t* dk, const thdcp_tensor_t* dv) {
  return BackwardTensors{const_view(q, "q"),       const_view(k, "k"),       const_view(v, "v"),
                         const_view(out, "out"),   const_view(dout, "dout"), lse,
                         view(dq, "dq"),           view(dk, "dk"),           view(dv, "dv")};
}

thdcp_attention_extras extras_of(const thdcp_attention_extras* given, int64_t q_heads, bool backward) {
  const thdcp_attention_extras none = THDCP_ATTENTION_EXTRAS_INIT;
  if (given == nullptr) return none;
  const thdcp_attention_extras e = read_params(given, THDCP_ATTENTION_EXTRAS_MIN_SIZE, none, "extras",
                                               "thdcp_attention_extras", "THDCP_ATTENTION_EXTRAS_INIT");
  THDCP_CAPI_REQUIRE(backward || e.dsinks == nullptr,
                     "extras->dsinks=" << static_cast<const void*>(e.dsinks)
                                       << " is set in a forward: it receives the backward's gradient of the sinks; "
                                          "pass NULL here and dsinks to the backward");
  THDCP_CAPI_REQUIRE(e.dsinks == nullptr || e.sinks != nullptr,
                     "extras->dsinks=" << static_cast<const void*>(e.dsinks)
                                       << " is set but extras->sinks is NULL: pass the forward's sinks to get their "
                                          "gradient, or dsinks=NULL");
  if (e.dsinks != nullptr) {
    // Addresses compared as integers: the two arrays need not be parts of one object.
    const auto sinks = reinterpret_cast<uintptr_t>(e.sinks), dsinks = reinterpret_cast<uintptr_t>(e.dsinks);
    const auto bytes = static_cast<uintptr_t>(q_heads) * sizeof(float);
    THDCP_CAPI_REQUIRE(dsinks + bytes <= sinks || sinks + bytes <= dsinks,
                       "extras->dsinks=" << static_cast<const void*>(e.dsinks) << " overlaps extras->sinks="
                                         << static_cast<const void*>(e.sinks) << " (q_heads=" << q_heads
                                         << " floats each): pass separate arrays");
  }
  return e;
}

LayoutView layout_view(const thdcp_layout_t* layout, const char* argument) {
  THDCP_CAPI_REQUIRE(layout != nullptr,
                     argument << " is NULL: pass a thdcp_layout_t with cu_seqlens, cu_seqlens_padded and num_seqs");
  THDCP_CAPI_REQUIRE(layout->cu_seqlens != nullptr, argument << "->cu_seqlens is NULL: pass num_seqs + 1 int32 offsets");
  THDCP_CAPI_REQUIRE(layout->cu_seqlens_padded != nullptr,
                     argument << "->cu_seqlens_padded is NULL: pass num_seqs + 1 int32 offsets (the same array as "
                                 "cu_seqlens when nothing is padded)");
  THDCP_CAPI_REQUIRE(layout->num_seqs >= 1, argument << "->num_seqs=" << layout->num_seqs
                                                     << " must be >= 1 (the arrays have num_seqs + 1 entries)");
  return LayoutView{layout->cu_seqlens, layout->cu_seqlens_padded, layout->num_seqs};
}

void check_heads(int64_t q_heads, int64_t kv_heads, int64_t head_dim, bool cuda_backend, int64_t v_head_dim) {
  HeadShape heads;
  heads.q_heads = q_heads;
  heads.kv_heads = kv_heads;
  heads.head_dim = head_dim;
  heads.v_head_dim = v_head_dim;
  check_head_shape(heads, "params->");
  if (cuda_backend) {
#if defined(THDCP_HAVE_CUDA)
    THDCP_CAPI_REQUIRE(cuda::cuda_supports_head_dims(head_dim, v_head_dim),
                       "params->head_dim=" << head_dim << ", params->v_head_dim=" << v_head_dim
                                           << " is not supported by the CUDA backend: it takes "
                                           << cuda::cuda_head_dims_text()
                                           << " (v_head_dim 0: D_v = head_dim; the CPU backend takes any multiple "
                                              "of 8 in [8, 256] for each)");
#endif
    return;
  }
  THDCP_CAPI_REQUIRE(cpu_supports_head_dim(head_dim),
                     "params->head_dim=" << head_dim
                                         << " is not supported by the CPU backend: use a multiple of 8 in [8, 256]");
  THDCP_CAPI_REQUIRE(v_head_dim == 0 || cpu_supports_head_dim(v_head_dim),
                     "params->v_head_dim=" << v_head_dim
                                           << " is not supported by the CPU backend: use 0 (v_head_dim = head_dim) "
                                              "or a multiple of 8 in [8, 256]");
}

Mask mask_of(int32_t window_left, int32_t window_right, const char* params) {
  THDCP_CAPI_REQUIRE(window_left >= -1 && window_right >= -1,
                     params << "->window_left=" << window_left << ", window_right=" << window_right
                            << ": each window is >= 0, or -1 for unbounded (causal is (-1, 0))");
  return Mask{window_left, window_right};
}

std::vector<int64_t> lengths_of(const int64_t* lengths, int64_t count, const char* argument) {
  THDCP_CAPI_REQUIRE(count >= 0, "num_documents=" << count << " must be >= 0");
  THDCP_CAPI_REQUIRE(lengths != nullptr || count == 0,
                     argument << " is NULL but num_documents=" << count << ": pass that many lengths");
  THDCP_CAPI_REQUIRE(count <= std::numeric_limits<int32_t>::max(),
                     "num_documents=" << count << " is more than a layout's int32 offsets can index");
  for (int64_t i = 0; i < count; ++i) {
    THDCP_CAPI_REQUIRE(lengths[i] >= 0, argument << "[" << i << "]=" << lengths[i] << " is negative: a document has "
                                                 << ">= 0 tokens");
  }
  return std::vector<int64_t>(lengths, lengths + count);
}

}  // namespace thdcp::capi
