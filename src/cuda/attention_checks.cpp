#include "attention_checks.h"

#include <cmath>
#include <limits>

#include "thdcp/core/error.h"
#include "thdcp/core/overlap.h"
#include "thdcp/cuda/check.h"

namespace thdcp::cuda::detail {

const char* memory_type_name(cudaMemoryType type) {
  switch (type) {
    case cudaMemoryTypeUnregistered: return "unregistered host memory";
    case cudaMemoryTypeHost: return "pinned host memory";
    case cudaMemoryTypeDevice: return "device memory";
    case cudaMemoryTypeManaged: return "managed memory";
  }
  return "unknown memory";
}

namespace {

// The kernels move rows and heads in 16-byte pieces (cp.async, TMA boxes, vector stores), so
// every stride they apply, and the data pointer, must be a multiple of 16 bytes.
constexpr int64_t kStrideBytes = 16;

// The heads of one row are addressed with 32-bit offsets (row_offset in tensor_core.cuh).
constexpr int64_t kMaxHeadSpan = int64_t{1} << 31;

// The stride of a `dimension` ("row" or "head") of tensor `name`, `step` elements, is a
// multiple of `quantum`, the elements of kStrideBytes.
void check_whole_pieces(const char* name, const char* dimension, int64_t step, int64_t quantum, DType dtype) {
  THDCP_CHECK(step % quantum == 0, name << "." << dimension << "_stride=" << step << " is not a multiple of " << quantum
                                        << " elements (" << kStrideBytes << " bytes of " << dtype_name(dtype)
                                        << "): the CUDA kernels move " << dimension
                                        << "s in 16-byte pieces (cp.async, TMA); pad the " << dimension
                                        << "s to a multiple of " << quantum << " elements");
}

}  // namespace

int current_device() {
  int device = 0;
  THDCP_CHECK_CUDA(cudaGetDevice(&device));
  return device;
}

void check_table_description(const DeviceSegmentTable& table) {
  THDCP_CHECK(table.capacity >= 0, "segment table capacity " << table.capacity << " must be >= 0");
  THDCP_CHECK(table.q_rows >= 0 && table.k_rows >= 0 && table.q_rows <= std::numeric_limits<int32_t>::max() &&
                  table.k_rows <= std::numeric_limits<int32_t>::max(),
              "segment table rows (q_rows=" << table.q_rows << ", k_rows=" << table.k_rows
                                            << ") must be in [0, 2^31)");
  THDCP_CHECK(table.kind == TableKind::kSingleDevice || table.kind == TableKind::kAllGatherCp ||
                  table.kind == TableKind::kContiguousAllGatherCp,
              "segment table kind " << static_cast<int>(table.kind)
                                    << " is not a TableKind: take the table from a TablePlan");
  check_mask(table.mask);
}

void check_shape(const AttentionShape& shape, bool backward) {
  check_table_description(shape.table);
  THDCP_CHECK(shape.dtype == DType::kBFloat16 || shape.dtype == DType::kFloat16,
              "dtype " << dtype_name(shape.dtype)
                       << " (of q, k, v, out, dout) is not supported by the CUDA backend: use bf16 or fp16");
  check_head_shape(shape);
  THDCP_CHECK(cuda_supports_head_dims(shape.head_dim, shape.value_head_dim()),
              "head_dim=" << shape.head_dim << ", v_head_dim=" << shape.value_head_dim()
                          << " is not supported by the CUDA backend: it serves " << cuda_head_dims_text()
                          << "; the CPU backend takes any pair of multiples of 8 up to 256");
  THDCP_CHECK(shape.q_heads <= 65535, "q_heads=" << shape.q_heads << " is more than the CUDA grid's 65535");
  if (!backward) return;
  check_thd_dtype("dq", shape.dq_dtype, shape.dtype, /*or_fp32=*/true);
  check_thd_dtype("dk", shape.dkv_dtype, shape.dtype, /*or_fp32=*/true);
}

void check_table_matches(const AttentionShape& shape, const DeviceSegmentTable& table) {
  const DeviceSegmentTable& planned = shape.table;
  THDCP_CHECK(table.capacity == planned.capacity,
              "segment table capacity " << table.capacity << " differs from the plan's " << planned.capacity
                                        << ": make a plan for this capacity");
  THDCP_CHECK(table.q_rows == planned.q_rows && table.k_rows == planned.k_rows,
              "segment table rows (q_rows=" << table.q_rows << ", k_rows=" << table.k_rows
                                            << ") differ from the plan's (q_rows=" << planned.q_rows
                                            << ", k_rows=" << planned.k_rows << "): make a plan for these rows");
  THDCP_CHECK(table.mask.window_left == planned.mask.window_left &&
                  table.mask.window_right == planned.mask.window_right,
              "segment table mask (window " << table.mask.window_left << ", " << table.mask.window_right
                                            << ") differs from the plan's (window " << planned.mask.window_left
                                            << ", " << planned.mask.window_right << "): make a plan for this mask");
  THDCP_CHECK(table.kind == planned.kind,
              "segment table kind (" << table_kind_name(table.kind) << ") differs from the plan's ("
                                     << table_kind_name(planned.kind) << "): make a plan for this kind of table");
  THDCP_CHECK(table.capacity == 0 || table.segments != nullptr,
              "table.segments is a null pointer: build the table (TablePlan::run) into a device array");
}

ThdShape q_shape(const AttentionShape& shape) {
  return ThdShape{shape.table.q_rows, "q_rows", shape.q_heads, "q_heads", shape.head_dim};
}

ThdShape kv_shape(const AttentionShape& shape) {
  return ThdShape{shape.table.k_rows, "k_rows", shape.kv_heads, "kv_heads", shape.head_dim};
}

ThdShape q_value_shape(const AttentionShape& shape) {
  return ThdShape{shape.table.q_rows, "q_rows", shape.q_heads, "q_heads", shape.value_head_dim(), "v_head_dim"};
}

ThdShape kv_value_shape(const AttentionShape& shape) {
  return ThdShape{shape.table.k_rows, "k_rows", shape.kv_heads, "kv_heads", shape.value_head_dim(), "v_head_dim"};
}

void check_view(const char* name, const ConstThdTensor& t, const ThdShape& shape, DType dtype, bool or_fp32) {
  check_thd_shape(name, t, shape);
  check_thd_dtype(name, t.dtype, dtype, or_fp32);
  check_thd_strides(name, t);
  const int64_t element = static_cast<int64_t>(dtype_size(t.dtype));
  const int64_t quantum = kStrideBytes / element;  // elements per 16 bytes
  // A dimension of one index never applies its stride (strides_of replaces it): only the
  // others are checked.
  if (t.tokens > 1) {
    const int64_t row_step = t.row_step();
    check_whole_pieces(name, "row", row_step, quantum, t.dtype);
    THDCP_CHECK(row_step < kMaxRowStride, name << ".row_stride=" << row_step
                                                << " is not below 2^26 elements: the CUDA kernels step over rows "
                                                   "with 32-bit offsets");
  }
  if (t.heads > 1) {
    const int64_t head_step = t.head_step();
    check_whole_pieces(name, "head", head_step, quantum, t.dtype);
    const int64_t span = (t.heads - 1) * head_step + t.head_dim;
    THDCP_CHECK(head_step < kMaxHeadSpan && span <= kMaxHeadSpan,
                name << " has " << t.heads << " heads " << head_step
                     << " elements apart: (heads - 1) * head_stride + head_dim = " << span
                     << " is above 2^31 elements, and the CUDA kernels address the heads of a row with 32-bit "
                        "offsets; split the heads over calls");
  }
  if (t.numel() > 0) {
    THDCP_CHECK(reinterpret_cast<uintptr_t>(t.data) % kStrideBytes == 0,
                name << "=" << t.data
                     << " is not 16-byte aligned: the CUDA kernels move rows in 16-byte pieces (allocate with "
                        "cudaMalloc, offset by multiples of 16 bytes)");
  }
}

void check_float_array(const char* name, const void* pointer, int64_t count) {
  if (count == 0 && pointer == nullptr) return;
  THDCP_CHECK(pointer != nullptr, name << " is a null pointer");
  THDCP_CHECK(reinterpret_cast<uintptr_t>(pointer) % alignof(float) == 0,
              name << "=" << pointer << " is not " << alignof(float) << "-byte aligned");
}

}  // namespace thdcp::cuda::detail

namespace thdcp::cuda {

void check_device_pointer(const char* name, const void* pointer, int device, size_t alignment) {
  THDCP_CHECK(pointer != nullptr, name << " is a null pointer");
  THDCP_CHECK(reinterpret_cast<uintptr_t>(pointer) % alignment == 0,
              name << "=" << pointer << " is not " << alignment
                   << "-byte aligned: the CUDA kernels need aligned rows (allocate with cudaMalloc, "
                      "offset by whole rows)");
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, pointer);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky; do not leave it for the caller's next check
    THDCP_FAIL(name << "=" << pointer << " is not a CUDA pointer (" << cudaGetErrorString(status) << ")");
  }
  THDCP_CHECK(attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged,
              name << " points to " << detail::memory_type_name(attributes.type) << ": pass device memory of device "
                   << device);
  THDCP_CHECK(attributes.device == device,
              name << " lives on device " << attributes.device << " but the call runs on device " << device
                   << ": make device " << attributes.device
                   << " current (cudaSetDevice) before planning, or move the tensor");
}

}  // namespace thdcp::cuda
