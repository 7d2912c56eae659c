// The small kernels around the attention backward: the row statistic delta (row_delta.cu),
// the attention sinks' gradient (sinks.cu) and the casts of fp32 accumulators into the
// caller's gradients (casts.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "thdcp/core/dtype.h"

namespace thdcp::cuda::detail {

// delta[h, row] = sum_d dout[row, h, d] * out[row, h, d] for every row (fp32); element
// (row, h, d) of out at row * out_row_stride + h * out_head_stride + d (dout likewise).
void launch_delta(const void* out, int64_t out_row_stride, int64_t out_head_stride, const void* dout,
                  int64_t dout_row_stride, int64_t dout_head_stride, DType dtype, int64_t rows, int heads,
                  int head_dim, float* delta, cudaStream_t stream);

// dsinks[h] = -sum over rows r with lse[h, r] > -inf of exp(sinks[h] - lse[h, r]) * delta[h, r]
// (sinks.cu: the attention sinks' gradient, the same bits every run), for `heads` heads of
// `rows` rows.
void launch_sink_gradient(const float* sinks, const float* lse, const float* delta, int64_t rows, int heads,
                          float* dsinks, cudaStream_t stream);

// dst[i] = scale * src[i], rounded to dtype (fp32, bf16 or fp16), for n elements.
void launch_cast(const float* src, void* dst, DType dtype, int64_t n, float scale, cudaStream_t stream);
// The same with scale 1.
void launch_cast(const float* src, void* dst, DType dtype, int64_t n, cudaStream_t stream);
// The cast of a contiguous fp32 [rows, heads, head_dim] tensor into a strided one: element
// (row, h, d) goes to dst + row * row_stride + h * head_stride + d. Contiguous strides take
// the flat cast above.
void launch_cast_strided(const float* src, void* dst, DType dtype, int64_t rows, int heads, int head_dim,
                         int64_t row_stride, int64_t head_stride, float scale, cudaStream_t stream);

}  // namespace thdcp::cuda::detail
