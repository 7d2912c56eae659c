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
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(t.row_step()) * element;
  // With one head the head stride is never applied (and check_view does not check it): the
  // row stride stands in, which the driver accepts.
  const cuuint64_t head_bytes = t.heads > 1 ? static_cast<cuuint64_t>(t.head_step()) * element : row_bytes;
  // Rows are outermost: the views check_view accepts have row stride >= (heads - 1) * head
  // stride + head_dim, so the outer strides increase as the driver wants them to.
  THDCP_CHECK(head_bytes <= row_bytes, name << " has head stride " << t.head_step() << " above its row stride "
                                            << t.row_step()
                                            << " elements (a head-major view): the Hopper kernels take row-major "
                                               "THD views ([T, H, D] with any padding of rows and heads)");
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(t.head_dim), static_cast<cuuint64_t>(t.heads),
                              static_cast<cuuint64_t>(t.tokens)};
  const cuuint64_t strides[2] = {head_bytes, row_bytes};
  const cuuint32_t columns = static_cast<cuuint32_t>(t.head_dim < 64 ? t.head_dim : 64);
  const cuuint32_t box[3] = {columns, 1u, static_cast<cuuint32_t>(box_rows)};
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
