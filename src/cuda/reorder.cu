// Row reorders between gathered (rank-major) and sequence order, and the packing of a
// strided view into dense rows, on the device.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "backward_support.h"
#include "thdcp/cuda/check.h"
#include "thdcp/cuda/reorder.h"
#include "thdcp/plan/dual_chunk.h"

namespace thdcp::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32;

// One warp per row: the row's owner (a binary search over cu_seqlens_padded) is found once
// per row, not once per 16-byte word, and the lanes move the row's words, coalesced.
// Moves gathered rows to sequence order.
// `ordered` rows are ordered_words_per_row words apart (a slice of a row's heads: wider).
__global__ void __launch_bounds__(kThreads) reorder_kernel(const uint4* __restrict__ gathered,
                                                         uint4* __restrict__ ordered, int64_t words_per_row,
                                                         int64_t ordered_words_per_row,
                                                         const int32_t* __restrict__ cu_seqlens_padded,
                                                         int max_seqs, int64_t total_rows, int cp) {
  const int64_t global_row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (global_row >= total_rows) return;
  const DualChunkLocation where = dual_chunk_locate_row(cu_seqlens_padded, max_seqs, cp, global_row);
  const int64_t gathered_row = where.rank * (total_rows / cp) + where.local_row;
  const uint4* from = gathered + gathered_row * words_per_row;
  uint4* to = ordered + global_row * ordered_words_per_row;
  for (int64_t word = threadIdx.x % 32; word < words_per_row; word += 32) to[word] = from[word];
}

// reorder_kernel in either direction over planes of rows (blockIdx.y: the plane), in words of
// `Word`: one warp per row, its owner found once.
template <typename Word, bool kToGathered>
__global__ void __launch_bounds__(kThreads)
    reorder_planes_kernel(const Word* __restrict__ src, Word* __restrict__ dst, int64_t words_per_row,
                          const int32_t* __restrict__ cu_seqlens_padded, int max_seqs, int64_t total_rows, int cp) {
  const int64_t global_row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (global_row >= total_rows) return;
  const DualChunkLocation where = dual_chunk_locate_row(cu_seqlens_padded, max_seqs, cp, global_row);
  const int64_t gathered_row = where.rank * (total_rows / cp) + where.local_row;
  const int64_t plane = static_cast<int64_t>(blockIdx.y) * total_rows * words_per_row;
  const Word* from = src + plane + (kToGathered ? global_row : gathered_row) * words_per_row;
  Word* to = dst + plane + (kToGathered ? gathered_row : global_row) * words_per_row;
  for (int64_t word = threadIdx.x % 32; word < words_per_row; word += 32) to[word] = from[word];
}

template <typename Word>
void launch_reorder_planes(const void* src, void* dst, size_t row_bytes, int64_t planes, RowOrder to,
                           const DeviceLayout& layout, int cp, cudaStream_t stream) {
  const int64_t words_per_row = static_cast<int64_t>(row_bytes / sizeof(Word));
  const int64_t total_rows = layout.capacity.max_tokens;
  const dim3 grid(static_cast<unsigned>((total_rows + kRowsPerBlock - 1) / kRowsPerBlock), static_cast<unsigned>(planes));
  const auto* from = static_cast<const Word*>(src);
  auto* into = static_cast<Word*>(dst);
  if (to == RowOrder::kGathered) {
    reorder_planes_kernel<Word, true><<<grid, kThreads, 0, stream>>>(from, into, words_per_row, layout.cu_seqlens_padded,
                                                                     layout.capacity.max_seqs, total_rows, cp);
  } else {
    reorder_planes_kernel<Word, false><<<grid, kThreads, 0, stream>>>(
        from, into, words_per_row, layout.cu_seqlens_padded, layout.capacity.max_seqs, total_rows, cp);
  }
}

