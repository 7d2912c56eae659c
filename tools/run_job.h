// The main job of `thdcp run`: a packed batch through AllGather CP, forward and backward,
// checked against the single-device reference.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "thdcp/attention.h"
#include "thdcp/comm.h"
#include "thdcp/compare.h"
#include "thdcp/cp.h"
#include "thdcp/layout.h"
#include "thdcp/mask.h"
#include "thdcp/tensor.h"

namespace thdcp::tools {

struct RunConfig {
  int cp = 4;
  uint64_t seed = 1234;
  Mask mask = Mask::causal();
  int64_t q_heads = 8;
  int64_t kv_heads = 2;
  int64_t head_dim = 64;
  DType dtype = DType::kBFloat16;
  int64_t tokens = 16384;
  int threads = 0;
  bool check = true;
};

// A batch in the global (unsplit) layout.
struct GlobalBatch {
  std::vector<int64_t> lengths;
  BatchLayout layout;
  HostTensor q, k, v, dout;
};

// Outputs in the global layout.
struct GlobalOutputs {
  HostTensor out, dq, dk, dv;
  std::vector<float> lse;        // [Hq, T]
  std::vector<float> max_logit;  // [Hq]
};

struct TensorCheck {
  std::string name;
  Comparison comparison;
};

struct RunReport {
  RunConfig config;
  std::string communicator;
  int64_t rows = 0, valid_tokens = 0, documents = 0, longest = 0;
  std::vector<int64_t> rank_valid_tokens;
  std::vector<int64_t> rank_pairs;
  int64_t total_pairs = 0;
  double reference_forward_s = 0, reference_backward_s = 0;
  double cp_forward_s = 0, cp_backward_s = 0;  // wall time of the whole group
  cp::Timings forward_phases, backward_phases;  // slowest rank per phase
  std::vector<TensorCheck> checks;
  bool checked = false;
  bool passed() const;
};

GlobalBatch make_default_batch(const RunConfig& config);

// Runs the job with every rank a thread of this process.
RunReport run_in_process_job(const RunConfig& config, const GlobalBatch& batch);

// Runs this process's rank of the job over `comm` (e.g. MPI); every rank builds the same
// batch. The report is complete on rank 0 (the others hold their own timings).
RunReport run_rank_job(Communicator& comm, const RunConfig& config, const GlobalBatch& batch);

}  // namespace thdcp::tools
