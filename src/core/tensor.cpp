#include "thdcp/core/tensor.h"

#include "thdcp/core/error.h"

namespace thdcp {

void check_thd_shape(const char* name, const ConstThdTensor& t, const ThdShape& expected) {
  THDCP_CHECK(t.tokens == expected.rows && t.heads == expected.heads && t.head_dim == expected.head_dim,
              name << " is [" << t.tokens << ", " << t.heads << ", " << t.head_dim << "] but must be ["
                   << expected.rows_name << "=" << expected.rows << ", " << expected.heads_name << "="
                   << expected.heads << ", " << expected.head_dim_name << "=" << expected.head_dim << "]");
  THDCP_CHECK(t.data != nullptr || t.numel() == 0, name << " is a null pointer: pass its memory");
}

void check_thd_dtype(const char* name, DType actual, DType expected, bool or_fp32) {
  THDCP_CHECK(actual == expected || (or_fp32 && actual == DType::kFloat32),
              name << " has dtype " << dtype_name(actual) << " but must be " << dtype_name(expected)
                   << (or_fp32 && expected != DType::kFloat32 ? " or fp32" : ""));
}

}  // namespace thdcp
