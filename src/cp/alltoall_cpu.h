// All-to-all (Ulysses) CP on the CPU backend (Problem::comm == CpComm::kAllToAll), for either
// CP layout of the local rows.
//
// Forward on rank r: an all-to-all turns the sequence-sharded q, k, v ([T/cp, H, D], the
// layout's rows) into head-sharded ones ([T, H/cp, D] in sequence order: every row of the
// heads [r H/cp, (r+1) H/cp)); attention runs over whole documents (the single-device segment
// table) with those heads; a second all-to-all returns out and lse to the rank's rows, and
// an all-gather assembles max_logit. Backward: q, k, v, out, dout and lse go head-sharded the
// same way, the reference backward gives fp32 dQ/dK/dV of the rank's heads, and an all-to-all
// returns them to the rank's rows, rounded once. No partial sums cross ranks: each head's
// rows, sink and d(sink) belong to one rank.
#pragma once

#include <cstdint>
#include <vector>

#include "thdcp/comm/communicator.h"
#include "thdcp/cp/cp.h"

namespace thdcp::cp::detail {

// Host buffers of the all-to-all steps (grown on first use, then reused).
struct AllToAllBuffers {
  std::vector<unsigned char> send, recv;          // one all-to-all's blocks
  std::vector<unsigned char> q, k, v, out, dout;  // head-sharded, sequence order, the problem's dtype
  std::vector<float> lse, dq, dk, dv;             // head-sharded, sequence order, fp32
  std::vector<float> max_logit, dsinks;           // this rank's heads
};

// `buffer` holding at least `count` elements (grown, never shrunk), and its data.
template <typename T>
T* grown(std::vector<T>& buffer, size_t count) {
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

// A dense [rows, heads, head_dim] tensor over `storage` (grown): of `dtype`, or fp32.
inline ThdTensor dense(std::vector<unsigned char>& storage, DType dtype, int64_t rows, int64_t heads,
                       int64_t head_dim) {
  return ThdTensor{grown(storage, static_cast<size_t>(rows * heads * head_dim) * dtype_size(dtype)), dtype, rows,
                   heads, head_dim};
}
inline ThdTensor dense(std::vector<float>& storage, int64_t rows, int64_t heads, int64_t head_dim) {
  return ThdTensor{grown(storage, static_cast<size_t>(rows * heads * head_dim)), DType::kFloat32, rows, heads,
                   head_dim};
}

// The exchanges between a group's rows and its heads, over `comm` (the group; g ranks). Each
// rank holds `local_rows` rows of every head; the head-sharded side holds `rows` rows (g *
// local_rows) of H/g heads: rank r takes the heads [r H/g, (r+1) H/g). maps[r][i] is the row
// of the head-sharded tensor that local row i of rank r goes to (g maps, a permutation of
// [0, rows) together). Block r of a send buffer is what rank r receives; rows move in the
// order of rank r's local rows, so the receiver places them by maps[r].
class HeadExchange {
 public:
  HeadExchange(Communicator& comm, AllToAllBuffers& buffers, int64_t local_rows, int64_t rows,
               std::vector<std::vector<int32_t>> maps);

  // This rank's rows of `local` ([local_rows, H, D], any view) -> every row of this rank's H/g
  // heads, dense [rows, H/g, D] at `seq` (grown), in local's dtype.
  ConstThdTensor to_heads(const ConstThdTensor& local, std::vector<unsigned char>& seq);

  // The inverse of to_heads: this rank's heads `seq` ([rows, H/g, D] dense, in local's dtype
  // or fp32) -> this rank's rows of every head, into `local` (any view), rounded once to
  // local's dtype.
  void to_rows(const ConstThdTensor& seq, ThdTensor local);

  // lse [Hq, local_rows] of this rank's rows -> [Hq/g, rows] of this rank's heads (into
  // `seq`, grown). Block r of the local lse (heads [r Hq/g, (r+1) Hq/g)) is already what rank
  // r receives.
  const float* lse_to_heads(const float* local, int64_t q_heads, std::vector<float>& seq);

  // The inverse: [Hq/g, rows] of this rank's heads -> lse [Hq, local_rows] of its rows.
  void lse_to_rows(const float* seq, int64_t q_heads, float* local);

 private:
  // One all-to-all of `heads` heads of head_dim elements per row: a block per rank of the
  // local rows, and the send and receive buffers sized for g blocks.
  struct Blocks {
    size_t head_bytes, row_bytes, block;
    unsigned char *send, *recv;
  };
  Blocks blocks(int64_t heads, int64_t head_dim, size_t element);

  Communicator& comm_;
  int cp_;  // g: the ranks of the group
  int64_t local_rows_, rows_;
  AllToAllBuffers& b_;
  std::vector<std::vector<int32_t>> maps_;
};

// The backward tensors of a step with their heads exchanged: t's q, k, v, out, dout and lse
// turned to `exchange`'s heads (into b's buffers), and b's fp32 dq, dk, dv of `rows` rows,
// `heads` query and `kv_heads` key heads; sinks and dsinks left to the caller.
BackwardTensors backward_to_heads(HeadExchange& exchange, const BackwardTensors& t, const Problem& p,
                                  AllToAllBuffers& b, int64_t rows, int64_t heads, int64_t kv_heads);

// One step on this rank; the plan has checked the problem, the layout and the tensors.
void all_to_all_forward(Communicator& comm, const Problem& problem, const AttentionOptions& options,
                        AllToAllBuffers& buffers, const LayoutView& layout, const ForwardTensors& tensors,
                        Timings* timings);
void all_to_all_backward(Communicator& comm, const Problem& problem, const AttentionOptions& options,
                         AllToAllBuffers& buffers, const LayoutView& layout, const BackwardTensors& tensors,
                         Timings* timings);

}  // namespace thdcp::cp::detail
