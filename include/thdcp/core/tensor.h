// Views of THD tensors ([tokens, heads, head_dim], head_dim contiguous, with a row stride and
// a head stride) and an owning host tensor for tools and tests.
//
// Strides are in elements, >= 0, and 0 means contiguous: row_stride = heads * head_dim,
// head_stride = head_dim. Any others are views too, on every backend (the CUDA one also
// wants them, and the data pointer, 16-byte aligned). So a packed QKV buffer
// [T, Hq + 2*Hkv, D] is used with no copy through three views that share
// row_stride = (Hq + 2*Hkv) * D and head_stride = D:
//   q: data = qkv,                 heads = Hq
//   k: data = qkv + Hq * D,        heads = Hkv
//   v: data = qkv + (Hq + Hkv) * D, heads = Hkv
// and head-major memory [H, T, D] (heads before rows, as transformers' KV cache holds K/V)
// is the view row_stride = D, head_stride = T * D (or S * D for a cache of S >= T rows).
// Inputs may overlap; outputs may not (thdcp/core/overlap.h).
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "thdcp/core/dtype.h"

namespace thdcp {

// A view of a THD tensor's memory: `Data` is void* (ThdTensor, writable) or const void*
// (ConstThdTensor). A ThdTensor converts to a ConstThdTensor, not the other way.
template <typename Data>
struct BasicThdTensor {
  Data data = nullptr;
  DType dtype = DType::kBFloat16;
  int64_t tokens = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t row_stride = 0;   // elements from one token to the next; 0: heads * head_dim
  int64_t head_stride = 0;  // elements from one head to the next; 0: head_dim

  BasicThdTensor() = default;
  BasicThdTensor(Data data_, DType dtype_, int64_t tokens_, int64_t heads_, int64_t head_dim_,
                 int64_t row_stride_ = 0, int64_t head_stride_ = 0)
      : data(data_), dtype(dtype_), tokens(tokens_), heads(heads_), head_dim(head_dim_), row_stride(row_stride_),
        head_stride(head_stride_) {}
  template <typename Other, typename = std::enable_if_t<!std::is_same_v<Other, Data> &&
                                                        std::is_convertible_v<Other, Data>>>
  BasicThdTensor(const BasicThdTensor<Other>& t)  // NOLINT(google-explicit-constructor): views convert freely
      : BasicThdTensor(t.data, t.dtype, t.tokens, t.heads, t.head_dim, t.row_stride, t.head_stride) {}

  int64_t numel() const { return tokens * heads * head_dim; }
  // Bytes of one row's heads * head_dim elements (the row of a contiguous tensor).
  size_t row_bytes() const { return static_cast<size_t>(heads * head_dim) * dtype_size(dtype); }
  int64_t row_step() const { return row_stride != 0 ? row_stride : heads * head_dim; }
  int64_t head_step() const { return head_stride != 0 ? head_stride : head_dim; }
  bool contiguous() const { return row_step() == heads * head_dim && head_step() == head_dim; }
  // Elements from data to element (row, head, d).
  int64_t offset(int64_t row, int64_t head, int64_t d) const { return row * row_step() + head * head_step() + d; }
};

using ThdTensor = BasicThdTensor<void*>;
using ConstThdTensor = BasicThdTensor<const void*>;

// What one tensor of a call must be: its sizes, named as the caller's API names them (for
// the message), e.g. {rows, "max_tokens", heads, "kv_heads", head_dim}.
struct ThdShape {
  int64_t rows = 0;
  const char* rows_name = "rows";
  int64_t heads = 0;
  const char* heads_name = "heads";
  int64_t head_dim = 0;
  const char* head_dim_name = "head_dim";  // "v_head_dim" for v, out, dout, dv
};

// The one shape check of the front doors and backends: throws thdcp::Error unless `t` is
// `expected` and has a data pointer when it has elements, naming the tensor and both shapes:
//   "k is [32, 4, 16] but must be [max_tokens=32, kv_heads=2, head_dim=16]"
void check_thd_shape(const char* name, const ConstThdTensor& t, const ThdShape& expected);

// Throws thdcp::Error unless `actual` is `expected` (or fp32, when `or_fp32`: gradients and
// partial sums): "dq has dtype fp16 but must be bf16 or fp32".
void check_thd_dtype(const char* name, DType actual, DType expected, bool or_fp32 = false);

// tokens * heads * head_dim * dtype_size(dtype) in bytes, checked: every dimension >= 0 and
// no overflow of int64 (a wrapped product would allocate the wrong size). Throws
// thdcp::Error naming the shape.
size_t checked_tensor_bytes(int64_t tokens, int64_t heads, int64_t head_dim, DType dtype);

// An owning, zero-initialised host THD tensor.
class HostTensor {
 public:
  HostTensor() = default;
  // Throws thdcp::Error when a dimension is negative or the size overflows.
  HostTensor(DType dtype, int64_t tokens, int64_t heads, int64_t head_dim)
      : dtype_(dtype), tokens_(tokens), heads_(heads), head_dim_(head_dim),
        bytes_(checked_tensor_bytes(tokens, heads, head_dim, dtype)) {}

  ThdTensor view() { return ThdTensor{bytes_.data(), dtype_, tokens_, heads_, head_dim_}; }
  ConstThdTensor view() const { return ConstThdTensor(bytes_.data(), dtype_, tokens_, heads_, head_dim_); }

  float get(int64_t i) const { return load_as_float(bytes_.data(), dtype_, static_cast<size_t>(i)); }
  void set(int64_t i, float value) { store_from_float(bytes_.data(), dtype_, static_cast<size_t>(i), value); }

  DType dtype() const { return dtype_; }
  int64_t tokens() const { return tokens_; }
  int64_t heads() const { return heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t numel() const { return tokens_ * heads_ * head_dim_; }
  size_t row_bytes() const { return static_cast<size_t>(heads_ * head_dim_) * dtype_size(dtype_); }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }

 private:
  DType dtype_ = DType::kFloat32;
  int64_t tokens_ = 0;
  int64_t heads_ = 0;
  int64_t head_dim_ = 0;
  std::vector<unsigned char> bytes_;
};

}  // namespace thdcp
