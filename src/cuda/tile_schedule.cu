// The tile schedule of the attention kernels: prefix sums of each segment's query and key
// tiles, from which a kernel's block (or a persistent block's work item) finds its segment and
// tile (tile_ranges.cuh), computed on the device for a table built there.
#include <cub/block/block_scan.cuh>

#include <cmath>

#include "table_kernels.h"
#include "thdcp/cuda/check.h"
#include "thdcp/plan/segment.h"

namespace thdcp::cuda::detail {

namespace {

constexpr int kScheduleThreads = 1024;

// One block: exclusive prefix sums of the tiles of every segment.
__global__ void __launch_bounds__(kScheduleThreads)
    schedule_kernel(const Segment* segments, int num_segments, int q_tile_rows, int* q_start, int k_tile_rows,
                    int* k_start, float* max_logit, int q_heads, int* work_counter) {
  using Scan = cub::BlockScan<int, kScheduleThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  int q_carry = 0;
  int k_carry = 0;
  if (threadIdx.x == 0) {
    q_start[0] = 0;
    if (k_start) k_start[0] = 0;
    if (work_counter) *work_counter = 0;
  }
  for (int base = 0; base < num_segments; base += kScheduleThreads) {
    const int s = base + static_cast<int>(threadIdx.x);
    int q_tiles = 0;
    int k_tiles = 0;
    if (s < num_segments) {
      const Segment seg = segments[s];
      q_tiles = (seg.q_span + q_tile_rows - 1) / q_tile_rows;
      k_tiles = seg.q_len > 0 ? (seg.k_len + k_tile_rows - 1) / k_tile_rows : 0;
    }
    int q_inclusive = 0;
    int q_total = 0;
    Scan(scan_storage).InclusiveSum(q_tiles, q_inclusive, q_total);
    __syncthreads();
    int k_inclusive = 0;
    int k_total = 0;
    Scan(scan_storage).InclusiveSum(k_tiles, k_inclusive, k_total);
    __syncthreads();
    if (s < num_segments) {
      q_start[s + 1] = q_carry + q_inclusive;
      if (k_start) k_start[s + 1] = k_carry + k_inclusive;
    }
    q_carry += q_total;
    k_carry += k_total;
  }
  if (max_logit) {
    for (int h = threadIdx.x; h < q_heads; h += kScheduleThreads) max_logit[h] = -INFINITY;
  }
}

}  // namespace

void launch_schedule(const Segment* segments, int num_segments, int q_tile_rows, int* q_start, int k_tile_rows,
                     int* k_start, float* max_logit, int q_heads, int* work_counter, cudaStream_t stream) {
  schedule_kernel<<<1, kScheduleThreads, 0, stream>>>(segments, num_segments, q_tile_rows, q_start, k_tile_rows,
                                                      k_start, max_logit, q_heads, work_counter);
  THDCP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace thdcp::cuda::detail