// regroup_rows: one warp per global row; the rows of other groups are left alone. A row's
// place at cp (its rank: member and group) and at cp / members (its row in the group's order)
// are found once.
template <typename Word, bool kToGroup>
__global__ void __launch_bounds__(kThreads)
    regroup_planes_kernel(const Word* __restrict__ src, Word* __restrict__ dst, int64_t words_per_row,
                          const int32_t* __restrict__ cu_seqlens_padded, int max_seqs, int64_t total_rows, int cp,
                          int members, int group) {
  const int64_t global_row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (global_row >= total_rows) return;
  const DualChunkLocation fine = dual_chunk_locate_row(cu_seqlens_padded, max_seqs, cp, global_row);
  if (fine.rank / members != group) return;
  const DualChunkLocation coarse = dual_chunk_locate_row(cu_seqlens_padded, max_seqs, cp / members, global_row);
  const int64_t member_row = (fine.rank % members) * (total_rows / cp) + fine.local_row;
  const int64_t group_rows = total_rows / (cp / members);
  const int64_t plane = static_cast<int64_t>(blockIdx.y) * group_rows * words_per_row;
  const Word* from = src + plane + (kToGroup ? member_row : coarse.local_row) * words_per_row;
  Word* to = dst + plane + (kToGroup ? coarse.local_row : member_row) * words_per_row;
  for (int64_t word = threadIdx.x % 32; word < words_per_row; word += 32) to[word] = from[word];
}

template <typename Word>
void launch_regroup_planes(const void* src, void* dst, size_t row_bytes, int64_t planes, GroupOrder to,
                           const DeviceLayout& layout, int cp, int members, int group, cudaStream_t stream) {
  const int64_t words_per_row = static_cast<int64_t>(row_bytes / sizeof(Word));
  const int64_t total_rows = layout.capacity.max_tokens;
  const dim3 grid(static_cast<unsigned>((total_rows + kRowsPerBlock - 1) / kRowsPerBlock), static_cast<unsigned>(planes));
  const auto* from = static_cast<const Word*>(src);
  auto* into = static_cast<Word*>(dst);
  const int max_seqs = layout.capacity.max_seqs;
  if (to == GroupOrder::kGroup) {
    regroup_planes_kernel<Word, true><<<grid, kThreads, 0, stream>>>(
        from, into, words_per_row, layout.cu_seqlens_padded, max_seqs, total_rows, cp, members, group);
  } else {
    regroup_planes_kernel<Word, false><<<grid, kThreads, 0, stream>>>(
        from, into, words_per_row, layout.cu_seqlens_padded, max_seqs, total_rows, cp, members, group);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) widen_kernel(const T* __restrict__ src, float* __restrict__ dst, int64_t n) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += step) {
    dst[i] = static_cast<float>(src[i]);
  }
}

__global__ void __launch_bounds__(kThreads)
    accumulate_kernel(const float* __restrict__ src, float* __restrict__ dst, int64_t n, bool src_first) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += step) {
    dst[i] = src_first ? src[i] + dst[i] : dst[i] + src[i];
  }
}

// The layout's capacity as the kernels take it (max_seqs, total_rows), checked against cp.
void check_reorder_layout(const DeviceLayout& layout, int cp, const char* what) {
  const Capacity& c = layout.capacity;
  THDCP_CHECK(cp >= 1 && c.max_seqs >= 1 && c.max_tokens >= 0 && c.max_tokens % (2 * static_cast<int64_t>(cp)) == 0 &&
                  c.max_tokens <= INT32_MAX,
              what << ": cp=" << cp << ", layout.capacity (max_seqs=" << c.max_seqs << ", max_tokens=" << c.max_tokens
                   << "): need cp >= 1, max_seqs >= 1 and max_tokens a multiple of 2*cp below 2^31");
  THDCP_CHECK(layout.cu_seqlens_padded != nullptr, what << ": layout.cu_seqlens_padded is a null pointer");
}

__global__ void gathered_rows_kernel(const int32_t* __restrict__ cu_seqlens_padded, int max_seqs, int64_t total_rows,
                                     int cp, int32_t* __restrict__ rows) {
  const int64_t global_row = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (global_row >= total_rows) return;
  const DualChunkLocation where = dual_chunk_locate_row(cu_seqlens_padded, max_seqs, cp, global_row);
  rows[global_row] = static_cast<int32_t>(where.rank * (total_rows / cp) + where.local_row);
}

