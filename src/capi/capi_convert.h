// From the C ABI's plain structs to the C++ API's types, checking every field on the way:
// dtypes, tensors, layouts, masks, and the versioned params structs (struct_size).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "capi_status.h"
#include "thdcp/plan/attention_shape.h"
#include "thdcp/core/tensor.h"
#include "thdcp/plan/contiguous.h"
#include "thdcp/plan/layout.h"
#include "thdcp/plan/mask.h"
#include "thdcp/thdcp.h"

namespace thdcp::capi {

// The value of an enum field or argument a caller passed, as an int. A C caller may pass
// any int where thdcp.h says enum; C++ must not load an enum object holding a value outside
// its enumerators' range, so the library reads the bytes.
template <typename Enum>
int raw_enum(const Enum& value) {
  static_assert(sizeof(Enum) == sizeof(int), "the enums of thdcp.h are int-sized");
  int raw = 0;
  std::memcpy(&raw, &value, sizeof(raw));
  return raw;
}

// a * b and a + b into *result, false when it does not fit int64: the C ABI's size
// products and sums are computed with these before they are used.
inline bool multiply(int64_t a, int64_t b, int64_t* result) { return !__builtin_mul_overflow(a, b, result); }
inline bool add(int64_t a, int64_t b, int64_t* result) { return !__builtin_add_overflow(a, b, result); }

// The options a plan stores, checked when it is made so that no run refuses them later:
// softmax_scale finite and >= 0 (0: 1/sqrt(head_dim)); num_threads in [0, THDCP_MAX_THREADS]
// (0: every hardware thread), which the CPU backend sizes per-thread scratch by.
void check_softmax_scale(float softmax_scale, const char* params);
void check_num_threads(int32_t num_threads, const char* params);

// A plan's largest tensor has max_tokens * q_heads * head_dim elements (q_heads >= kv_heads);
// below this bound every size the plan computes from its shape (fp32 copies, lse, the
// workspace's sums of them) fits 64 bits. `params` names the struct in the message.
constexpr int64_t kMaxPlanElements = int64_t{1} << 53;
void check_plan_elements(int64_t max_tokens, int64_t q_heads, int64_t head_dim, const char* params,
                         const char* head_dim_name = "head_dim");

// The rows of documents of `lengths` each padded to a multiple of 2*cp: cp >= 1, every
// length + 2*cp and the sum (every partial sum and padded length with it) fit int64, else
// THDCP_ERROR_INVALID_ARGUMENT naming `argument`. Called before the library's layout and
// planning arithmetic, which then cannot overflow.
int64_t checked_padded_rows(const std::vector<int64_t>& lengths, int cp, const char* argument);

// "THDCP_DTYPE_BF16", ...; "an unknown dtype" for other values.
const char* dtype_c_name(int dtype);

// The storage dtype of a tensor or a plan (a thdcp_dtype_t read by raw_enum). `argument`
// names it in the message ("q->dtype", "params->dtype"); THDCP_DTYPE_DEFAULT and unknown
// values are refused.
DType storage_dtype(int dtype, const char* argument);

// A gradient dtype of a plan: THDCP_DTYPE_DEFAULT is `dtype`; else `dtype` or fp32.
DType gradient_dtype(int given, DType dtype, const char* argument);

// The backend field of a params struct: CPU or CUDA, else refused.
thdcp_backend_t backend_of(int backend, const char* argument);

// A CP layout (a thdcp_cp_layout_t read by raw_enum): dual chunk or contiguous, else
// refused naming `argument`.
CpLayout cp_layout_of(int cp_layout, const char* argument);
// "THDCP_CP_LAYOUT_DUAL_CHUNK" or "THDCP_CP_LAYOUT_CONTIGUOUS".
const char* cp_layout_c_name(CpLayout layout);

// The C descriptor as a view; checks that it is not NULL, its dtype, that its dimensions
// and strides are >= 0, that data is not NULL for a non-empty tensor, and that the byte
// offset of its last element fits (a stride that overflows it is refused, naming it).
ConstThdTensor const_view(const thdcp_tensor_t* tensor, const char* argument);
ThdTensor view(const thdcp_tensor_t* tensor, const char* argument);

// The tensors of a call from the C ABI's descriptors (each as const_view / view make it).
ForwardTensors forward_tensors(const thdcp_tensor_t* q, const thdcp_tensor_t* k, const thdcp_tensor_t* v,
                               const thdcp_tensor_t* out, float* lse, float* max_logit);
BackwardTensors backward_tensors(const thdcp_tensor_t* q, const thdcp_tensor_t* k, const thdcp_tensor_t* v,
                                 const thdcp_tensor_t* out, const thdcp_tensor_t* dout, const float* lse,
                                 const thdcp_tensor_t* dq, const thdcp_tensor_t* dk, const thdcp_tensor_t* dv);


// The optional tensors of a run (NULL: none, all fields NULL), read as a versioned struct and
// checked: dsinks only in a backward and only with sinks, the two arrays of q_heads floats
// apart. Where they point is the backend's to check (host or device memory).
thdcp_attention_extras extras_of(const thdcp_attention_extras* extras, int64_t q_heads, bool backward);

// The layout as a view: not NULL, both arrays given, num_seqs >= 1. Its values are checked
// by the callers (validate_layout on the host; the device's are the caller's contract).
LayoutView layout_view(const thdcp_layout_t* layout, const char* argument);

// The mask of two window fields (each >= -1).
Mask mask_of(int32_t window_left, int32_t window_right, const char* params);

// params->q_heads, kv_heads, head_dim and v_head_dim (0: head_dim) of a plan: GQA/MQA counts,
// and head dims the backend supports (the CPU: each a multiple of 8 in [8, 256]; CUDA: the
// head dim here, the pair when its plan is made).
void check_heads(int64_t q_heads, int64_t kv_heads, int64_t head_dim, bool cuda_backend, int64_t v_head_dim = 0);

// A host array of `count` document lengths (count >= 0; NULL only when count is 0).
std::vector<int64_t> lengths_of(const int64_t* lengths, int64_t count, const char* argument);

// The struct_size of a versioned struct: a multiple of 8 from min_size (the first version)
// to THDCP_MAX_STRUCT_SIZE, checked before any byte past the struct_size field is touched, so
// that a garbage value is refused instead of read up to. `hint` says how to set it.
void check_struct_size(size_t size, size_t min_size, const char* argument, const char* type, const char* hint);

// Reads a versioned params struct the caller passed: its struct_size checked; fields past
// struct_size take `defaults`; bytes past sizeof(T), up to struct_size (the caller's), must
// be 0 (fields of a newer thdcp.h this library does not know). Nothing past struct_size is
// read.
template <typename T>
T read_params(const T* given, size_t min_size, const T& defaults, const char* argument, const char* type,
              const char* init) {
  THDCP_CAPI_REQUIRE(given != nullptr, argument << " is NULL: pass a " << type << " filled by " << init);
  const size_t size = given->struct_size;
  check_struct_size(size, min_size, argument, type, (std::string("as ") + init + " does").c_str());
  if (size > sizeof(T)) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(given);
    for (size_t i = sizeof(T); i < size; ++i) {
      THDCP_CAPI_REQUIRE(bytes[i] == 0,
                         argument << "->struct_size=" << size << " is larger than the " << sizeof(T) << " bytes of "
                                  << type << " this libthdcp (" << thdcp_version_string()
                                  << ") knows, and byte " << i
                                  << " past them is not 0: a field of a newer thdcp.h is set that this library "
                                     "cannot honour; link the libthdcp of that thdcp.h, or leave the field 0");
    }
  }
  T out = defaults;
  std::memcpy(&out, given, std::min(size, sizeof(T)));
  out.struct_size = sizeof(T);
  return out;
}

// Writes a versioned output struct: the fields that fit the caller's struct_size.
template <typename T>
void write_result(T* out, const T& value, size_t min_size, const char* argument, const char* type) {
  THDCP_CAPI_REQUIRE(out != nullptr, argument << " is NULL: pass a " << type << " with struct_size = sizeof(" << type
                                              << ")");
  const size_t size = out->struct_size;
  check_struct_size(size, min_size, argument, type, "before the call");
  const size_t head = sizeof(size_t);
  std::memcpy(reinterpret_cast<unsigned char*>(out) + head, reinterpret_cast<const unsigned char*>(&value) + head,
              std::min(size, sizeof(T)) - head);
}

}  // namespace thdcp::capi
