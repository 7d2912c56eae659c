// The head exchange of all-to-all CP on the GPU, shared by all_to_all (one group of cp ranks:
// alltoall_cuda.h) and a2a+ag (groups of a2a_size consecutive ranks: a2a_ag_cuda.h); the CUDA
// counterpart of HeadExchange (alltoall_cpu.h).
//
// The `members` ranks of group g (ranks [g members, (g+1) members) of cp) each hold their
// local rows of every head ([T/cp, H, D]). An all-to-all over the group gives member m every
// row of the group, rank g's rows of the layout at cp / members ([T / (cp / members),
// H/members, D]: the heads [m H/members, (m+1) H/members)), in that rank's local order; the
// inverse returns them. all_to_all: one group of cp members, whose rows are the whole batch
// in sequence order. Where the layout is dual chunk, the all-to-all's member-major rows are
// put in that order by a reorder kernel; contiguous pieces arrive in it already.
//
// Everything runs on the step's stream: 2-D copies and one reorder kernel around each
// all-to-all, nothing allocated or read back, so a step can be captured.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>

#include "thdcp/comm_device/device_communicator.h"
#include "thdcp/core/workspace.h"
#include "thdcp/cp/cp.h"
#include "thdcp/plan/layout.h"

namespace thdcp::cp::detail {

// Called where the next phase's work starts (timing; may do nothing).
using PhaseMark = std::function<void(Phase)>;

// The exchange's part of a workspace: the group's rows of this member's heads.
struct ExchangeParts {
  unsigned char* send = nullptr;  // one exchange's blocks (up to fp32 rows of the widest
  unsigned char* recv = nullptr;  // head-sharded tensor)
  unsigned char* q = nullptr;     // head-sharded [rows, H/members, D] in the group's order, the
  unsigned char* k = nullptr;     // problem's dtype
  unsigned char* v = nullptr;
  unsigned char* out = nullptr;
  unsigned char* dout = nullptr;
  float* lse = nullptr;           // [Hq/members, rows], the group's order
  float* lse_ranked = nullptr;    // [Hq/members, rows], member-major (dual chunk only)
  float* dq = nullptr;            // head-sharded, fp32 or the problem's dtype, the group's order
  float* dk = nullptr;
  float* dv = nullptr;
  float* max_logit = nullptr;     // [Hq/members]
  float* dsinks = nullptr;        // [Hq/members]
};

// Carves the exchange of groups of `members` ranks; `carver` without memory sizes it.
ExchangeParts carve_exchange(WorkspaceCarver& carver, const Problem& p, int members);

class CudaHeadExchange {
 public:
  // `comm`: this rank's group (`members` ranks: comm.size()); `group`: its index among the
  // cp / members groups; `slices`: this member's heads are exchanged in that many slices of
  // as many query and key heads each (1: all at once). `p` validated by the caller (heads
  // multiples of members * slices).
  CudaHeadExchange(DeviceCommunicator& comm, const Problem& p, int group, const ExchangeParts& parts, int slices = 1);

  // The step about to be enqueued: its layout, and the stream the exchanges run on.
  void start(const DeviceLayout& layout, cudaStream_t stream);

  DeviceCommunicator& comm() const { return comm_; }  // the group
  int member() const { return comm_.rank(); }
  int64_t rows() const { return rows_; }        // the group's rows
  int64_t q_heads() const { return q_heads_; }  // this member's share
  int64_t kv_heads() const { return kv_heads_; }
  int slices() const { return slices_; }
  const ExchangeParts& parts() const { return w_; }

  // A dense [rows(), heads, head_dim] tensor at `data`.
  ThdTensor dense(void* data, DType dtype, int64_t heads, int64_t head_dim) const;

  // The forward's tensors of slice `s` of this member's heads: q, k, v exchanged into the
  // parts; out, lse, max_logit (where t has one) in the parts; the slice's sinks (where t has
  // them). The parts hold each tensor slice after slice, each slice dense [rows(), heads of
  // the slice, D] (lse [heads of the slice, rows()]).
  ForwardTensors forward_to_heads(const ForwardTensors& t, int s = 0);
  // The slice's results back to this rank's rows: out and lse exchanged.
  void forward_to_rows(const ForwardTensors& heads, const ForwardTensors& t, int s = 0);
  // Once every slice is back: max_logit all-gathered over the group in head order (each
  // head's is whole on the member that holds it), where t has one.
  void gather_max_logit(const ForwardTensors& t);

  // The backward's tensors of slice `s`: q, k, v, out, dout and lse exchanged into the parts
  // (`kept`: dout only, q, k, v, out and lse being the last forward's, still in the parts); dq
  // in `dq_dtype` (fp32 or the problem's: what the attention behind the exchange writes), dk
  // and dv fp32, in the parts; the slice's sinks and d(sink) (where t has them).
  BackwardTensors backward_to_heads(const BackwardTensors& t, DType dq_dtype, bool kept, int s = 0);
  // The slice's dq, dk, dv back to this rank's rows (fp32 rounded once, before the exchange).
  void backward_to_rows(const BackwardTensors& heads, const BackwardTensors& t, int s = 0);
  // Once every slice is back: d(sink) all-gathered over the group, where t has it.
  void gather_dsinks(const BackwardTensors& t);

 private:
  // This rank's rows of `local` ([T/cp, H, D], any view) -> the group's rows of the heads
  // [first, first + count) of every member's H/members, dense at `rows` in the group's order.
  ConstThdTensor to_heads(const ConstThdTensor& local, unsigned char* rows, int64_t first, int64_t count);
  // The inverse: `heads` (dense [rows(), count, D], the group's order; the local dtype or
  // fp32) -> this rank's rows of those heads of every member, into `local` (any view); fp32
  // heads bound for a 16-bit `local` are rounded once, before the exchange.
  void to_rows(const ConstThdTensor& heads, ThdTensor local, int64_t first);
  // lse planes [first, first + count) of this member's heads ([count, rows()] at `heads`) ->
  // lse [Hq, T/cp] of this rank's rows; and the inverse.
  void lse_to_rows(const float* heads, float* local, int64_t first, int64_t count);
  void lse_to_heads(const float* local, float* heads, int64_t first, int64_t count);
  // Slice s of a part holding `heads_per_slice` heads of `head_dim` elements per row.
  unsigned char* slice_of(void* part, int s, int64_t heads_per_slice, int64_t head_dim, size_t element) const;

  // Member-major rows (what the all-to-all gives) <-> the group's order, `planes` planes of
  // rows() rows each.
  void to_group_order(const void* members_rows, void* group_rows, size_t row_bytes, int64_t planes);
  void to_member_order(const void* group_rows, void* members_rows, size_t row_bytes, int64_t planes);

  DeviceCommunicator& comm_;
  Problem p_;
  ExchangeParts w_;
  int members_, group_, slices_;
  bool reorder_;  // dual chunk: the member-major rows are not in the group's order
  int64_t local_rows_, rows_, q_heads_, kv_heads_;
  int64_t q_slice_, kv_slice_;  // heads per slice
  DeviceLayout layout_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace thdcp::cp::detail
