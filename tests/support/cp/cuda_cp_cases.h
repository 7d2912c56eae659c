// The edge-case table of the CUDA CP tests (STYLE.md: lengths 0 and 1, not multiples of
// 2*cp, one sequence filling the capacity, exactly max_seqs - 1 sequences, a window wider
// than a chunk, full, causal, GQA 1/4/8, bf16 and fp16), shared by the shared-GPU, NCCL and
// MPI tests, and the check of one rank's outputs against the CPU reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "support/cp/cuda_cp_rank.h"
#include "support/gpu_tolerance.h"
#include "support/shape.h"
#include "thdcp/comm_device/shared_gpu.h"

namespace thdcp::test {

struct EdgeCase {
  const char* name;
  std::vector<int64_t> lengths;  // documents; -1: one sequence filling the capacity
  int extra_seqs;                // placeholders beyond the reserved one (0: exactly max_seqs - 1 documents)
  Mask mask;
  int q_heads, kv_heads, head_dim;
  DType dtype;
  int v_head_dim = 0;  // D_v; 0: head_dim

  Shape shape() const { return Shape{dtype, q_heads, kv_heads, head_dim, mask, v_head_dim}; }
};

const std::vector<EdgeCase>& edge_cases();

// A batch of `c` for `cp` in capacity form under `layout` (dual chunk: every document padded
// to a multiple of 2*cp; contiguous: no padding but the last placeholder's); `seed` varies
// the data and (for the replay batch) the lengths, keeping the capacity.
Batch make_case_batch(const EdgeCase& c, int cp, const Capacity& capacity, uint64_t seed, bool shuffle,
                      CpLayout layout = CpLayout::kDualChunk);

// The capacity of `c` at `cp` (the dual-chunk layout's; it holds the contiguous one too).
Capacity capacity_of(const EdgeCase& c, int cp);

// One rank's outputs against its rows (under `layout`) of `ref`, the single-device CPU
// result on the batch `b`.
// (reduced: dk and dv of a step whose reduce-scatter ran in the storage dtype, held to
// gpu_reduced_grad_tolerance.)
void expect_matches_reference(const Outputs& o, const Outputs& ref, const Batch& b, int cp, int rank,
                              CpLayout layout = CpLayout::kDualChunk, bool reduced = false);

void expect_matches_reference(const Outputs& o, const Batch& b, const Mask& mask, int cp, int rank,
                              CpLayout layout = CpLayout::kDualChunk, bool reduced = false);

// a2a_size: a2a+ag's all-to-all group (other comms: 1).
cp::Problem problem_of(const EdgeCase& c, int cp, CpLayout layout = CpLayout::kDualChunk,
                       cp::CpComm comm = cp::CpComm::kAllGather, int a2a_size = 1);

// `c` with heads `comm` can run at `cp`: all_to_all needs both head counts multiples of cp,
// so it gets kv_heads = cp and the case's GQA ratio; a2a+ag the same with a2a_size in place
// of cp; all_gather keeps them.
// head_slices: both head counts times it (each slice of a rank's heads takes as many; under
// all_gather, one key head per slice).
EdgeCase heads_for(const EdgeCase& c, int cp, cp::CpComm comm, int a2a_size = 1, int head_slices = 1);

// One rank of an edge case over a communicator whose ranks capture their own streams (NCCL:
// a thread or a process per GPU): the eager step on a first batch against the CPU
// reference, then this rank's step captured (`mode`), replayed on a second batch of the same
// capacity, and compared bit for bit with the eager step on that batch.
void check_edge_case_with_own_capture(DeviceCommunicator& comm, int index, cudaStreamCaptureMode mode,
                                      CpLayout layout = CpLayout::kDualChunk,
                                      cp::CpComm cp_comm = cp::CpComm::kAllGather, int a2a_size = 1);

// Edge case `index` under (layout, comm) at `cp` ranks of a shared-GPU group (`options`:
// every rank on one GPU, or a GPU each, SharedGpuOptions::devices): every rank's eager step
// against the CPU reference on two batches, and the step of every rank captured in one graph
// (rank 0's global-mode capture, every rank's stream joined to it) and replayed on the second
// batch equal to its eager step, bit for bit.
// reduce_dtype: cp::Problem::reduce_dtype (dk and dv then held to the reduced tolerance).
// head_slices: cp::Problem::head_slices (all_to_all; both head counts then times it).
void expect_group_case(CpLayout layout, cp::CpComm cp_comm, int cp, int index,
                       cp::KvGather gather = cp::KvGather::kAuto, int a2a_size = 1,
                       const SharedGpuOptions& options = {}, DType reduce_dtype = DType::kFloat32,
                       int head_slices = 1);

// The name of a CP communication in test names: "" for all_gather (the default), "all_to_all_".
std::string comm_prefix(cp::CpComm comm);

// The name of a CP layout in test names: "" for dual chunk (the default), "contiguous_".
std::string layout_prefix(CpLayout layout);

}  // namespace thdcp::test
