// Argument checks of the CUDA attention plans (host side): the ones made once at plan time
// (shape, workspace, pointers through the CUDA runtime) and the ones every run() makes with
// host arithmetic only (the table and tensors match the plan; strides; alignment).
#pragma once

#include <cstddef>
#include <cstdint>

#include "attention_params.h"
#include "thdcp/cuda/attention.h"
#include "thdcp/cuda/check.h"

namespace thdcp::cuda::detail {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int current_device();

const char* memory_type_name(cudaMemoryType type);
using ::thdcp::cuda::check_device_pointer;  // thdcp/cuda/check.h

// The description of a table (capacity, rows, mask), not its device contents.
void check_table_description(const DeviceSegmentTable& table);

// Everything of a plan's shape that both directions share: the table description, heads,
// head dim and dtype. `backward` also checks dq_dtype and dkv_dtype.
void check_shape(const AttentionShape& shape, bool backward);

// run(): `table` has the capacity, rows, mask and kind the plan was made for, and a segment
// array when it has entries.
void check_table_matches(const AttentionShape& shape, const DeviceSegmentTable& table);

// The shapes of a call's query-side ([q_rows, Hq, D_qk]: q, dq; [q_rows, Hq, D_v]: out,
// dout) and key-side ([k_rows, Hkv, D_qk]: k, dk; [k_rows, Hkv, D_v]: v, dv) tensors.
ThdShape q_shape(const AttentionShape& shape);
ThdShape kv_shape(const AttentionShape& shape);
ThdShape q_value_shape(const AttentionShape& shape);
ThdShape kv_value_shape(const AttentionShape& shape);

// run(): one THD tensor of the call has the expected shape and dtype (thdcp::check_thd_shape,
// check_thd_dtype; or fp32 with `or_fp32`), strides >= 0 that the kernels can apply (each a
// multiple of 16 bytes, rows below kMaxRowStride, a row's heads within 2^31 elements; any
// order: heads before rows too) and a non-null, 16-byte-aligned data pointer (when it has
// elements). Overlap is the call's check (thdcp::check_outputs_apart).
void check_view(const char* name, const ConstThdTensor& t, const ThdShape& shape, DType dtype,
                bool or_fp32 = false);

// A view's strides as the kernels take them: 0 resolved, and the stride of a dimension with
// one index (never applied, so never checked) replaced by the contiguous one, so that the
// kernels' 32-bit arithmetic never meets an unchecked value and a contiguous tensor still
// reads as contiguous.
inline Strides strides_of(const ConstThdTensor& t) {
  return Strides{t.tokens > 1 ? t.row_step() : t.heads * t.head_dim, t.heads > 1 ? t.head_step() : t.head_dim};
}

// Whether the kernels see the view as dense [rows, heads, head_dim] (strides_of).
inline bool dense(const ConstThdTensor& t) {
  const Strides s = strides_of(t);
  return s.row == t.heads * t.head_dim && s.head == t.head_dim;
}

// run(): an fp32 array of `count` elements (lse, max_logit): non-null when count > 0, and
// aligned to 4 bytes.
void check_float_array(const char* name, const void* pointer, int64_t count);

}  // namespace thdcp::cuda::detail
