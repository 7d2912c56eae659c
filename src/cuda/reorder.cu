// Row reorders between gathered (rank-major) and sequence order, on the device.
#include "launch.h"
#include "thdcp/cuda/check.h"
#include "thdcp/cuda/reorder.h"
#include "thdcp/plan/dual_chunk.h"

namespace thdcp::cuda {

namespace {

constexpr int kThreads = 256;

// One thread per 16-byte word of a row. kToSequence moves gathered -> ordered, else back.
template <bool kToSequence>
__global__ void reorder_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, int64_t words_per_row,
                               const int32_t* __restrict__ cu_seqlens_padded, int max_seqs, int64_t total_rows,
                               int cp) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= total_rows * words_per_row) return;
  const int64_t global_row = index / words_per_row;
  const int64_t word = index - global_row * words_per_row;
  const DualChunkLocation where = dual_chunk_locate_row(cu_seqlens_padded, max_seqs, cp, global_row);
  const int64_t gathered_row = where.rank * (total_rows / cp) + where.local_row;
  if (kToSequence) {
    dst[global_row * words_per_row + word] = src[gathered_row * words_per_row + word];
  } else {
    dst[gathered_row * words_per_row + word] = src[global_row * words_per_row + word];
  }
}

template <bool kToSequence>
void launch_reorder(const void* src, void* dst, size_t row_bytes, const int32_t* cu_seqlens_padded, int max_seqs,
                    int64_t total_rows, int cp, cudaStream_t stream) {
  THDCP_CHECK(row_bytes % 16 == 0, "row_bytes=" << row_bytes << " must be a multiple of 16");
  THDCP_CHECK(cp >= 1 && max_seqs >= 1 && total_rows >= 0 && total_rows % (2 * cp) == 0,
              "reorder: cp=" << cp << ", max_seqs=" << max_seqs << ", total_rows=" << total_rows
                             << ": need cp >= 1, max_seqs >= 1 and total_rows a multiple of 2*cp");
  const int64_t words_per_row = static_cast<int64_t>(row_bytes / 16);
  const int64_t work = total_rows * words_per_row;
  if (work == 0) return;
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  reorder_kernel<kToSequence><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const uint4*>(src), static_cast<uint4*>(dst), words_per_row, cu_seqlens_padded, max_seqs,
      total_rows, cp);
  THDCP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace

void gathered_to_sequence_order(const void* gathered, void* ordered, size_t row_bytes,
                                const int32_t* cu_seqlens_padded, int max_seqs, int64_t total_rows, int cp,
                                cudaStream_t stream) {
  launch_reorder<true>(gathered, ordered, row_bytes, cu_seqlens_padded, max_seqs, total_rows, cp, stream);
}

void sequence_to_gathered_order(const void* ordered, void* gathered, size_t row_bytes,
                                const int32_t* cu_seqlens_padded, int max_seqs, int64_t total_rows, int cp,
                                cudaStream_t stream) {
  launch_reorder<false>(ordered, gathered, row_bytes, cu_seqlens_padded, max_seqs, total_rows, cp, stream);
}

void convert_from_fp32(const float* src, void* dst, DType dtype, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (dtype == DType::kFloat32) {
    THDCP_CHECK_CUDA(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice,
                                     stream));
    return;
  }
  detail::launch_cast(src, dst, dtype, n, stream);
}

}  // namespace thdcp::cuda
