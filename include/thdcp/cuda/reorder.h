// Device-side row reorders of AllGather CP (DESIGN.md sections 3 and 5), from the global
// layout's cu_seqlens_padded alone: nothing is read back to the host, grids are sized by
// the layout's capacity, so the calls can be captured in a CUDA graph.
//
// "Gathered order" is what an all-gather of the ranks' local tensors produces: cp blocks of
// T/cp rows, rank after rank, each block in the rank's dual-chunk local order. "Sequence
// order" is the global padded layout (T rows, sequence after sequence).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "thdcp/core/dtype.h"
#include "thdcp/core/tensor.h"
#include "thdcp/plan/layout.h"

namespace thdcp::cuda {

// ordered[g] = gathered[owner(g)] for every global row g < layout.capacity.max_tokens.
//   row_bytes      bytes per row, a multiple of 16 (rows are moved in 16-byte words)
//   layout         the global layout in capacity form: every padded length a multiple of
//                  2*cp (only cu_seqlens_padded is read)
//   ordered_pitch  bytes from one row of `ordered` to the next (0: row_bytes); wider where
//                  `ordered` is a slice of each row's heads. Both pointers 16-byte aligned.
void gathered_to_sequence_order(const void* gathered, void* ordered, size_t row_bytes, const DeviceLayout& layout,
                                int cp, cudaStream_t stream, size_t ordered_pitch = 0);

// The two row orders of a CP layout's global rows.
enum class RowOrder { kGathered, kSequence };

// `planes` planes (one after another, each of layout.capacity.max_tokens rows of row_bytes
// bytes) from `src` in the other order into `dst` in order `to`: gathered -> sequence as
// gathered_to_sequence_order does, or sequence -> gathered (its inverse). row_bytes a
// multiple of 4 (16-byte words where it is a multiple of 16): rows of head-sharded tensors,
// or of LSE planes ([H, T], 4-byte rows). Dual-chunk layouts (every padded length a multiple
// of 2*cp). Stream-ordered, capture-safe.
void reorder_rows(const void* src, void* dst, size_t row_bytes, int64_t planes, RowOrder to,
                  const DeviceLayout& layout, int cp, cudaStream_t stream);

// The rows of one group's all-to-all in a2a+ag CP (thdcp/cp/cp.h): group `group` of `members`
// consecutive ranks of cp. "Member order" is what the group's all-to-all gives: `members`
// blocks of T/cp rows, member after member, each in its rank's local order at cp; "group
// order" is the local order of rank `group` of the same layout at cp / members (with members
// == cp, group 0: the gathered and sequence orders of reorder_rows). `planes` planes of
// T / (cp / members) rows each, from `src` in the other order into `dst` in order `to`.
// row_bytes a multiple of 4. Dual-chunk layouts (every padded length a multiple of 2*cp).
// Stream-ordered, capture-safe.
enum class GroupOrder { kMembers, kGroup };
void regroup_rows(const void* src, void* dst, size_t row_bytes, int64_t planes, GroupOrder to,
                  const DeviceLayout& layout, int cp, int members, int group, cudaStream_t stream);

// rows[g] = the gathered row of global row g (its owner's rank * T/cp + its local row), for
// every g < layout.capacity.max_tokens: the map thdcp::BackwardTensors::dkv_rows takes
// to accumulate dK/dV of sequence-order keys straight in the order the ranks hold them.
void gathered_rows_of_sequence(const DeviceLayout& layout, int cp, int32_t* rows, cudaStream_t stream);

// The elements of the view `src` (any strides >= 0, device memory) as dense rows
// [tokens, heads, head_dim] at `dst` (device memory of src.numel() elements, not overlapping
// src): the send buffer of an all-gather from a strided local K or V. 16-byte words where the
// data pointers, the strides the view applies and head_dim allow, else smaller ones.
// Stream-ordered, capture-safe.
void pack_rows(const ConstThdTensor& src, void* dst, cudaStream_t stream);

// dst[i] = src[i] rounded to `dtype` (to nearest even; fp32 is a copy), n elements.
void convert_from_fp32(const float* src, void* dst, DType dtype, int64_t n, cudaStream_t stream);

// dst[i] = src[i] (bf16 or fp16, n elements) as fp32: exact.
void convert_to_fp32(const void* src, DType dtype, float* dst, int64_t n, cudaStream_t stream);

// The same into a strided view: src holds dst.tokens * dst.heads * dst.head_dim contiguous
// floats ([tokens, heads, head_dim]); element (row, head, d) goes to dst's (row, head, d).
void convert_from_fp32(const float* src, ThdTensor dst, cudaStream_t stream);

// dst[i] = src[i] + dst[i] (src_first) or dst[i] + src[i], for n floats: a partial sum added
// in a fixed order (the halo gather's dK/dV, rank order). Stream-ordered, capture-safe.
void accumulate(const float* src, float* dst, int64_t n, bool src_first, cudaStream_t stream);

// sum[i] = parts[0 * count + i] + parts[1 * count + i] + ... over `ranks` parts, added in
// rank order in fp64 and rounded once (the same bits on every rank and run): the whole of
// per-rank partial sums after an all-gather, e.g. AllGather CP's d(sink). Stream-ordered,
// capture-safe.
void sum_rank_parts(const float* parts, int ranks, int64_t count, float* sum, cudaStream_t stream);

}  // namespace thdcp::cuda
