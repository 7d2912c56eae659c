#include "attention_common.h"

namespace thdcp {

bool cpu_supports_head_dim(int64_t head_dim) { return head_dim >= 8 && head_dim <= 256 && head_dim % 8 == 0; }

namespace cpu::detail {

void check_tensor(const char* name, const ConstThdTensor& t, int64_t rows, int64_t heads, int64_t head_dim) {
  THDCP_CHECK(rows < 0 || t.tokens == rows,
              name << " has " << t.tokens << " rows but the segment table addresses " << rows
                   << ": pass a tensor of " << rows << " rows (the layout's cu_seqlens_padded[-1])");
  THDCP_CHECK(t.heads == heads, name << " has " << t.heads << " heads, expected " << heads);
  THDCP_CHECK(t.head_dim == head_dim, name << " has head_dim=" << t.head_dim << ", expected " << head_dim);
  THDCP_CHECK(t.data != nullptr || t.numel() == 0, name << " has no data (null pointer)");
  THDCP_CHECK(t.contiguous(), name << " is strided (row_stride=" << t.row_stride << ", head_stride=" << t.head_stride
                                   << "): the CPU reference takes contiguous tensors; copy it into one");
}

void check_qkv(const SegmentTable& table, const ConstThdTensor& q, const ConstThdTensor& k,
               const ConstThdTensor& v) {
  THDCP_CHECK(q.heads >= 1 && k.heads >= 1,
              "q has " << q.heads << " heads and k has " << k.heads << ": both need at least 1");
  THDCP_CHECK(q.heads % k.heads == 0, "q has " << q.heads << " heads, not a multiple of the " << k.heads
                                               << " heads of k/v (GQA/MQA need Hq % Hkv == 0)");
  THDCP_CHECK(cpu_supports_head_dim(q.head_dim),
              "head_dim=" << q.head_dim << " is not supported by the CPU backend: use a multiple of 8 in [8, 256]");
  check_tensor("q", q, table.q_rows, q.heads, q.head_dim);
  check_tensor("k", k, table.k_rows, k.heads, q.head_dim);
  check_tensor("v", v, table.k_rows, k.heads, q.head_dim);
  THDCP_CHECK(k.dtype == q.dtype && v.dtype == q.dtype,
              "q, k, v must share a dtype; got " << dtype_name(q.dtype) << ", " << dtype_name(k.dtype) << ", "
                                                 << dtype_name(v.dtype));
  validate_segment_table(table);
}

void check_output_dtype(const char* name, DType dtype, DType input_dtype) {
  THDCP_CHECK(dtype == input_dtype || dtype == DType::kFloat32,
              name << " has dtype " << dtype_name(dtype) << ": use the inputs' dtype (" << dtype_name(input_dtype)
                   << ") or fp32");
}

}  // namespace cpu::detail
}  // namespace thdcp
