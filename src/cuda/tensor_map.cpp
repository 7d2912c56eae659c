// TMA tensor maps of THD tensors (tensor_map.h).
#include "tensor_map.h"

#include <cstring>

#include "thdcp/core/error.h"
#include "thdcp/cuda/check.h"

namespace thdcp::cuda::detail {

EncodeTiledFn tensor_map_encoder() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  THDCP_CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &status));
  THDCP_CHECK(status == cudaDriverEntryPointSuccess && fn != nullptr,
              "the CUDA driver has no cuTensorMapEncodeTiled (query status " << static_cast<int>(status)
                                                                             << "): the Hopper kernels need a driver "
                                                                                "of CUDA 12.0 or newer; set "
                                                                                "THDCP_PORTABLE_KERNELS=1 to use the "
                                                                                "portable ones");
  return reinterpret_cast<EncodeTiledFn>(fn);
}

ThdTensorMap encode_thd_tensor_map(EncodeTiledFn encode, const char* name, const ConstThdTensor& t, int box_rows) {
  ThdTensorMap result;
  std::memset(&result, 0, sizeof(result));
  if (t.numel() == 0) return result;
  const cuuint64_t element = dtype_size(t.dtype);
  // A dimension of one index never applies its stride (check_view does not check it): it
  // takes one the driver accepts that keeps the outer strides increasing.
  const bool rows_used = t.tokens > 1, heads_used = t.heads > 1;
  cuuint64_t row_bytes = static_cast<cuuint64_t>(t.row_step()) * element;
  cuuint64_t head_bytes = static_cast<cuuint64_t>(t.head_step()) * element;
  if (!heads_used) head_bytes = rows_used ? row_bytes : (static_cast<cuuint64_t>(t.head_dim) * element + 15) / 16 * 16;
  if (!rows_used) row_bytes = head_bytes * static_cast<cuuint64_t>(t.heads);
  // The outer strides in increasing order: rows outermost for row-major views, heads
  // outermost for head-major ones ([H, T, D] memory: head stride above row stride).
  result.heads_outer = rows_used && heads_used && head_bytes > row_bytes ? 1 : 0;
  const cuuint64_t heads = static_cast<cuuint64_t>(t.heads);
  const cuuint64_t rows = static_cast<cuuint64_t>(t.tokens);
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(t.head_dim), result.heads_outer ? rows : heads,
                              result.heads_outer ? heads : rows};
  const cuuint64_t strides[2] = {result.heads_outer ? row_bytes : head_bytes,
                                 result.heads_outer ? head_bytes : row_bytes};
  const cuuint32_t columns = static_cast<cuuint32_t>(t.head_dim < 64 ? t.head_dim : 64);
  const cuuint32_t box[3] = {columns, result.heads_outer ? static_cast<cuuint32_t>(box_rows) : 1u,
                             result.heads_outer ? 1u : static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUtensorMapDataType type =
      t.dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const CUresult status =
      encode(&result.map, type, 3, const_cast<void*>(t.data), dims, strides, box, element_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  THDCP_CHECK(status == CUDA_SUCCESS, "cannot describe " << name << " to the tensor memory accelerator (driver error "
                                                         << static_cast<int>(status) << "): " << t.tokens << " rows, "
                                                         << t.heads << " heads, row stride " << t.row_step()
                                                         << ", head stride " << t.head_step()
                                                         << " elements; set THDCP_PORTABLE_KERNELS=1 to use the "
                                                            "portable kernels for such a view");
  return result;
}

}  // namespace thdcp::cuda::detail
