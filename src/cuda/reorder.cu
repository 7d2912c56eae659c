// Row reorders between gathered (rank-major) and sequence order, on the device.
#include "launch.h"
#include "thdcp/cuda/check.h"
#include "thdcp/cuda/reorder.h"
#include "thdcp/plan/dual_chunk.h"

namespace thdcp::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32;

// One warp per row: the row's owner (a binary search over cu_seqlens_padded) is found once
// per row, not once per 16-byte word, and the lanes move the row's words, coalesced.
// kToSequence moves gathered -> ordered, else back. Ordered rows are ordered_pitch words
// apart (a view of some heads of a wider tensor); gathered rows are packed.
template <bool kToSequence>
__global__ void __launch_bounds__(kThreads) reorder_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                                           int64_t words_per_row, int64_t ordered_pitch,
                                                           const int32_t* __restrict__ cu_seqlens_padded,
                                                           int max_seqs, int64_t total_rows, int cp) {
  const int64_t global_row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (global_row >= total_rows) return;
  const DualChunkLocation where = dual_chunk_locate_row(cu_seqlens_padded, max_seqs, cp, global_row);
  const int64_t gathered_row = where.rank * (total_rows / cp) + where.local_row;
  const int64_t from = kToSequence ? gathered_row * words_per_row : global_row * ordered_pitch;
  const int64_t to = kToSequence ? global_row * ordered_pitch : gathered_row * words_per_row;
  for (int64_t word = threadIdx.x % 32; word < words_per_row; word += 32) dst[to + word] = src[from + word];
}

template <bool kToSequence>
void launch_reorder(const void* src, void* dst, size_t row_bytes, size_t ordered_row_pitch,
                    const int32_t* cu_seqlens_padded, int max_seqs, int64_t total_rows, int cp, cudaStream_t stream) {
  THDCP_CHECK(row_bytes % 16 == 0, "row_bytes=" << row_bytes << " must be a multiple of 16");
  if (ordered_row_pitch == 0) ordered_row_pitch = row_bytes;
  THDCP_CHECK(ordered_row_pitch % 16 == 0 && ordered_row_pitch >= row_bytes,
              "ordered_row_pitch=" << ordered_row_pitch << " must be a multiple of 16 and at least row_bytes="
                                   << row_bytes);
  THDCP_CHECK(cp >= 1 && max_seqs >= 1 && total_rows >= 0 && total_rows % (2 * cp) == 0,
              "reorder: cp=" << cp << ", max_seqs=" << max_seqs << ", total_rows=" << total_rows
                             << ": need cp >= 1, max_seqs >= 1 and total_rows a multiple of 2*cp");
  const int64_t words_per_row = static_cast<int64_t>(row_bytes / 16);
  if (total_rows == 0 || words_per_row == 0) return;
  const int64_t blocks = (total_rows + kRowsPerBlock - 1) / kRowsPerBlock;
  reorder_kernel<kToSequence><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const uint4*>(src), static_cast<uint4*>(dst), words_per_row,
      static_cast<int64_t>(ordered_row_pitch / 16), cu_seqlens_padded, max_seqs, total_rows, cp);
  THDCP_CHECK_CUDA(cudaGetLastError());
}

__global__ void gathered_rows_kernel(const int32_t* __restrict__ cu_seqlens_padded, int max_seqs, int64_t total_rows,
                                     int cp, int32_t* __restrict__ rows) {
  const int64_t global_row = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (global_row >= total_rows) return;
  const DualChunkLocation where = dual_chunk_locate_row(cu_seqlens_padded, max_seqs, cp, global_row);
  rows[global_row] = static_cast<int32_t>(where.rank * (total_rows / cp) + where.local_row);
}

}  // namespace

void gathered_to_sequence_order(const void* gathered, void* ordered, size_t row_bytes,
                                const int32_t* cu_seqlens_padded, int max_seqs, int64_t total_rows, int cp,
                                cudaStream_t stream, size_t ordered_row_pitch) {
  launch_reorder<true>(gathered, ordered, row_bytes, ordered_row_pitch, cu_seqlens_padded, max_seqs, total_rows, cp,
                       stream);
}

void sequence_to_gathered_order(const void* ordered, void* gathered, size_t row_bytes,
                                const int32_t* cu_seqlens_padded, int max_seqs, int64_t total_rows, int cp,
                                cudaStream_t stream) {
  launch_reorder<false>(ordered, gathered, row_bytes, 0, cu_seqlens_padded, max_seqs, total_rows, cp, stream);
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

void convert_from_fp32(const float* src, ThdTensor dst, cudaStream_t stream) {
  if (dst.numel() == 0) return;
  detail::launch_cast_strided(src, dst.data, dst.dtype, dst.tokens, static_cast<int>(dst.heads),
                              static_cast<int>(dst.head_dim), dst.row_step(), dst.head_step(), 1.0f, stream);
}

void gathered_rows_of_sequence(const int32_t* cu_seqlens_padded, int max_seqs, int64_t total_rows, int cp,
                               int32_t* rows, cudaStream_t stream) {
  THDCP_CHECK(cp >= 1 && max_seqs >= 1 && total_rows >= 0 && total_rows % (2 * cp) == 0 &&
                  total_rows <= INT32_MAX,
              "gathered_rows_of_sequence: cp=" << cp << ", max_seqs=" << max_seqs << ", total_rows=" << total_rows
                                               << ": need cp >= 1, max_seqs >= 1, total_rows a multiple of 2*cp < 2^31");
  if (total_rows == 0) return;
  const int64_t blocks = (total_rows + kThreads - 1) / kThreads;
  gathered_rows_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(cu_seqlens_padded, max_seqs,
                                                                               total_rows, cp, rows);
  THDCP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace thdcp::cuda