// Copies word w of head `head` of row `row` of a strided view to its place in dense rows:
// one thread per word, consecutive threads on consecutive words of a head (coalesced reads
// within a head, coalesced writes throughout).
template <typename Word>
__global__ void __launch_bounds__(kThreads) pack_kernel(const unsigned char* __restrict__ src,
                                                      Word* __restrict__ dst, int64_t words, int64_t words_per_head,
                                                      int64_t heads, int64_t row_stride_bytes,
                                                      int64_t head_stride_bytes) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < words; i += step) {
    const int64_t pair = i / words_per_head;
    const int64_t word = i - pair * words_per_head;
    const int64_t row = pair / heads;
    const int64_t head = pair - row * heads;
    dst[i] = reinterpret_cast<const Word*>(src + row * row_stride_bytes + head * head_stride_bytes)[word];
  }
}

template <typename Word>
void launch_pack(const ConstThdTensor& src, void* dst, int64_t row_stride_bytes, int64_t head_stride_bytes,
                 cudaStream_t stream) {
  const int64_t words_per_head =
      src.head_dim * static_cast<int64_t>(dtype_size(src.dtype)) / static_cast<int64_t>(sizeof(Word));
  const int64_t words = src.tokens * src.heads * words_per_head;
  const int64_t blocks = std::min<int64_t>((words + kThreads - 1) / kThreads, 65536);
  pack_kernel<Word><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const unsigned char*>(src.data), static_cast<Word*>(dst), words, words_per_head, src.heads,
      row_stride_bytes, head_stride_bytes);
}

}  // namespace

void pack_rows(const ConstThdTensor& src, void* dst, cudaStream_t stream) {
  THDCP_CHECK(src.row_stride >= 0 && src.head_stride >= 0,
              "pack_rows: strides " << src.row_stride << ", " << src.head_stride << " must be >= 0");
  if (src.numel() == 0) return;
  const int64_t element = static_cast<int64_t>(dtype_size(src.dtype));
  // A dimension of one index never applies its stride.
  const int64_t row_bytes = src.tokens > 1 ? src.row_step() * element : 0;
  const int64_t head_bytes = src.heads > 1 ? src.head_step() * element : 0;
  const uint64_t alignment = reinterpret_cast<uintptr_t>(src.data) | reinterpret_cast<uintptr_t>(dst) |
                             static_cast<uint64_t>(row_bytes) | static_cast<uint64_t>(head_bytes) |
                             static_cast<uint64_t>(src.head_dim * element);
  if (alignment % 16 == 0) {
    launch_pack<uint4>(src, dst, row_bytes, head_bytes, stream);
  } else if (alignment % 8 == 0) {
    launch_pack<uint2>(src, dst, row_bytes, head_bytes, stream);
  } else if (alignment % 4 == 0) {
    launch_pack<uint32_t>(src, dst, row_bytes, head_bytes, stream);
  } else {
    THDCP_CHECK(alignment % 2 == 0, "pack_rows: src=" << src.data << " or dst=" << dst
                                                      << " is not aligned to the elements' 2 bytes");
    launch_pack<uint16_t>(src, dst, row_bytes, head_bytes, stream);
  }
  THDCP_CHECK_CUDA(cudaGetLastError());
}

void gathered_to_sequence_order(const void* gathered, void* ordered, size_t row_bytes, const DeviceLayout& layout,
                                int cp, cudaStream_t stream, size_t ordered_pitch) {
  check_reorder_layout(layout, cp, "gathered_to_sequence_order");
  THDCP_CHECK(row_bytes % 16 == 0, "row_bytes=" << row_bytes << " must be a multiple of 16");
  if (ordered_pitch == 0) ordered_pitch = row_bytes;
  THDCP_CHECK(ordered_pitch % 16 == 0 && ordered_pitch >= row_bytes,
              "ordered_pitch=" << ordered_pitch << " must be a multiple of 16 and at least row_bytes=" << row_bytes);
  THDCP_CHECK((reinterpret_cast<uintptr_t>(gathered) | reinterpret_cast<uintptr_t>(ordered)) % 16 == 0,
              "gathered_to_sequence_order: gathered and ordered must be 16-byte aligned");
  const int64_t words_per_row = static_cast<int64_t>(row_bytes / 16);
  const int64_t total_rows = layout.capacity.max_tokens;
  if (total_rows == 0 || words_per_row == 0) return;
  const int64_t blocks = (total_rows + kRowsPerBlock - 1) / kRowsPerBlock;
  reorder_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const uint4*>(gathered), static_cast<uint4*>(ordered), words_per_row,
      static_cast<int64_t>(ordered_pitch / 16), layout.cu_seqlens_padded, layout.capacity.max_seqs, total_rows, cp);
  THDCP_CHECK_CUDA(cudaGetLastError());
}

