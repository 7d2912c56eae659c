// thdcp bench: verify the CUDA attention kernels against the CPU reference on a small batch,
// then time forward and forward+backward on a large packed batch (STYLE.md, Benchmarks). The
// other modes (--cp, --scaling, --graph) are files of their own on the same harness.
#include "bench/bench_command.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "bench/bench_cp.h"
#include "bench/bench_graph.h"
#include "bench/bench_scaling.h"
#include "bench/harness.h"
#include "io/args.h"
#include "io/atomic_file.h"
#include "step/cuda_head_dims.h"
#include "step/device_step.h"
#include "thdcp/core/cuda_check.h"
#include "thdcp/cpu/attention.h"
#include "thdcp/cuda/attention.h"
#include "thdcp/testing/compare.h"
#include "thdcp/testing/workload.h"

namespace thdcp::tools {

namespace {

const char* kHelp =
    "usage: thdcp bench [options]\n"
    "\n"
    "Verifies the CUDA attention kernels against the CPU reference on a small batch, then\n"
    "times them (CUDA events, warm-up, median) on a packed batch of lognormal documents,\n"
    "causal and windowed, forward and forward+backward. TFLOP/s count the exact allowed\n"
    "(query, key) pairs: forward 2*pairs*Hq*(D_qk+D_v), backward 2*pairs*Hq*(3*D_qk+2*D_v)\n"
    "(4*pairs*D*Hq and 10*pairs*D*Hq where D_qk = D_v = D). The device workspace each pass\n"
    "needs for the timed batch is printed after the table.\n"
    "\n"
    "  --tokens N          tokens of the timed batch (65536)\n"
    "  --verify-tokens N   tokens of the verified batch (4096)\n"
    "  --q-heads N         query heads (32)\n"
    "  --kv-heads N        key/value heads (8)\n"
    "  --head-dim N        head dimension of q and k, D_qk (128)\n"
    "  --v-head-dim N      head dimension of v and out, D_v (--head-dim; MLA: --head-dim 192\n"
    "                      --v-head-dim 128). The CUDA kernels take\n"
    "                      {cuda head dims}\n"
    "  --dtype T           bf16 or fp16 (bf16)\n"
    "  --window L          left window of the windowed mask (1024; right is 0)\n"
    "  --median N          median document length (1500)\n"
    "  --max-length N      longest document (16384)\n"
    "  --seed N            seed of lengths and data (1)\n"
    "  --warmup N          untimed runs (3)\n"
    "  --iters N           timed runs; the median is reported (20)\n"
    "  --lengths-out FILE  writes the timed batch's document lengths, one per line\n"
    "  --graph             instead: eager vs CUDA-graph replay of a step of RoPE + CP attention\n"
    "                      layers (--layers 8, --tokens 4096,16384 rows per rank, --cp 1,2;\n"
    "                      thdcp bench --graph --help)\n"
    "  --cp N[,N...]       also AllGather CP with N ranks sharing this GPU: verify, then time\n"
    "                      each phase and the whole step of every rank (one CUDA graph);\n"
    "                      overhead = CP step of all ranks / single-device attention\n"
    "  --scaling --gpus N  instead: AllGather CP over NCCL across N GPUs (a thread per GPU)\n"
    "                      against the same batch on GPU 0: verify, time, efficiency table\n"
    "                      (--tokens 131072,524288; thdcp bench --scaling --help)\n";

// This mode's random inputs: blocks of 2^24 values, so that the tensors of the verified batch
// (4096 tokens of 32 heads of 128) hold independent values.
constexpr int64_t kInputBlock = int64_t{1} << 24;

struct NamedMask {
  const char* name;
  Mask mask;
};

struct Options {
  int64_t tokens = 0, verify_tokens = 0;
  StepShape shape;
  LengthDistribution dist;
  uint64_t seed = 0;
  int warmup = 0, iters = 0;
  std::vector<int> cp_sizes;
  std::string lengths_out;
  std::vector<NamedMask> masks;  // causal, and window(--window, 0)
};

Options parse_options(const std::vector<std::string>& argv) {
  const Args args(argv,
                  {"tokens", "verify-tokens", "q-heads", "kv-heads", "head-dim", "v-head-dim", "dtype", "window",
                   "median", "max-length", "seed", "warmup", "iters", "lengths-out", "cp"},
                  {});
  Options o;
  o.tokens = args.get_int("tokens", 65536, 2, int64_t{1} << 30);
  o.verify_tokens = args.get_int("verify-tokens", 4096, 0, int64_t{1} << 24);
  o.shape = parse_bench_shape(args);
  const int32_t window = static_cast<int32_t>(args.get_int("window", 1024, 0, int64_t{1} << 30));
  o.dist.median = static_cast<double>(args.get_int("median", 1500, 1, int64_t{1} << 30));
  o.dist.max_length = args.get_int("max-length", 16384, 1, int64_t{1} << 30);
  o.seed = args.get_seed("seed", 1);
  o.warmup = static_cast<int>(args.get_int("warmup", 3, 0, 1000));
  o.iters = static_cast<int>(args.get_int("iters", 20, 1, 10000));
  if (args.has("cp")) {
    for (int64_t c : parse_int_list("cp", args.get("cp", ""), 1, 64)) o.cp_sizes.push_back(static_cast<int>(c));
  }
  o.lengths_out = args.get("lengths-out", "");
  if (args.has("lengths-out")) check_output_file("lengths-out", o.lengths_out);
  o.masks = {{"causal", Mask::causal()}, {"window", Mask::window(window, 0)}};
  return o;
}

// Attention sinks of the "+sinks" rows: one logit per query head, N(0, 1), so that the sink
// takes a share of every row's softmax like a trained gpt-oss sink does.
std::vector<float> bench_sinks(int64_t q_heads, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> sinks(static_cast<size_t>(q_heads));
  for (float& s : sinks) s = static_cast<float>(rng.normal());
  return sinks;
}

// Device state of one batch and one mask: its tensors, a cuda::Attention for each backward
// mode (deterministic and not) with its workspace, and attention sinks for the "+sinks" runs.
struct DeviceBatch {
  BatchLayout layout;
  SegmentTable host_table;  // the reference's, and the exact pairs the FLOPs count
  AttentionProblem problem;
  DeviceTensors tensors;
  cuda::DeviceBuffer workspace[2];  // [deterministic]
  std::unique_ptr<cuda::Attention> attention[2];
  std::vector<float> host_sinks;
  cuda::DeviceBuffer sinks, dsinks;

