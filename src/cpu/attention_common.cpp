#include "attention_common.h"

#include <cstring>
#include <limits>

namespace thdcp {

bool cpu_supports_head_dim(int64_t head_dim) { return head_dim >= 8 && head_dim <= 256 && head_dim % 8 == 0; }

void check_cpu_head_dims(const HeadShape& heads) {
  THDCP_CHECK(cpu_supports_head_dim(heads.head_dim),
              "head_dim=" << heads.head_dim << " is not supported by the CPU backend: use a multiple of 8 in [8, 256]");
  THDCP_CHECK(cpu_supports_head_dim(heads.value_head_dim()),
              "v_head_dim=" << heads.value_head_dim()
                            << " is not supported by the CPU backend: use a multiple of 8 in [8, 256]");
}

namespace cpu::detail {

ThdShape q_shape(const SegmentTable& table, const ConstThdTensor& q) {
  return ThdShape{table.q_rows, "q_rows", q.heads, "q_heads", q.head_dim};
}

ThdShape out_shape(const SegmentTable& table, const ConstThdTensor& q, const ConstThdTensor& v) {
  return ThdShape{table.q_rows, "q_rows", q.heads, "q_heads", v.head_dim, "v_head_dim"};
}

ThdShape k_shape(const SegmentTable& table, const ConstThdTensor& q, const ConstThdTensor& k) {
  return ThdShape{table.k_rows, "k_rows", k.heads, "kv_heads", q.head_dim};
}

ThdShape v_shape(const SegmentTable& table, const ConstThdTensor& k, const ConstThdTensor& v) {
  return ThdShape{table.k_rows, "k_rows", k.heads, "kv_heads", v.head_dim, "v_head_dim"};
}

void check_tensor(const char* name, const ConstThdTensor& t, const ThdShape& shape, DType dtype, bool or_fp32) {
  check_thd_shape(name, t, shape);
  check_thd_dtype(name, t.dtype, dtype, or_fp32);
  check_thd_strides(name, t);
}

void zero_view(const ThdTensor& t) {
  const size_t element = dtype_size(t.dtype);
  if (t.contiguous()) {
    std::memset(t.data, 0, static_cast<size_t>(t.numel()) * element);
    return;
  }
  for (int64_t row = 0; row < t.tokens; ++row) {
    for (int64_t head = 0; head < t.heads; ++head) {
      std::memset(static_cast<unsigned char*>(t.data) + static_cast<size_t>(t.offset(row, head, 0)) * element, 0,
                  static_cast<size_t>(t.head_dim) * element);
    }
  }
}

void check_qkv(const SegmentTable& table, const ConstThdTensor& q, const ConstThdTensor& k,
               const ConstThdTensor& v) {
  HeadShape heads;
  heads.q_heads = q.heads;
  heads.kv_heads = k.heads;
  heads.head_dim = q.head_dim;
  heads.v_head_dim = v.head_dim;
  check_head_shape(heads);
  check_cpu_head_dims(heads);
  check_tensor("q", q, q_shape(table, q), q.dtype);
  check_tensor("k", k, k_shape(table, q, k), q.dtype);
  check_tensor("v", v, v_shape(table, k, v), q.dtype);
  validate_segment_table(table);
}

void check_sinks(const float* sinks, int64_t q_heads) {
  if (!sinks) return;
  for (int64_t h = 0; h < q_heads; ++h) {
    THDCP_CHECK(!std::isnan(sinks[h]) && sinks[h] != std::numeric_limits<float>::infinity(),
                "sinks[" << h << "]=" << sinks[h]
                         << " is not a logit: each head's sink is finite, or -inf for a head without one");
  }
}

}  // namespace cpu::detail
}  // namespace thdcp