void reorder_rows(const void* src, void* dst, size_t row_bytes, int64_t planes, RowOrder to,
                  const DeviceLayout& layout, int cp, cudaStream_t stream) {
  check_reorder_layout(layout, cp, "reorder_rows");
  THDCP_CHECK(row_bytes % 4 == 0, "reorder_rows: row_bytes=" << row_bytes << " must be a multiple of 4");
  THDCP_CHECK(planes >= 0 && planes <= 65535, "reorder_rows: planes=" << planes << " must be in [0, 65535]");
  if (layout.capacity.max_tokens == 0 || row_bytes == 0 || planes == 0) return;
  const bool words16 = row_bytes % 16 == 0 && (reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) % 16 == 0;
  if (words16) {
    launch_reorder_planes<uint4>(src, dst, row_bytes, planes, to, layout, cp, stream);
  } else {
    launch_reorder_planes<uint32_t>(src, dst, row_bytes, planes, to, layout, cp, stream);
  }
  THDCP_CHECK_CUDA(cudaGetLastError());
}

void regroup_rows(const void* src, void* dst, size_t row_bytes, int64_t planes, GroupOrder to,
                  const DeviceLayout& layout, int cp, int members, int group, cudaStream_t stream) {
  check_reorder_layout(layout, cp, "regroup_rows");
  THDCP_CHECK(members >= 1 && cp % members == 0 && group >= 0 && group < cp / members,
              "regroup_rows: members=" << members << ", group=" << group << " with cp=" << cp
                                       << ": need members dividing cp and group in [0, cp / members)");
  THDCP_CHECK(row_bytes % 4 == 0, "regroup_rows: row_bytes=" << row_bytes << " must be a multiple of 4");
  THDCP_CHECK(planes >= 0 && planes <= 65535, "regroup_rows: planes=" << planes << " must be in [0, 65535]");
  if (layout.capacity.max_tokens == 0 || row_bytes == 0 || planes == 0) return;
  const bool words16 = row_bytes % 16 == 0 && (reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) % 16 == 0;
  if (words16) {
    launch_regroup_planes<uint4>(src, dst, row_bytes, planes, to, layout, cp, members, group, stream);
  } else {
    launch_regroup_planes<uint32_t>(src, dst, row_bytes, planes, to, layout, cp, members, group, stream);
  }
  THDCP_CHECK_CUDA(cudaGetLastError());
}

void accumulate(const float* src, float* dst, int64_t n, bool src_first, cudaStream_t stream) {
  THDCP_CHECK(n >= 0, "accumulate: n=" << n << " must be >= 0");
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 65536);
  accumulate_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(src, dst, n, src_first);
  THDCP_CHECK_CUDA(cudaGetLastError());
}

void convert_to_fp32(const void* src, DType dtype, float* dst, int64_t n, cudaStream_t stream) {
  THDCP_CHECK(dtype == DType::kBFloat16 || dtype == DType::kFloat16,
              "convert_to_fp32 of " << dtype_name(dtype) << ": takes bf16 or fp16");
  THDCP_CHECK(n >= 0, "convert_to_fp32: n=" << n << " must be >= 0");
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 65536);
  if (dtype == DType::kBFloat16) {
    widen_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(src), dst, n);
  } else {
    widen_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(static_cast<const __half*>(src), dst, n);
  }
  THDCP_CHECK_CUDA(cudaGetLastError());
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

void gathered_rows_of_sequence(const DeviceLayout& layout, int cp, int32_t* rows, cudaStream_t stream) {
  check_reorder_layout(layout, cp, "gathered_rows_of_sequence");
  const int64_t total_rows = layout.capacity.max_tokens;
  const int max_seqs = layout.capacity.max_seqs;
  const int32_t* cu_seqlens_padded = layout.cu_seqlens_padded;
  if (total_rows == 0) return;
  const int64_t blocks = (total_rows + kThreads - 1) / kThreads;
  gathered_rows_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(cu_seqlens_padded, max_seqs,
                                                                               total_rows, cp, rows);
  THDCP_CHECK_CUDA(cudaGetLastError());
}

}  // namespace thdcp::cuda