  DeviceBatch(const std::vector<int64_t>& lengths, const Mask& mask, const StepShape& shape)
      : layout(exact_layout(lengths, 1)),
        host_table(build_segment_table(layout.view(), mask)),
        problem(attention_problem(shape, Capacity{layout.num_seqs(), layout.total_rows()}, mask)),
        tensors(shape, layout.total_rows(), layout, nullptr) {
    for (bool deterministic : {false, true}) {
      AttentionOptions options;
      options.deterministic = deterministic;
      cuda::DeviceBuffer& w = workspace[deterministic];
      w = cuda::DeviceBuffer(cuda::Attention::workspace_size(problem, options));
      attention[deterministic] = std::make_unique<cuda::Attention>(problem, options, w.data(), w.bytes());
    }
    host_sinks = bench_sinks(shape.q_heads, 17);
    sinks = cuda::DeviceBuffer(sizeof(float) * host_sinks.size());
    dsinks = cuda::DeviceBuffer(sizeof(float) * host_sinks.size());
    sinks.upload(host_sinks.data(), sinks.bytes());
  }
  void forward(cudaStream_t stream, bool with_sinks = false) {
    ForwardTensors t = tensors.forward();
    if (with_sinks) t.sinks = sinks.as<float>();
    attention[1]->forward(tensors.layout(problem.capacity), t, stream);
  }
  void backward(cudaStream_t stream, bool deterministic, bool with_sinks = false) {
    BackwardTensors t = tensors.backward();
    if (with_sinks) {
      t.sinks = sinks.as<float>();
      t.dsinks = dsinks.as<float>();
    }
    attention[deterministic]->backward(tensors.layout(problem.capacity), t, stream);
  }
};

// The CPU reference of the batch with the sinks of `batch`: outputs and dsinks.
HostOutputs cpu_reference_with_sinks(const DeviceBatch& batch, const HostTensor& q, const HostTensor& k,
                                     const HostTensor& v, const HostTensor& dout, std::vector<float>& dsinks) {
  HostOutputs ref = host_outputs(StepShape{{q.heads(), k.heads(), q.head_dim(), v.head_dim()}, q.dtype()}, q.tokens());
  const float* sinks = batch.host_sinks.data();
  cpu::attention_forward(batch.host_table, ForwardTensors{q.view(), k.view(), v.view(), ref.out.view(),
                                                          ref.lse.data(), ref.max_logit.data(), sinks});
  BackwardTensors t{q.view(), k.view(), v.view(), ref.out.view(), dout.view(), ref.lse.data(),
                    ref.dq.view(), ref.dk.view(), ref.dv.view()};
  t.sinks = sinks;
  dsinks.assign(batch.host_sinks.size(), 0.0f);
  t.dsinks = dsinks.data();
  cpu::attention_backward(batch.host_table, t);
  return ref;
}

// Runs the small batch on both backends; prints each output's error. Same tolerances as the
// GPU tests (tests/cuda/test_cuda_attention.cpp explains them).
bool verify(const std::vector<int64_t>& lengths, const NamedMask& m, const StepShape& s, uint64_t seed) {
  DeviceBatch batch(lengths, m.mask, s);
  const int64_t rows = batch.layout.total_rows();
  HostInputs in = host_inputs(s, rows);
  uint64_t next_seed = seed;
  for (HostTensor* t : {&in.q, &in.k, &in.v, &in.dout}) fill_random(*t, ++next_seed, kInputBlock);
  const HostTensor &q = in.q, &k = in.k, &v = in.v, &dout = in.dout;
  batch.tensors.upload_inputs(q, k, v, dout, nullptr);
  batch.tensors.poison_outputs(nullptr);
  batch.forward(nullptr);
  const HostOutputs forward = batch.tensors.download_outputs(nullptr);
  const HostOutputs ref = cpu_reference(batch.host_table, q, k, v, dout);

  const double u = dtype_unit_roundoff(s.dtype);
  Tolerance out_tol = derive_tolerance(s.dtype, Accumulate::kFloat32, 2);
  Tolerance grad_tol = out_tol;
  out_tol.atol_scale += 4 * u;
  grad_tol.atol_scale += 8 * u;
  const Tolerance fp32_tol{0x1.0p-16, 0x1.0p-16};
  Verification check(format("%-7s", m.name), 10);
  check.check("out", compare(forward.out, ref.out, out_tol));
  check.check("lse", compare(forward.lse, ref.lse, fp32_tol));
  check.check("max_logit", compare(forward.max_logit, ref.max_logit, fp32_tol));
  for (bool deterministic : {true, false}) {
    batch.tensors.poison_gradients(nullptr);
    batch.backward(nullptr, deterministic);
    const HostOutputs got = batch.tensors.download_outputs(nullptr);
    const std::string suffix = deterministic ? "" : "(nondet)";
    check.check("dq" + suffix, compare(got.dq, ref.dq, grad_tol));
    check.check("dk" + suffix, compare(got.dk, ref.dk, grad_tol));
    check.check("dv" + suffix, compare(got.dv, ref.dv, grad_tol));
  }
  // With attention sinks: the forward and the deterministic backward, dsinks included.
  std::vector<float> ref_dsinks;
  const HostOutputs sink_ref = cpu_reference_with_sinks(batch, q, k, v, dout, ref_dsinks);
  batch.tensors.poison_outputs(nullptr);
  batch.dsinks.poison();
  batch.forward(nullptr, true);
  batch.backward(nullptr, true, true);
  const HostOutputs sink_got = batch.tensors.download_outputs(nullptr);
  std::vector<float> dsinks(ref_dsinks.size());
  batch.dsinks.download(dsinks.data(), batch.dsinks.bytes());
  check.check("out+sinks", compare(sink_got.out, sink_ref.out, out_tol));
  check.check("lse+sinks", compare(sink_got.lse, sink_ref.lse, fp32_tol));
  check.check("dq+sinks", compare(sink_got.dq, sink_ref.dq, grad_tol));
  check.check("dk+sinks", compare(sink_got.dk, sink_ref.dk, grad_tol));
  check.check("dv+sinks", compare(sink_got.dv, sink_ref.dv, grad_tol));
  check.check("dsinks", compare(dsinks, ref_dsinks,
                                sink_gradient_tolerance(sink_ref.out, dout, sink_ref.lse, batch.host_sinks, ref_dsinks)));
  return check.passed();
}

// Every verification: the kernels on a small batch, then CP with each --cp size.
bool verify_all(const Options& o) {
  const std::vector<int64_t> small = sample_lengths(o.verify_tokens, 1, o.dist, o.seed + 100);
  bool ok = true;
  for (const NamedMask& m : o.masks) ok = verify(small, m, o.shape, o.seed + 200) && ok;
  for (int cp : o.cp_sizes) {
    for (const NamedMask& m : o.masks) ok = verify_cp(cp, small, m.mask, m.name, o.shape, o.seed + 300) && ok;
  }
  return ok;
}

// The single-device times the CP table compares with, per mask.
struct SingleTimes {
  double fwd_ms = 0, fwd_bwd_ms = 0;
};

// The times of `plain` and `other` measured in alternating rounds: each round times a whole
// loop (warm-up, then --iters back-to-back runs, their median) of one and then of the other,
// and the result is the median over three rounds of each. Back-to-back runs keep the card
// busy as a training step does (one run at a time with idle gaps between would run it at
// lower clocks), and alternating the rounds puts a drift of the clocks over the table on both.
std::pair<double, double> alternating_medians(const Options& o, const std::function<void()>& plain,
                                              const std::function<void()>& other) {
  constexpr int kRounds = 3;
  std::vector<double> a, b;
  for (int round = 0; round < kRounds; ++round) {
    a.push_back(time_median_ms(o.warmup, o.iters, nullptr, plain));
    b.push_back(time_median_ms(o.warmup, o.iters, nullptr, other));
  }
  return {median(a), median(b)};
}

// The table of the single-device kernels on the timed batch; returns their times per mask.
std::vector<SingleTimes> time_kernels(const Options& o, const std::vector<int64_t>& lengths) {
  std::printf("kernels: %s; bwd: Options::deterministic = true (the default); bwd(nondet): false (portable "
              "kernels: dQ by fp32 atomics; sm90: the same kernels as true)\n",
              cuda::kernel_family());
  const Table table(Table::Style::kAligned,
                    {{"mask", 7, true}, {"pass", 19, true}, {"pairs", 12}, {"ms", 10}, {"TFLOP/s", 9}});
  table.print_header();
  std::vector<SingleTimes> single;
  size_t workspace[2] = {0, 0};  // cuda::Attention's device workspace: deterministic, not
  for (const NamedMask& m : o.masks) {
    DeviceBatch batch(lengths, m.mask, o.shape);
    fill_inputs(batch.tensors, o.seed, kInputBlock, nullptr);
    const double pairs = static_cast<double>(table_pairs(batch.host_table));
    const double unit = pairs * static_cast<double>(o.shape.q_heads);
    const PassFlops flops = pass_flops(o.shape);
    auto row = [&](const std::string& pass, double ms, double flops_per_unit) {
      table.print_row({m.name, pass, format("%.0f", pairs), format("%.3f", ms),
                       format("%.1f", flops_per_unit * unit / (ms * 1e9))});
    };
    SingleTimes times;
    times.fwd_ms = time_median_ms(o.warmup, o.iters, nullptr, [&] { batch.forward(nullptr); });
    row("fwd", times.fwd_ms, flops.forward);
    for (bool deterministic : {true, false}) {
      const std::string suffix = deterministic ? "" : "(nondet)";
      const double bwd_ms =
          time_median_ms(o.warmup, o.iters, nullptr, [&] { batch.backward(nullptr, deterministic); });
      const double fwd_bwd_ms = time_median_ms(o.warmup, o.iters, nullptr, [&] {
        batch.forward(nullptr);
        batch.backward(nullptr, deterministic);
      });
      row("bwd" + suffix, bwd_ms, flops.backward);
      row("fwd+bwd" + suffix, fwd_bwd_ms, flops.forward_backward());
      if (deterministic) times.fwd_bwd_ms = fwd_bwd_ms;
    }
    // The same batch with attention sinks (deterministic backward, dsinks written), each pass
    // timed in rounds alternating with the same pass without sinks: the cost of the sinks is
    // the ratio of the two, on the same clocks.
    for (auto [pass, pass_flops] : {std::make_pair("fwd", flops.forward), std::make_pair("bwd", flops.backward),
                                    std::make_pair("fwd+bwd", flops.forward_backward())}) {
      const std::string name = pass;
      auto run = [&, name](bool with_sinks) {
        if (name != "bwd") batch.forward(nullptr, with_sinks);
        if (name != "fwd") batch.backward(nullptr, true, with_sinks);
      };
      const auto [plain_ms, sinks_ms] = alternating_medians(o, [&] { run(false); }, [&] { run(true); });
      row(name + "+sinks", sinks_ms, pass_flops);
      std::printf("%-7s %-19s %.1f%% over %.3f ms without sinks, in alternating rounds\n", m.name,
                  (name + "+sinks").c_str(), 100.0 * (sinks_ms / plain_ms - 1.0), plain_ms);
    }
    if (single.empty()) {  // the same for every mask: capacity and shape only
      AttentionOptions nondet;
      nondet.deterministic = false;
      workspace[0] = cuda::Attention::workspace_size(batch.problem);
      workspace[1] = cuda::Attention::workspace_size(batch.problem, nondet);
    }
    single.push_back(times);
  }
  std::printf("workspace: cuda::Attention %zu bytes (table, forward, backward), with deterministic = false %zu "
              "bytes\n", workspace[0], workspace[1]);
  return single;
}

// The table of AllGather CP with each --cp size against the single-device times.
void time_cp_sizes(const Options& o, const std::vector<int64_t>& lengths, const std::vector<SingleTimes>& single) {
  std::printf("\nAllGather CP, ranks sharing this GPU (shared-GPU communicator). step: the whole step of every rank,\n"
              "one CUDA graph, median ms (the backward's reduce-scatter overlapped with its dQ pass); overhead =\n"
              "step / single-device attention (same lengths). Phases: ms per step summed over ranks, from CUDA\n"
              "events of eager steps run in program order (ranks run concurrently, so a phase can include other\n"
              "ranks' work). fwd+bwd*: the backward on the forward's K/V (cp::KvSource::kFromForward).\n");
  std::vector<Table::Column> columns = {{"cp", 3, true},  {"mask", 7, true}, {"pass", 8, true},
                                        {"single", 9},    {"step", 9},       {"overhead", 9}};
  for (int ph = 0; ph < static_cast<int>(cp::Phase::kCount); ++ph) {
    columns.push_back({cp::phase_name(static_cast<cp::Phase>(ph)), 9});
  }
  const Table table(Table::Style::kAligned, columns);
  table.print_header();
  const char* pass_names[3] = {"fwd", "fwd+bwd", "fwd+bwd*"};
  for (int cp : o.cp_sizes) {
    for (size_t mask = 0; mask < o.masks.size(); ++mask) {
      const CpTiming t = time_cp(cp, lengths, o.masks[mask].mask, o.shape, o.seed, o.warmup, o.iters);
      for (int pass = 0; pass < 3; ++pass) {
        const double base = pass == 0 ? single[mask].fwd_ms : single[mask].fwd_bwd_ms;
        const double ms = t.graph_ms[pass];
        std::vector<std::string> cells = {format("%d", cp), o.masks[mask].name, pass_names[pass],
                                          format("%.3f", base), format("%.3f", ms), format("%.3f", ms / base)};
        for (int ph = 0; ph < static_cast<int>(cp::Phase::kCount); ++ph) {
          cells.push_back(format("%.3f", t.phases[pass].seconds[ph] * 1e3));
        }
        table.print_row(cells);
      }
    }
  }
}

}  // namespace

int bench_command(const std::vector<std::string>& argv) {
  if (std::find(argv.begin(), argv.end(), "--graph") != argv.end()) return bench_graph_command(argv);
  if (std::find(argv.begin(), argv.end(), "--scaling") != argv.end()) return bench_scaling_command(argv);
  for (const std::string& a : argv) {
    if (a == "--help" || a == "-h") {
      std::fputs(usage_with_cuda_head_dims(kHelp).c_str(), stdout);
      return 0;
    }
  }
  const Options o = parse_options(argv);
  require_gpu("thdcp bench");

  int device = 0;
  THDCP_CHECK_CUDA(cudaGetDevice(&device));
  std::printf("device: %s\n", device_text(device).c_str());
  const std::string value_dim =
      o.shape.v_head_dim != 0 ? format(" D_v=%lld", static_cast<long long>(o.shape.v_head_dim)) : "";
  std::printf("problem: Hq=%lld Hkv=%lld D=%lld%s %s, lengths lognormal median %.0f max %lld, seed %llu\n",
              static_cast<long long>(o.shape.q_heads), static_cast<long long>(o.shape.kv_heads),
              static_cast<long long>(o.shape.head_dim), value_dim.c_str(), dtype_name(o.shape.dtype), o.dist.median,
              static_cast<long long>(o.dist.max_length), static_cast<unsigned long long>(o.seed));
  if (o.verify_tokens > 0) {
    if (!verify_all(o)) {
      std::printf("verification FAILED: no timing\n");
      return 1;
    }
    std::printf("All results match. Starting benchmarks.\n");
  }

  const std::vector<int64_t> lengths = sample_lengths(o.tokens, 1, o.dist, o.seed);
  if (!o.lengths_out.empty()) {
    std::string text;
    for (int64_t length : lengths) text += std::to_string(length) + "\n";
    write_text_file(o.lengths_out, text);
  }
  int64_t longest = 0;
  for (int64_t length : lengths) longest = std::max(longest, length);
  std::printf("batch: %zu documents, %lld rows, longest %lld\n", lengths.size(),
              static_cast<long long>(make_layout(lengths, 1).total_rows()), static_cast<long long>(longest));
  const std::vector<SingleTimes> single = time_kernels(o, lengths);
  if (!o.cp_sizes.empty()) time_cp_sizes(o, lengths, single);
  return 0;
}

}  // namespace thdcp::tools
