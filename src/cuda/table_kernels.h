// The device-side table kernels: the segment-table builders (table_build.cu) and the tile
// schedule over a table (tile_schedule.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "thdcp/plan/mask.h"
#include "thdcp/plan/segment.h"

namespace thdcp::cuda::detail {

// The device table builders (table_build.cu): the single-device table of max_seqs sequences,
// the dual-chunk AllGather-CP table of `rank` (two segments per sequence), and the
// contiguous one (one segment per sequence: its rows among the rank's q_rows global rows
// from rank_begin).
void launch_build_single_table(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded, int max_seqs,
                               Segment* segments, cudaStream_t stream);
void launch_build_cp_table(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded, int max_seqs, int cp,
                           int rank, Mask mask, Segment* segments, cudaStream_t stream);
// key_row_offset: the global row of key row 0 minus rank_begin (-rank_begin: keys are every
// global row, the whole gather; -left: the rank's rows with `left` rows before them, a halo table).
void launch_build_contiguous_cp_table(const int32_t* cu_seqlens, const int32_t* cu_seqlens_padded, int max_seqs,
                                      int64_t rank_begin, int64_t q_rows, int64_t key_row_offset, Mask mask,
                                      Segment* segments, cudaStream_t stream);

// Tile schedule: start[s] = sum over s' < s of tiles(s'), for query tiles of `q_tile_rows`
// (over q_span) into q_start and key tiles of `k_tile_rows` (over k_len, segments with
// queries only) into k_start (may be null). Also fills max_logit (may be null) with -inf and
// zeroes *work_counter (may be null: the persistent forward's item counter).
void launch_schedule(const Segment* segments, int num_segments, int q_tile_rows, int* q_start, int k_tile_rows,
                     int* k_start, float* max_logit, int q_heads, int* work_counter, cudaStream_t stream);

}  // namespace thdcp::cuda::detail
