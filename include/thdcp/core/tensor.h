// Views of THD tensors ([tokens, heads, head_dim], contiguous, row-major) and an owning
// host tensor for tools and tests.
#pragma once

#include <cstdint>
#include <vector>

#include "thdcp/core/dtype.h"

namespace thdcp {

struct ThdTensor {
  void* data = nullptr;
  DType dtype = DType::kBFloat16;
  int64_t tokens = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;

  int64_t numel() const { return tokens * heads * head_dim; }
  size_t row_bytes() const { return static_cast<size_t>(heads * head_dim) * dtype_size(dtype); }
};

struct ConstThdTensor {
  const void* data = nullptr;
  DType dtype = DType::kBFloat16;
  int64_t tokens = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;

  ConstThdTensor() = default;
  ConstThdTensor(const void* data_, DType dtype_, int64_t tokens_, int64_t heads_, int64_t head_dim_)
      : data(data_), dtype(dtype_), tokens(tokens_), heads(heads_), head_dim(head_dim_) {}
  ConstThdTensor(const ThdTensor& t)  // NOLINT(google-explicit-constructor): views convert freely
      : data(t.data), dtype(t.dtype), tokens(t.tokens), heads(t.heads), head_dim(t.head_dim) {}

  int64_t numel() const { return tokens * heads * head_dim; }
  size_t row_bytes() const { return static_cast<size_t>(heads * head_dim) * dtype_size(dtype); }
};

// An owning, zero-initialised host THD tensor.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, int64_t tokens, int64_t heads, int64_t head_dim)
      : dtype_(dtype), tokens_(tokens), heads_(heads), head_dim_(head_dim),
        bytes_(static_cast<size_t>(tokens * heads * head_dim) * dtype_size(dtype)) {}

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
