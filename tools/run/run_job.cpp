#include "run/run_job.h"

#include <unistd.h>

#include "io/args.h"
#include "io/memory_budget.h"
#include "io/progress.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <utility>

#include "step/rank_rows.h"
#include "run/rank_agreement.h"
#include "run/run_inputs.h"
#include "thdcp/plan/rank_split.h"
#include "thdcp/plan/segment_table.h"
#include "thdcp/testing/workload.h"

namespace thdcp::tools {

namespace {

using Clock = std::chrono::steady_clock;

AttentionOptions attention_options(const RunConfig& config, int threads) {
  AttentionOptions options;
  options.num_threads = threads;
  return options;
}

}  // namespace

double estimate_host_bytes(const RunConfig& c, const RunSize& size, bool process_per_rank) {
  // The larger of D_qk and D_v for every tensor: an upper bound.
  const double d = static_cast<double>(std::max(c.head_dim, c.step_shape().value_head_dim()));
  const double e = static_cast<double>(dtype_size(c.dtype));
  const auto q_bytes = [&](int64_t rows) { return static_cast<double>(rows) * static_cast<double>(c.q_heads) * d * e; };
  const double t = static_cast<double>(size.rows);
  const double q = q_bytes(size.rows);                               // one [T, Hq, D] tensor
  const double kv = t * static_cast<double>(c.kv_heads) * d * e;     // one [T, Hkv, D] tensor
  const double lse = t * static_cast<double>(c.q_heads) * 4;
  const double inputs = 2 * q + 2 * kv;            // q, dout, k, v
  const double outputs = 2 * q + 2 * kv + lse;     // out, dq, dk, dv, lse
  const double reference = c.check == CheckMode::kNever ? 0 : outputs;
  const double kv_f32 = kv / e * 4;
  // Per rank: K and V gathered and in sequence order (storage dtype), dK/dV fp32 partial sums
  // in sequence and rank order; on the CUDA backend these are device memory.
  const double cp_buffers = c.backend == Backend::kCuda ? 0 : 4 * kv + 4 * kv_f32;
  const int ranks_here = process_per_rank ? 1 : c.cp;
  const double locals = (inputs + outputs) / c.cp * ranks_here;  // each rank's split copy
  // Per row: where it came from (int32), and each rank's row maps of the whole gathered T.
  const double row_maps = t * (4 + 16.0 * ranks_here);
  // Per sequence: offsets and lengths in the user's and the job's layout, the global segment
  // table (32-byte segments) and, on every rank, two segments and its plan's per-sequence
  // state (measured: about 110 bytes per sequence and rank).
  const double per_sequence = static_cast<double>(size.sequences) * (96 + 128.0 * ranks_here);
  const double run = inputs + outputs + reference + locals + ranks_here * cp_buffers + row_maps + per_sequence;
  // --load: while the files are read, the job's inputs exist beside one file's tensor in its
  // own layout and the offsets (raw, then as int64, both files).
  const double loading = inputs + q_bytes(size.loaded_rows) + 32.0 * static_cast<double>(size.offsets) + per_sequence;
  // --save: each output is mapped back to the files' layout, one at a time, and lse with it.
  const int64_t user_rows = size.loaded_rows > 0 ? size.loaded_rows : size.rows;
  const double saving =
      c.save_dir.empty() ? 0 : q_bytes(user_rows) + static_cast<double>(user_rows) * static_cast<double>(c.q_heads) * 4;
  return std::max(run + saving, loading);
}

void check_host_memory(const RunConfig& c, const RunSize& size, bool process_per_rank, const std::string& source) {
  MemoryNeed need;
  need.buffers = estimate_host_bytes(c, size, process_per_rank);
  // Threads at once: the ranks (a thread each in one process) with their attention workers,
  // or the reference's workers; the main thread, and the progress line's when it may show.
  const int cores = c.threads > 0 ? c.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int ranks_here = process_per_rank ? 1 : c.cp;
  const int workers = process_per_rank ? std::max(1, cores) : ranks_here * std::max(1, cores / ranks_here);
  need.threads = std::max(workers, cores) + 1 + (!c.quiet && isatty(STDOUT_FILENO) ? 1 : 0);
  std::string details = source + ", heads " + std::to_string(c.q_heads) + ":" + std::to_string(c.kv_heads) +
                        ", head dim " + std::to_string(c.head_dim) + ", " + dtype_name(c.dtype);
  if (!c.load_dir.empty()) details += ", " + std::to_string(size.sequences) + " sequences";
  details += ", cp " + std::to_string(c.cp) + " ranks each holding the whole K/V";
  const std::string change = c.load_dir.empty()
                                 ? "lower --tokens, --heads, --head-dim or --cp"
                                 : "lower --cp, or load fewer rows, heads or sequences (zero-length ones hold no token)";
  check_memory_budget(need, c.max_memory, "this run", details, change);
}

namespace {

// The tensors of a backward over `inputs` (global or one rank's rows) into `outputs`, which
// hold the forward's out and lse; with sinks, dsinks too.
template <typename Inputs>
BackwardTensors backward_tensors(const Inputs& inputs, const std::vector<float>& sinks, HostOutputs& outputs) {
  BackwardTensors t;
  t.q = inputs.q.view();
  t.k = inputs.k.view();
  t.v = inputs.v.view();
  t.out = std::as_const(outputs.out).view();
  t.dout = inputs.dout.view();
  t.lse = outputs.lse.data();
  t.dq = outputs.dq.view();
  t.dk = outputs.dk.view();
  t.dv = outputs.dv.view();
  if (!sinks.empty()) {
    t.sinks = sinks.data();
    t.dsinks = outputs.dsinks.data();
  }
  return t;
}
BackwardTensors backward_tensors(const GlobalBatch& batch, HostOutputs& outputs) {
  return backward_tensors(batch, batch.sinks, outputs);
}

GlobalOutputs run_reference(const RunConfig& c, const GlobalBatch& batch, RunReport& report, Progress& progress) {
  const SegmentTable table = build_segment_table(batch.layout.view(), c.mask);
  GlobalOutputs ref = host_outputs(c.step_shape(), batch.layout.total_rows());
  const AttentionOptions options = attention_options(c, c.threads);
  progress.phase("single-device reference, forward");
  const float* sinks = batch.sinks.empty() ? nullptr : batch.sinks.data();
  ref.dsinks.assign(batch.sinks.size(), 0.0f);
  auto start = Clock::now();
  cpu::attention_forward(table,
                         ForwardTensors{batch.q.view(), batch.k.view(), batch.v.view(), ref.out.view(), ref.lse.data(),
                                        ref.max_logit.data(), sinks},
                         options);
  report.reference_forward_s = seconds_since(start);
  progress.phase("single-device reference, backward");
  start = Clock::now();
  cpu::attention_backward(table, backward_tensors(batch, ref), options);
  report.reference_backward_s = seconds_since(start);
  progress.done();
  return ref;
}

// Brings every rank's local rows of a [T/cp, ...] tensor (rows of row_bytes, in the order of
// `cp_layout`) into the global tensor, on every rank.
void assemble(Communicator& comm, const LayoutView& layout, CpLayout cp_layout, const void* local, void* global,
              size_t row_bytes) {
  const int cp = comm.size();
  const size_t local_bytes = static_cast<size_t>(layout.total_rows() / cp) * row_bytes;
  std::vector<unsigned char> gathered(local_bytes * cp);
  comm.all_gather(local, gathered.data(), local_bytes);
  for (int r = 0; r < cp; ++r) {
    thdcp::merge_from_rank(gathered.data() + r * local_bytes, global, row_bytes, layout, cp, r, cp_layout);
  }
}

// Folds one rank's times into the report: the slowest rank sets each number.
void add_rank_times(RunReport& report, const RankResult& t) {
  for (auto [into, from] : {std::make_pair(&report.forward_phases, &t.forward),
                            std::make_pair(&report.backward_phases, &t.backward)}) {
    for (int i = 0; i < static_cast<int>(cp::Phase::kCount); ++i) {
      into->seconds[i] = std::max(into->seconds[i], from->seconds[i]);
    }
  }
  report.cp_forward_s = std::max(report.cp_forward_s, t.forward_wall);
  report.cp_backward_s = std::max(report.cp_backward_s, t.backward_wall);
  if (!t.kv_traffic.forward_bytes.empty()) report.kv_traffic = t.kv_traffic;  // the same on every rank
}

// One rank's share of the job on the CPU backend.
RankResult run_rank_cpu(Communicator& comm, const RunConfig& c, const GlobalBatch& batch, int threads,
                        Progress& progress) {
  RankResult r;
  const LayoutView layout = batch.layout.view();
  const int cp = comm.size();
  const int rank = comm.rank();
  const int64_t local_rows = layout.total_rows() / cp;
  struct {
    HostTensor q, k, v, dout;
  } local{split_for_rank(batch.q, layout, cp, rank, c.cp_layout), split_for_rank(batch.k, layout, cp, rank, c.cp_layout),
          split_for_rank(batch.v, layout, cp, rank, c.cp_layout),
          split_for_rank(batch.dout, layout, cp, rank, c.cp_layout)};
  static_cast<HostOutputs&>(r) = host_outputs(c.step_shape(), local_rows);
  r.dsinks.assign(batch.sinks.size(), 0.0f);
  const AttentionOptions options = attention_options(c, threads);
  // The plan's tensor forms take the sinks (the one-shot cp::forward does not).
  cp::CpuPlan plan(comm,
                   cp_problem(c.step_shape(), cp, Capacity{layout.num_seqs, layout.total_rows()}, c.mask, c.cp_layout,
                              c.cp_comm, c.kv_gather, c.a2a_size, c.reduce_dtype),
                   options);
  if (c.cp_comm != cp::CpComm::kAllToAll) r.kv_traffic = plan.kv_traffic(layout);

  auto start = Clock::now();
  plan.forward(layout,
               ForwardTensors{local.q.view(), local.k.view(), local.v.view(), r.out.view(), r.lse.data(),
                              r.max_logit.data(), batch.sinks.empty() ? nullptr : batch.sinks.data()},
               &r.forward);
  r.forward_wall = seconds_since(start);
  progress.step();
  start = Clock::now();
  plan.backward(layout, backward_tensors(local, batch.sinks, r), &r.backward);
  r.backward_wall = seconds_since(start);
  progress.step();
  return r;
}

// How a rank's outputs reach the global ones.
enum class Assemble {
  kEveryRank,  // every rank all-gathers them into its own global outputs (a process per rank)
  kShared,     // the ranks are threads of one process: each writes its own rows of the one
               // global output (rows of different ranks never overlap), nothing is copied twice
};

// Runs this rank on the configured backend and brings its outputs into `outputs`.
RankResult run_rank(Communicator& comm, const RunConfig& c, const GlobalBatch& batch, int threads,
                    GlobalOutputs& outputs, Progress& progress, CudaRun* cuda_run, Assemble how) {
  RankResult r = c.backend == Backend::kCuda ? run_rank_cuda(*cuda_run, comm, c, batch, progress)
                                             : run_rank_cpu(comm, c, batch, threads, progress);
  const LayoutView layout = batch.layout.view();
  const int64_t local_rows = layout.total_rows() / comm.size();
  if (how == Assemble::kShared) {
    const int cp = comm.size(), rank = comm.rank();
    merge_from_rank(r.out, outputs.out, layout, cp, rank, c.cp_layout);
    merge_from_rank(r.dq, outputs.dq, layout, cp, rank, c.cp_layout);
    merge_from_rank(r.dk, outputs.dk, layout, cp, rank, c.cp_layout);
    merge_from_rank(r.dv, outputs.dv, layout, cp, rank, c.cp_layout);
    merge_lse_from_rank(r.lse, outputs.lse, c.q_heads, layout, cp, rank, c.cp_layout);
    if (rank == 0) {
      outputs.max_logit = r.max_logit;  // the same on every rank (max-reduced)
      outputs.dsinks = r.dsinks;        // the same on every rank (summed in rank order)
    }
    return r;
  }
  assemble(comm, layout, c.cp_layout, r.out.data(), outputs.out.data(), r.out.row_bytes());
  assemble(comm, layout, c.cp_layout, r.dq.data(), outputs.dq.data(), r.dq.row_bytes());
  assemble(comm, layout, c.cp_layout, r.dk.data(), outputs.dk.data(), r.dk.row_bytes());
  assemble(comm, layout, c.cp_layout, r.dv.data(), outputs.dv.data(), r.dv.row_bytes());
  for (int64_t h = 0; h < c.q_heads; ++h) {
    assemble(comm, layout, c.cp_layout, r.lse.data() + h * local_rows, outputs.lse.data() + h * layout.total_rows(),
             sizeof(float));
  }
  outputs.max_logit = r.max_logit;
  outputs.dsinks = r.dsinks;
  return r;
}

void fill_layout_stats(const RunConfig& c, const GlobalBatch& batch, RunReport& report) {
  const LayoutView layout = batch.layout.view();
  report.config = c;
  report.rows = layout.total_rows();
  report.valid_tokens = batch.layout.valid_tokens();
  report.documents = layout.num_seqs;
  for (int b = 0; b < layout.num_seqs; ++b) report.longest = std::max(report.longest, layout.length(b));
  report.total_pairs = table_pairs(build_segment_table(layout, c.mask));
  report.reference_flops = 14.0 * static_cast<double>(report.total_pairs) * c.head_dim * c.q_heads;
  for (int r = 0; r < c.cp; ++r) {
    // Its rows under the layout; its pairs per head: those of its rows (all_gather), every
    // pair of the batch for Hq/cp of the heads (all_to_all: counted as 1/cp of them), or its
    // group's pairs (rank r / a2a_size at cp / a2a_size) for Hq/a2a_size heads (a2a+ag).
    const SegmentTable table = build_cp_segment_table(layout, c.cp, r, c.mask, c.cp_layout);
    int64_t pairs = table_pairs(table);
    if (c.cp_comm == cp::CpComm::kAllToAll) pairs = report.total_pairs / c.cp;
    if (c.cp_comm == cp::CpComm::kA2aAg) {
      const int ag_size = c.cp / c.a2a_size;
      pairs = table_pairs(build_cp_segment_table(layout, ag_size, r / c.a2a_size, c.mask, c.cp_layout)) / c.a2a_size;
    }
    report.rank_pairs.push_back(pairs);
    int64_t valid = 0;
    for (const Segment& s : table.segments) valid += s.q_len;
    report.rank_valid_tokens.push_back(valid);
  }
}

void check_against_reference(const RunConfig& c, const GlobalBatch& batch, const GlobalOutputs& got,
                             const GlobalOutputs& ref, RunReport& report) {
  // CPU: both sides use fp32 arithmetic and round to the storage dtype once. CUDA: the
  // tensor cores also round P (and dS) to the storage dtype (derive_tensor_core_tolerance).
  const bool gpu = c.backend == Backend::kCuda;
  const Tolerance out_tol = gpu ? derive_tensor_core_tolerance(c.dtype, 1) : derive_tolerance(c.dtype, Accumulate::kFloat32, 2);
  const Tolerance grad_tol = gpu ? derive_tensor_core_tolerance(c.dtype, 2) : out_tol;
  const Tolerance fp32 = gpu ? tensor_core_fp32_tolerance() : derive_tolerance(DType::kFloat32, Accumulate::kFloat32, 2);
  auto tensor = [&](const char* name, const HostTensor& a, const HostTensor& b) {
    const Tolerance& tol = std::string(name) == "out" ? out_tol : grad_tol;
    report.checks.push_back({name, compare_values(a.data(), a.dtype(), b.data(), b.dtype(), a.numel(), tol)});
  };
  auto floats = [&](const char* name, const std::vector<float>& a, const std::vector<float>& b) {
    report.checks.push_back({name, compare_values(a.data(), DType::kFloat32, b.data(), DType::kFloat32,
                                                  static_cast<int64_t>(a.size()), fp32)});
  };
  tensor("out", got.out, ref.out);
  floats("lse", got.lse, ref.lse);
  floats("max_logit", got.max_logit, ref.max_logit);
  tensor("dq", got.dq, ref.dq);
  tensor("dk", got.dk, ref.dk);
  tensor("dv", got.dv, ref.dv);
  if (!ref.dsinks.empty()) {
    // The GPU's delta = dO . O differs from the reference's by the storage rounding of out:
    // its dsinks bound follows from the reference's rows (sink_gradient_tolerance).
    const Tolerance sink_tol =
        gpu ? sink_gradient_tolerance(ref.out, batch.dout, ref.lse, batch.sinks, ref.dsinks) : fp32;
    report.checks.push_back({"dsinks", compare_values(got.dsinks.data(), DType::kFloat32, ref.dsinks.data(),
                                                      DType::kFloat32, static_cast<int64_t>(got.dsinks.size()),
                                                      sink_tol)});
  }
  report.checked = true;
}

// Whether to run the reference, and if not, why.
bool should_check(const RunConfig& c, RunReport& report) {
  if (c.check == CheckMode::kNever) {
    report.check_note = "check skipped (--no-check)";
    return false;
  }
  if (c.check == CheckMode::kAuto && report.reference_flops > kAutoCheckFlopLimit) {
    char note[200];
    std::snprintf(note, sizeof(note),
                  "check skipped: the CPU reference needs %.2g FLOP (over %.0g, about a minute on two cores); "
                  "pass --check to run it",
                  report.reference_flops, kAutoCheckFlopLimit);
    report.check_note = note;
    return false;
  }
  return true;
}

}  // namespace

bool RunReport::passed() const {
  if (!checked) return true;
  return std::all_of(checks.begin(), checks.end(), [](const TensorCheck& t) { return t.comparison.passed(); });
}

RunReport run_in_process_job(const RunConfig& c, const GlobalBatch& batch, GlobalOutputs& outputs,
                             Progress& progress) {
  if (c.backend == Backend::kCpu && c.threads > 0 && c.threads < c.cp) {
    throw UsageError("--threads " + std::to_string(c.threads) + " is fewer than the " + std::to_string(c.cp) +
                     " ranks, which are a thread each: give --threads " + std::to_string(c.cp) + " or more");
  }
  RunReport report;
  if (c.backend == Backend::kCuda) check_device_memory(c, batch, false);
  const std::shared_ptr<CudaRun> cuda_run = c.backend == Backend::kCuda ? prepare_cuda_run(c, false) : nullptr;
  report.communicator = cuda_run ? cuda_run_communicator(*cuda_run) : "in-process";
  fill_layout_stats(c, batch, report);
  outputs = host_outputs(c.step_shape(), batch.layout.total_rows());
  std::vector<RankResult> times(static_cast<size_t>(c.cp));
  // The ranks share this machine's cores.
  const int cores = c.threads > 0 ? c.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = std::max(1, cores / c.cp);
  progress.phase("AllGather CP forward + backward (ranks done, of 2 passes each)");
  progress.set_total(2 * c.cp);
  run_in_process(c.cp, [&](Communicator& comm) {
    times[comm.rank()] = run_rank(comm, c, batch, threads, outputs, progress, cuda_run.get(), Assemble::kShared);
  });
  progress.done();
  for (const RankResult& t : times) add_rank_times(report, t);
  if (should_check(c, report)) check_against_reference(c, batch, outputs, run_reference(c, batch, report, progress), report);
  return report;
}

RunReport run_rank_job(Communicator& comm, const RunConfig& c, const GlobalBatch& batch, GlobalOutputs& outputs,
                       Progress& progress) {
  RunReport report;
  if (c.backend == Backend::kCuda) check_device_memory(c, batch, true);
  const std::shared_ptr<CudaRun> cuda_run = c.backend == Backend::kCuda ? prepare_cuda_run(c, true) : nullptr;
  report.communicator = cuda_run ? cuda_run_communicator(*cuda_run) : comm.kind();
  fill_layout_stats(c, batch, report);
  outputs = host_outputs(c.step_shape(), batch.layout.total_rows());
  // Every rank is ready, or none runs: a rank that failed before here (its command line, its
  // inputs, its memory) has not ended the job, it is waiting for this.
  agree_before_collectives();
  progress.phase("AllGather CP forward + backward (this rank's passes)");
  progress.set_total(2);
  add_rank_times(report, run_rank(comm, c, batch, c.threads, outputs, progress, cuda_run.get(), Assemble::kEveryRank));
  // The slowest rank per phase, as the report says (each process timed only itself).
  constexpr int kPhases = static_cast<int>(cp::Phase::kCount);
  std::vector<float> times(2 * kPhases + 2);
  for (int i = 0; i < kPhases; ++i) {
    times[static_cast<size_t>(i)] = static_cast<float>(report.forward_phases.seconds[i]);
    times[static_cast<size_t>(kPhases + i)] = static_cast<float>(report.backward_phases.seconds[i]);
  }
  times[2 * kPhases] = static_cast<float>(report.cp_forward_s);
  times[2 * kPhases + 1] = static_cast<float>(report.cp_backward_s);
  comm.all_reduce_max(times.data(), times.size());
  for (int i = 0; i < kPhases; ++i) {
    report.forward_phases.seconds[i] = times[static_cast<size_t>(i)];
    report.backward_phases.seconds[i] = times[static_cast<size_t>(kPhases + i)];
  }
  report.cp_forward_s = times[2 * kPhases];
  report.cp_backward_s = times[2 * kPhases + 1];
  progress.done();
  if (comm.rank() == 0 && should_check(c, report)) {
    check_against_reference(c, batch, outputs, run_reference(c, batch, report, progress), report);
  }
  return report;
}

}  // namespace thdcp::tools
