#include "support/cp/cuda_cp_cases.h"

#include "thdcp/comm_device/shared_gpu.h"

namespace thdcp::test {

const std::vector<EdgeCase>& edge_cases() {
  static const std::vector<EdgeCase> cases = {
      {"short_and_empty_causal_gqa4_bf16", {0, 1, 17, 37, 300, 2}, 2, Mask::causal(), 8, 2, 64, DType::kBFloat16},
      {"one_sequence_fills_capacity_fp16", {-1}, 0, Mask::causal(), 4, 4, 128, DType::kFloat16},
      {"max_seqs_minus_one_full_gqa8_bf16", {130, 7, 64, 1, 95, 33, 12}, 0, Mask::full(), 8, 1, 128, DType::kBFloat16},
      {"window_wider_than_chunk_fp16", {1500, 700, 3}, 1, Mask::window(1000, 0), 8, 2, 64, DType::kFloat16},
      {"window_both_sides_gqa1_bf16", {400, 250, 9}, 1, Mask::window(64, 200), 4, 4, 128, DType::kBFloat16},
      {"small_window_gqa8_fp16", {333, 21, 160}, 1, Mask::window(16, 16), 8, 1, 64, DType::kFloat16},
  };
  return cases;
}

Batch make_case_batch(const EdgeCase& c, int cp, const Capacity& capacity, uint64_t seed, bool shuffle,
                      CpLayout layout) {
  std::vector<int64_t> lengths = c.lengths;
  if (lengths.size() == 1 && lengths[0] < 0) {
    lengths[0] = capacity.max_tokens - (shuffle ? 2 * cp + 3 : 0);  // fills the capacity (or nearly)
  } else if (shuffle) {
    std::reverse(lengths.begin(), lengths.end());
    for (int64_t& n : lengths) n = n > 3 ? n - 3 : n;
  }
  const BatchLayout rows = layout == CpLayout::kDualChunk ? make_layout(lengths, cp, capacity)
                                                         : make_contiguous_layout(lengths, cp, capacity);
  return make_batch(rows, c.shape(), seed);
}

Capacity capacity_of(const EdgeCase& c, int cp) {
  int64_t rows = 0;
  int docs = 0;
  for (int64_t n : c.lengths) {
    rows += n < 0 ? 3000 : cp_padded_length(n, cp);
    ++docs;
  }
  if (c.lengths.size() == 1 && c.lengths[0] < 0) rows = cp_padded_length(3000, cp);
  const int64_t slack = c.extra_seqs > 0 ? 8 * cp : 0;
  return Capacity{docs + 1 + c.extra_seqs, rows + slack};
}

void expect_matches_reference(const Outputs& o, const Outputs& ref, const Batch& b, int cp, int rank,
                              CpLayout layout, bool reduced) {
  SCOPED_TRACE(std::string(cp_layout_name(layout)) + " cp " + std::to_string(cp) + " rank " + std::to_string(rank));
  expect_gpu_close(o, local_outputs(ref, b.layout.view(), cp, rank, layout), b.q.dtype(), reduced ? cp : 0);
}

void expect_matches_reference(const Outputs& o, const Batch& b, const Mask& mask, int cp, int rank,
                              CpLayout layout, bool reduced) {
  expect_matches_reference(o, single_device(b, mask, AttentionOptions{}), b, cp, rank, layout, reduced);
}

cp::Problem problem_of(const EdgeCase& c, int cp, CpLayout layout, cp::CpComm comm, int a2a_size) {
  cp::Problem problem = cp_problem(cp, capacity_of(c, cp), c.shape());
  problem.layout = layout;
  problem.comm = comm;
  problem.a2a_size = a2a_size;
  return problem;
}

EdgeCase heads_for(const EdgeCase& c, int cp, cp::CpComm comm, int a2a_size, int head_slices) {
  EdgeCase out = c;
  // all_gather with head slices: one key head per slice (the case's GQA ratio kept).
  const int shards = comm == cp::CpComm::kAllToAll ? cp
                     : comm == cp::CpComm::kA2aAg  ? a2a_size
                     : head_slices > 1             ? 1
                                                   : 0;
  if (shards > 0) {
    out.kv_heads = shards * head_slices;
    out.q_heads = c.q_heads / c.kv_heads * out.kv_heads;
  }
  return out;
}

std::string comm_prefix(cp::CpComm comm) {
  return comm == cp::CpComm::kAllGather ? "" : std::string(cp::cp_comm_name(comm)) + "_";
}

std::string layout_prefix(CpLayout layout) {
  return layout == CpLayout::kDualChunk ? "" : std::string(cp_layout_name(layout)) + "_";
}

void check_edge_case_with_own_capture(DeviceCommunicator& comm, int index, cudaStreamCaptureMode mode,
                                      CpLayout layout, cp::CpComm cp_comm, int a2a_size) {
  const int cp = comm.size(), rank = comm.rank();
  const EdgeCase c = heads_for(edge_cases()[static_cast<size_t>(index)], cp, cp_comm, a2a_size);
  const cp::Problem problem = problem_of(c, cp, layout, cp_comm, a2a_size);
  const Batch first = make_case_batch(c, cp, problem.capacity, 1000 + index * 10 + cp, false, layout);
  const Batch second = make_case_batch(c, cp, problem.capacity, 2000 + index * 10 + cp, true, layout);
  CudaCpRank state(comm, problem);
  comm.warm_up(state.stream());
  expect_matches_reference(state.run(first), first, c.mask, cp, rank, layout);

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  THDCP_CHECK_CUDA(cudaStreamBeginCapture(state.stream(), mode));
  state.step(state.stream());
  THDCP_CHECK_CUDA(cudaStreamEndCapture(state.stream(), &graph));
  THDCP_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  state.load(second);
  THDCP_CHECK_CUDA(cudaGraphLaunch(exec, state.stream()));
  const Outputs replayed = state.download();
  const Outputs eager = state.run(second);
  expect_matches_reference(eager, second, c.mask, cp, rank, layout);
  EXPECT_TRUE(identical(replayed, eager)) << c.name << ": graph replay vs eager, rank " << rank;
  THDCP_CHECK_CUDA(cudaGraphExecDestroy(exec));
  THDCP_CHECK_CUDA(cudaGraphDestroy(graph));
}

void expect_group_case(CpLayout layout, cp::CpComm cp_comm, int cp, int index, cp::KvGather gather, int a2a_size,
                       const SharedGpuOptions& options, DType reduce_dtype, int head_slices) {
  const EdgeCase c = heads_for(edge_cases()[static_cast<size_t>(index)], cp, cp_comm, a2a_size, head_slices);
  const Capacity capacity = capacity_of(c, cp);
  const Batch first = make_case_batch(c, cp, capacity, 1000 + index * 10 + cp, false, layout);
  const Batch second = make_case_batch(c, cp, capacity, 2000 + index * 10 + cp, true, layout);
  cp::Problem problem = problem_of(c, cp, layout, cp_comm, a2a_size);
  problem.kv_gather = gather;
  problem.reduce_dtype = reduce_dtype;
  problem.head_slices = head_slices;
  const bool reduced = reduce_dtype != DType::kFloat32;

  std::vector<Outputs> eager_first(cp), eager_second(cp), replayed(cp);
  ThreadBarrier barrier(cp);
  cudaStream_t origin = nullptr;
  cudaEvent_t fork = nullptr;
  std::vector<cudaEvent_t> joins(static_cast<size_t>(cp));
  // origin and fork on rank 0's GPU, each rank's join on its own (an event is recorded on a
  // stream of its device).
  for (int rank = cp - 1; rank >= 0; --rank) {
    THDCP_CHECK_CUDA(cudaSetDevice(options.devices.empty() ? options.device : options.devices[static_cast<size_t>(rank)]));
    THDCP_CHECK_CUDA(cudaEventCreateWithFlags(&joins[static_cast<size_t>(rank)], cudaEventDisableTiming));
  }
  THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&origin, cudaStreamNonBlocking));
  THDCP_CHECK_CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;

  run_shared_gpu(cp, [&](DeviceCommunicator& comm) {
    const int rank = comm.rank();
    CudaCpRank state(comm, problem);
    eager_first[rank] = state.run(first);

    // One graph holds the step of every rank: rank 0's thread starts a global-mode capture
    // on `origin`, every rank's stream joins it through `fork`, and `origin` joins them back.
    barrier.wait();
    if (rank == 0) {
      THDCP_CHECK_CUDA(cudaStreamBeginCapture(origin, cudaStreamCaptureModeGlobal));
      THDCP_CHECK_CUDA(cudaEventRecord(fork, origin));
    }
    barrier.wait();
    THDCP_CHECK_CUDA(cudaStreamWaitEvent(state.stream(), fork, 0));
    state.step(state.stream());
    THDCP_CHECK_CUDA(cudaEventRecord(joins[rank], state.stream()));
    barrier.wait();
    if (rank == 0) {
      for (cudaEvent_t e : joins) THDCP_CHECK_CUDA(cudaStreamWaitEvent(origin, e, 0));
      THDCP_CHECK_CUDA(cudaStreamEndCapture(origin, &graph));
      THDCP_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    }
    barrier.wait();

    state.load(second);  // new lengths and data, same capacity, outputs poisoned
    barrier.wait();
    if (rank == 0) {
      THDCP_CHECK_CUDA(cudaGraphLaunch(exec, origin));
      THDCP_CHECK_CUDA(cudaStreamSynchronize(origin));
    }
    barrier.wait();
    replayed[rank] = state.download();

    eager_second[rank] = state.run(second);
  }, options);

  for (int rank = 0; rank < cp; ++rank) {
    expect_matches_reference(eager_first[rank], first, c.mask, cp, rank, layout, reduced);
    expect_matches_reference(eager_second[rank], second, c.mask, cp, rank, layout, reduced);
    EXPECT_TRUE(identical(replayed[rank], eager_second[rank])) << "graph replay vs eager, rank " << rank;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  for (cudaEvent_t e : joins) cudaEventDestroy(e);
  cudaEventDestroy(fork);
  cudaStreamDestroy(origin);
}

}  // namespace thdcp::test
