// TMA tensor maps of THD tensors for the Hopper kernels (host side). A map describes a whole
// [rows, heads, head_dim] view (its strides included) as a 3-D tensor; a kernel copies
// boxes of 64 columns (128 bytes: one swizzle atom row) x 1 head x box_rows rows by
// coordinates, so packed sequences need no per-sequence descriptor, and rows past the
// tensor's end arrive as zeros. Row-major views are (columns, heads, rows); views whose head
// stride is above their row stride (head-major [H, T, D] memory) are (columns, rows, heads)
// with ThdTensorMap::heads_outer set, so the driver always gets increasing outer strides.
#pragma once

#include <cuda.h>

#include "attention_params.h"
#include "thdcp/core/tensor.h"

namespace thdcp::cuda::detail {

// The driver's cuTensorMapEncodeTiled, looked up through the runtime (no link against
// libcuda). Host only; plans look it up when they are made.
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiledFn tensor_map_encoder();

// The map of view `t` (`name` for errors) for boxes of box_rows rows. Host arithmetic and one
// driver call that touches no stream: safe while a stream is captured. An empty view gets
// an all-zero map (never read: no block has work then).
ThdTensorMap encode_thd_tensor_map(EncodeTiledFn encode, const char* name, const ConstThdTensor& t, int box_rows);

}  // namespace thdcp::cuda::detail
