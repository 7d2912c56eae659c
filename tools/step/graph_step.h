// One training-like step of L layers on one rank, for `thdcp run --graph` and
// `thdcp bench --graph`: per layer, RoPE on the local Q and K, AllGather-CP attention
// forward; then, layer by layer in reverse, the attention backward and the RoPE backward on
// dQ and dK. Its buffers are the GraphBank's (static, shared by nothing else), its plans are
// made per capacity on first use (the warm-up), and work() is what the bank captures.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "step/host_step.h"
#include "thdcp/cp/cuda.h"
#include "thdcp/cuda/rope.h"
#include "thdcp/graph/graph_bank.h"
#include "thdcp/graph/workspace_arena.h"

namespace thdcp::tools {

// The heads and dtype of every layer (StepShape), and the step's layers, mask and RoPE.
struct GraphStepShape : StepShape {
  int layers = 1;
  Mask mask = Mask::causal();
  cp::CpComm cp_comm = cp::CpComm::kAllGather;  // every CP size's
  int a2a_size = 1;                             // a2a+ag's all-to-all group
  bool rope = true;
  RopeConfig rope_config;
};

class GraphStep {
 public:
  // Buffers for up to max_tokens global rows (max_tokens / cp local rows per layer) from
  // the bank under `capacity` (each capacity of one max_tokens shares them through the
  // bank's names). The CP plans' workspaces: one per capacity from the bank, or with `arena`
  // the arena's (reserved here for each capacity the bank has, and its fallback capacity:
  // add the bank's capacities first).
  GraphStep(graph::GraphBank& bank, const GraphStepShape& shape, int64_t max_tokens,
            graph::WorkspaceArena* arena = nullptr);

  // Fills every layer's Q, K, V and dO of this rank with N(0,1) values of `seed`
  // (synchronous; not during a capture) and poisons nothing.
  void load_inputs(uint64_t seed, cudaStream_t stream);
  // The same inputs as the last load_inputs(), again (RoPE rotates Q and K in place).
  void reload_inputs(cudaStream_t stream);

  graph::Work work();

  // Every output of every layer (out, lse, dq, dk, dv), downloaded (synchronises `stream`).
  std::vector<unsigned char> download_outputs(cudaStream_t stream) const;

 private:
  struct Layer {
    ThdTensor q, k, v, out, dout, dq, dk, dv;  // [rows_, H, D]
    float* lse;                                // [Hq, rows_]
  };
  cp::Problem cp_problem_at(const Capacity& capacity) const;
  cp::CudaPlan& cp_plan(const Capacity& capacity);
  const cuda::RopePlan& rope_plan(const Capacity& capacity);

  graph::GraphBank& bank_;
  graph::WorkspaceArena* arena_;
  GraphStepShape shape_;
  int64_t max_tokens_, rows_;
  std::vector<Layer> layers_;
  float* max_logit_ = nullptr;
  std::vector<std::vector<unsigned char>> inputs_;  // host copies of q, k, v, dout per layer
  std::map<Capacity, std::unique_ptr<cp::CudaPlan>> cp_plans_;
  std::map<Capacity, std::unique_ptr<cuda::RopePlan>> rope_plans_;
};

}  // namespace thdcp::tools
