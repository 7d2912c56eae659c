// The device segment-table builders (TablePlan::run): a thread per sequence (single device,
// contiguous AllGather CP) or per (sequence, slot) (dual-chunk AllGather CP), from the device
// layout alone.
//
// They call the same __host__ __device__ functions as the host builders (single_device_segment,
// cp_segment, contiguous_segment in thdcp/plan/segment.h): the index math exists once.
#include "grid.h"
#include "table_kernels.h"
#include "thdcp/cuda/check.h"
#include "thdcp/plan/segment.h"

namespace thdcp::cuda::detail {

namespace {

constexpr int kBuildThreads = 128;

__global__ void build_single_table_kernel(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded, int max_seqs,
                                          Segment* segments) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= max_seqs) return;
  const int64_t start = cu_seqlens_padded[b];
  segments[b] = single_device_segment(start, cu_seqlens_padded[b + 1] - start, cu_seqlens[b + 1] - cu_seqlens[b]);
}

__global__ void build_cp_table_kernel(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded, int max_seqs,
                                      int cp, int rank, Mask mask, Segment* segments) {
  const int index = blockIdx.x * blockDim.x + threadIdx.x;
  if (index >= 2 * max_seqs) return;
  const int b = index / 2;
  const int slot = index % 2;
  const int64_t start = cu_seqlens_padded[b];
  const int64_t padded_len = cu_seqlens_padded[b + 1] - start;
  const int64_t length = cu_seqlens[b + 1] - cu_seqlens[b];
  segments[index] = cp_segment(start, padded_len, length, cp, rank, slot, mask);
}

__global__ void build_contiguous_cp_table_kernel(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded,
                                                 int max_seqs, int64_t rank_begin, int64_t q_rows,
                                                 int64_t key_row_offset, Mask mask, Segment* segments) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= max_seqs) return;
  const int64_t start = cu_seqlens_padded[b];
  Segment s = contiguous_segment(start, cu_seqlens_padded[b + 1] - start, cu_seqlens[b + 1] - cu_seqlens[b],
                                 rank_begin, rank_begin + q_rows, mask);
  // Keys as rows of the key tensor: global rows from rank_begin + key_row_offset on (a
  // segment without keys keeps row 0).
  const int64_t first_key_row = rank_begin + key_row_offset;
  s.k_row = s.k_len > 0 ? static_cast<int32_t>(s.k_row - first_key_row) : 0;
  segments[b] = s;
}

}  // namespace

void launch_build_single_table(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded, int max_seqs,
                               Segment* segments, cudaStream_t stream) {
  if (max_seqs == 0) return;
  build_single_table_kernel<<<blocks_for(max_seqs, kBuildThreads), kBuildThreads, 0, stream>>>(
      cu_seqlens, cu_seqlens_padded, max_seqs, segments);
  THDCP_CHECK_CUDA(cudaGetLastError());
}

void launch_build_cp_table(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded, int max_seqs, int cp,
                           int rank, Mask mask, Segment* segments, cudaStream_t stream) {
  if (max_seqs == 0) return;
  build_cp_table_kernel<<<blocks_for(2 * static_cast<int64_t>(max_seqs), kBuildThreads), kBuildThreads, 0,
                          stream>>>(cu_seqlens, cu_seqlens_padded, max_seqs, cp, rank, mask, segments);
  THDCP_CHECK_CUDA(cudaGetLastError());
}

void launch_build_contiguous_cp_table(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded, int max_seqs,
                                      int64_t rank_begin, int64_t q_rows, int64_t key_row_offset, Mask mask,
                                      Segment* segments, cudaStream_t stream) {
  if (max_seqs == 0) return;
  build_contiguous_cp_table_kernel<<<blocks_for(max_seqs, kBuildThreads), kBuildThreads, 0, stream>>>(
      cu_seqlens, cu_seqlens_padded, max_seqs, rank_begin, q_rows, key_row_offset, mask, segments);
  THDCP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace thdcp::cuda::detail
