// thdcp bench: verify the CUDA attention kernels against the CPU reference on a small batch,
// then time forward and forward+backward on a large packed batch (STYLE.md, Benchmarks).
#include "bench/bench_command.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "io/args.h"
#include "io/atomic_file.h"
#include "bench/bench_cp.h"
#include "bench/bench_graph.h"
#include "bench/bench_scaling.h"
#include "thdcp/testing/compare.h"
#include "thdcp/cuda/attention.h"
#include "thdcp/core/cuda_check.h"
#include "thdcp/testing/device_buffer.h"
#include "thdcp/plan/layout.h"
#include "thdcp/plan/segment_table.h"
#include "thdcp/testing/workload.h"

namespace thdcp::tools {

namespace {

const char* kHelp =
    "usage: thdcp bench [options]\n"
    "\n"
    "Verifies the CUDA attention kernels against the CPU reference on a small batch, then\n"
    "times them (CUDA events, warm-up, median) on a packed batch of lognormal documents,\n"
    "causal and windowed, forward and forward+backward. TFLOP/s count the exact allowed\n"
    "(query, key) pairs: forward 4*pairs*D*Hq, backward 10*pairs*D*Hq. The device workspace\n"
    "each pass needs for the timed batch is printed after the table.\n"
    "\n"
    "  --tokens N          tokens of the timed batch (65536)\n"
    "  --verify-tokens N   tokens of the verified batch (4096)\n"
    "  --q-heads N         query heads (32)\n"
    "  --kv-heads N        key/value heads (8)\n"
    "  --head-dim N        64 or 128 (128)\n"
    "  --dtype T           bf16 or fp16 (bf16)\n"
    "  --window L          left window of the windowed mask (1024; right is 0)\n"
    "  --median N          median document length (1500)\n"
    "  --max-length N      longest document (16384)\n"
    "  --seed N            seed of lengths and data (1)\n"
    "  --warmup N          untimed runs (3)\n"
    "  --iters N           timed runs; the median is reported (20)\n"
    "  --lengths-out FILE  writes the timed batch's document lengths, one per line\n"
    "  --graph             instead: eager vs CUDA-graph replay of a step of RoPE + CP attention\n"
    "                      layers (--layers 8, --tokens 4096,16384 rows per rank, --cp 1,2)\n"
    "  --cp N[,N...]       also AllGather CP with N ranks sharing this GPU: verify, then time\n"
    "                      each phase and the whole step of every rank (one CUDA graph);\n"
    "                      overhead = CP step of all ranks / single-device attention\n"
    "  --scaling --gpus N  instead: AllGather CP over NCCL across N GPUs (a thread per GPU)\n"
    "                      against the same batch on GPU 0: verify, time, efficiency table\n"
    "                      (--tokens 131072,524288; thdcp bench --scaling --help)\n";

using Buffer = cuda::DeviceBuffer;

// Fills a device buffer with N(0,1) values of `dtype`: a 16M-element random block, repeated.
// Repetition does not matter for timing (it is not zeros, and the buffers dwarf L2).
void fill_device(void* device, DType dtype, int64_t numel, uint64_t seed) {
  const int64_t block = std::min<int64_t>(numel, int64_t{1} << 24);
  HostTensor host(dtype, 1, 1, block);
  fill_normal(host, seed);
  const size_t element = dtype_size(dtype);
  for (int64_t offset = 0; offset < numel; offset += block) {
    const int64_t n = std::min(block, numel - offset);
    THDCP_CHECK_CUDA(cudaMemcpy(static_cast<char*>(device) + offset * element, host.data(),
                                static_cast<size_t>(n) * element, cudaMemcpyHostToDevice));
  }
}

struct Problem {
  int q_heads, kv_heads, head_dim;
  DType dtype;
};

// Device state of one batch and one mask: metadata, tensors, and a cuda::Attention for each
// backward mode (deterministic and not) with its workspace.
struct DeviceBatch {
  BatchLayout layout;
  SegmentTable host_table;  // the reference's, and the exact pairs the FLOPs count
  AttentionProblem attention_problem;
  Buffer cu_seqlens, cu_seqlens_padded;
  int64_t rows;
  Buffer q, k, v, out, dout, dq, dk, dv, lse, max_logit;
  Buffer workspace[2];  // [deterministic]
  std::unique_ptr<cuda::Attention> attention[2];

  DeviceBatch(const std::vector<int64_t>& lengths, const Mask& mask, const Problem& p, uint64_t seed)
      : layout(make_layout(lengths, 1, Capacity{static_cast<int>(lengths.size()) + 1,
                                                make_layout(lengths, 1).total_rows()})),
        host_table(build_segment_table(layout.view(), mask)),
        cu_seqlens(sizeof(int32_t) * layout.cu_seqlens.size()),
        cu_seqlens_padded(sizeof(int32_t) * layout.cu_seqlens.size()),
        rows(layout.total_rows()),
        q(bytes(rows, p.q_heads, p.head_dim, p.dtype)),
        k(bytes(rows, p.kv_heads, p.head_dim, p.dtype)),
        v(bytes(rows, p.kv_heads, p.head_dim, p.dtype)),
        out(bytes(rows, p.q_heads, p.head_dim, p.dtype)),
        dout(bytes(rows, p.q_heads, p.head_dim, p.dtype)),
        dq(bytes(rows, p.q_heads, p.head_dim, p.dtype)),
        dk(bytes(rows, p.kv_heads, p.head_dim, p.dtype)),
        dv(bytes(rows, p.kv_heads, p.head_dim, p.dtype)),
        lse(sizeof(float) * static_cast<size_t>(rows * p.q_heads)),
        max_logit(sizeof(float) * static_cast<size_t>(p.q_heads)),
        problem(p) {
    cu_seqlens.upload(layout.cu_seqlens.data(), cu_seqlens.bytes());
    cu_seqlens_padded.upload(layout.cu_seqlens_padded.data(), cu_seqlens_padded.bytes());
    attention_problem.capacity = Capacity{layout.num_seqs(), rows};
    attention_problem.mask = mask;
    attention_problem.q_heads = p.q_heads;
    attention_problem.kv_heads = p.kv_heads;
    attention_problem.head_dim = p.head_dim;
    attention_problem.dtype = attention_problem.dq_dtype = attention_problem.dkv_dtype = p.dtype;
    for (bool deterministic : {false, true}) {
      AttentionOptions options;
      options.deterministic = deterministic;
      Buffer& w = workspace[deterministic];
      w = Buffer(cuda::Attention::workspace_size(attention_problem, options));
      attention[deterministic] = std::make_unique<cuda::Attention>(attention_problem, options, w.data(), w.bytes());
    }
    fill_device(q.data(), p.dtype, rows * p.q_heads * p.head_dim, seed + 1);
    fill_device(k.data(), p.dtype, rows * p.kv_heads * p.head_dim, seed + 2);
    fill_device(v.data(), p.dtype, rows * p.kv_heads * p.head_dim, seed + 3);
    fill_device(dout.data(), p.dtype, rows * p.q_heads * p.head_dim, seed + 4);
  }

  static size_t bytes(int64_t rows, int heads, int dim, DType dtype) {
    return static_cast<size_t>(rows * heads * dim) * dtype_size(dtype);
  }
  ThdTensor view(const Buffer& b, int heads) const {
    return ThdTensor{b.data(), problem.dtype, rows, heads, problem.head_dim};
  }
  DeviceLayout device_layout() const {
    return DeviceLayout{cu_seqlens.as<int32_t>(), cu_seqlens_padded.as<int32_t>(), attention_problem.capacity};
  }
  void forward(cudaStream_t stream) {
    attention[1]->forward(device_layout(),
                          ForwardTensors{view(q, problem.q_heads), view(k, problem.kv_heads), view(v, problem.kv_heads),
                                         view(out, problem.q_heads), lse.as<float>(), max_logit.as<float>()},
                          stream);
  }
  void backward(cudaStream_t stream, bool deterministic) {
    BackwardTensors t{view(q, problem.q_heads),   view(k, problem.kv_heads),   view(v, problem.kv_heads),
                      view(out, problem.q_heads), view(dout, problem.q_heads), lse.as<float>(),
                      view(dq, problem.q_heads),  view(dk, problem.kv_heads),  view(dv, problem.kv_heads)};
    attention[deterministic]->backward(device_layout(), t, stream);
  }

  Problem problem;
};

HostTensor download(const DeviceBatch& batch, const Buffer& b, int heads) {
  HostTensor host(batch.problem.dtype, batch.rows, heads, batch.problem.head_dim);
  THDCP_CHECK_CUDA(cudaMemcpy(host.data(), b.data(), b.bytes(), cudaMemcpyDeviceToHost));
  return host;
}

// Runs the small batch on both backends; prints each output's error. Same tolerances as the
// GPU tests (tests/cuda/test_cuda_attention.cpp explains them).
bool verify(const std::vector<int64_t>& lengths, const Mask& mask, const char* mask_name, const Problem& p,
            uint64_t seed) {
  DeviceBatch batch(lengths, mask, p, seed);
  for (Buffer* b : {&batch.out, &batch.dq, &batch.dk, &batch.dv, &batch.lse, &batch.max_logit}) {
    THDCP_CHECK_CUDA(cudaMemset(b->data(), 0xff, b->bytes()));  // NaN: an unwritten element fails
  }
  batch.forward(nullptr);
  THDCP_CHECK_CUDA(cudaDeviceSynchronize());

  HostTensor q = download(batch, batch.q, p.q_heads), k = download(batch, batch.k, p.kv_heads);
  HostTensor v = download(batch, batch.v, p.kv_heads), dout = download(batch, batch.dout, p.q_heads);
  HostTensor out_ref(p.dtype, batch.rows, p.q_heads, p.head_dim), dq_ref(p.dtype, batch.rows, p.q_heads, p.head_dim);
  HostTensor dk_ref(p.dtype, batch.rows, p.kv_heads, p.head_dim), dv_ref(p.dtype, batch.rows, p.kv_heads, p.head_dim);
  std::vector<float> lse_ref(static_cast<size_t>(batch.rows * p.q_heads)), max_ref(static_cast<size_t>(p.q_heads));
  cpu::attention_forward(batch.host_table, q.view(), k.view(), v.view(), out_ref.view(), lse_ref.data(),
                         max_ref.data());
  cpu::attention_backward(batch.host_table, q.view(), k.view(), v.view(), out_ref.view(), dout.view(), lse_ref.data(),
                          dq_ref.view(), dk_ref.view(), dv_ref.view());

  const double u = dtype_unit_roundoff(p.dtype);
  Tolerance out_tol = derive_tolerance(p.dtype, Accumulate::kFloat32, 2);
  Tolerance grad_tol = out_tol;
  out_tol.atol_scale += 4 * u;
  grad_tol.atol_scale += 8 * u;
  const Tolerance fp32_tol{0x1.0p-16, 0x1.0p-16};
  std::vector<float> lse(lse_ref.size()), max_logit(max_ref.size());
  THDCP_CHECK_CUDA(cudaMemcpy(lse.data(), batch.lse.data(), batch.lse.bytes(), cudaMemcpyDeviceToHost));
  THDCP_CHECK_CUDA(cudaMemcpy(max_logit.data(), batch.max_logit.data(), batch.max_logit.bytes(), cudaMemcpyDeviceToHost));

  bool ok = true;
  auto report = [&](const char* name, const Comparison& c) {
    std::printf("verify %-7s %-10s %s\n", mask_name, name, c.summary().c_str());
    ok = ok && c.passed();
  };
  auto compare = [&](const char* name, const HostTensor& a, const HostTensor& r, const Tolerance& t) {
    report(name, compare_values(a.data(), a.dtype(), r.data(), r.dtype(), a.numel(), t));
  };
  compare("out", download(batch, batch.out, p.q_heads), out_ref, out_tol);
  report("lse", compare_values(lse.data(), DType::kFloat32, lse_ref.data(), DType::kFloat32,
                               static_cast<int64_t>(lse.size()), fp32_tol));
  report("max_logit", compare_values(max_logit.data(), DType::kFloat32, max_ref.data(), DType::kFloat32,
                                     static_cast<int64_t>(max_logit.size()), fp32_tol));
  for (bool deterministic : {true, false}) {
    for (Buffer* b : {&batch.dq, &batch.dk, &batch.dv}) THDCP_CHECK_CUDA(cudaMemset(b->data(), 0xff, b->bytes()));
    batch.backward(nullptr, deterministic);
    THDCP_CHECK_CUDA(cudaDeviceSynchronize());
    compare(deterministic ? "dq" : "dq(nondet)", download(batch, batch.dq, p.q_heads), dq_ref, grad_tol);
    compare(deterministic ? "dk" : "dk(nondet)", download(batch, batch.dk, p.kv_heads), dk_ref, grad_tol);
    compare(deterministic ? "dv" : "dv(nondet)", download(batch, batch.dv, p.kv_heads), dv_ref, grad_tol);
  }
  return ok;
}

// Median milliseconds of `body` over `iters` timed runs after `warmup` runs.
template <typename Body>
double time_median_ms(int warmup, int iters, cudaStream_t stream, Body body) {
  for (int i = 0; i < warmup; ++i) body();
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
  cudaEvent_t start, stop;
  THDCP_CHECK_CUDA(cudaEventCreate(&start));
  THDCP_CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<float> ms(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    THDCP_CHECK_CUDA(cudaEventRecord(start, stream));
    body();
    THDCP_CHECK_CUDA(cudaEventRecord(stop, stream));
    THDCP_CHECK_CUDA(cudaEventSynchronize(stop));
    THDCP_CHECK_CUDA(cudaEventElapsedTime(&ms[static_cast<size_t>(i)], start, stop));
  }
  THDCP_CHECK_CUDA(cudaEventDestroy(start));
  THDCP_CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

// Throws UsageError (exit 2) when no CUDA device can be used, saying why.
void require_gpu(const char* what) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaSuccess && count > 0) return;
  (void)cudaGetLastError();
  throw UsageError(std::string(what) + " times CUDA kernels and needs a GPU: " +
                   (status != cudaSuccess ? std::string("no CUDA device (") + cudaGetErrorString(status) + ")"
                                          : std::string("no CUDA device is visible")));
}

int bench_command(const std::vector<std::string>& argv) {
  if (std::find(argv.begin(), argv.end(), "--graph") != argv.end()) return bench_graph_command(argv);
  if (std::find(argv.begin(), argv.end(), "--scaling") != argv.end()) return bench_scaling_command(argv);
  for (const std::string& a : argv) {
    if (a == "--help" || a == "-h") {
      std::fputs(kHelp, stdout);
      return 0;
    }
  }
  const Args args(argv,
                  {"tokens", "verify-tokens", "q-heads", "kv-heads", "head-dim", "dtype", "window", "median",
                   "max-length", "seed", "warmup", "iters", "lengths-out", "cp"},
                  {});
  const int64_t tokens = args.get_int("tokens", 65536, 2, int64_t{1} << 30);
  const int64_t verify_tokens = args.get_int("verify-tokens", 4096, 0, int64_t{1} << 24);
  Problem p;
  p.q_heads = static_cast<int>(args.get_int("q-heads", 32, 1, 1024));
  p.kv_heads = static_cast<int>(args.get_int("kv-heads", 8, 1, 1024));
  p.head_dim = static_cast<int>(args.get_int("head-dim", 128, 1, 1024));
  p.dtype = parse_dtype(args.get("dtype", "bf16"));
  const int32_t window = static_cast<int32_t>(args.get_int("window", 1024, 0, int64_t{1} << 30));
  LengthDistribution dist;
  dist.median = static_cast<double>(args.get_int("median", 1500, 1, int64_t{1} << 30));
  dist.max_length = args.get_int("max-length", 16384, 1, int64_t{1} << 30);
  const uint64_t seed = args.get_seed("seed", 1);
  const int warmup = static_cast<int>(args.get_int("warmup", 3, 0, 1000));
  const int iters = static_cast<int>(args.get_int("iters", 20, 1, 10000));
  std::vector<int> cp_sizes;
  if (args.has("cp")) {
    for (int64_t c : parse_int_list("cp", args.get("cp", ""), 1, 64)) cp_sizes.push_back(static_cast<int>(c));
  }
  if (args.has("lengths-out")) check_output_file("lengths-out", args.get("lengths-out", ""));
  require_gpu("thdcp bench");

  cudaDeviceProp prop{};
  int device = 0;
  THDCP_CHECK_CUDA(cudaGetDevice(&device));
  THDCP_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  std::printf("device: %s (%d SMs, sm_%d%d)\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor);
  std::printf("problem: Hq=%d Hkv=%d D=%d %s, lengths lognormal median %.0f max %lld, seed %llu\n", p.q_heads,
              p.kv_heads, p.head_dim, dtype_name(p.dtype), dist.median, static_cast<long long>(dist.max_length),
              static_cast<unsigned long long>(seed));

  const struct {
    const char* name;
    Mask mask;
  } masks[] = {{"causal", Mask::causal()}, {"window", Mask::window(window, 0)}};

  if (verify_tokens > 0) {
    const std::vector<int64_t> small = sample_lengths(verify_tokens, 1, dist, seed + 100);
    bool ok = true;
    for (const auto& m : masks) ok = verify(small, m.mask, m.name, p, seed + 200) && ok;
    for (int cp : cp_sizes) {
      for (const auto& m : masks) {
        ok = verify_cp(cp, small, m.mask, m.name, p.q_heads, p.kv_heads, p.head_dim, p.dtype, seed + 300) && ok;
      }
    }
    if (!ok) {
      std::printf("verification FAILED: no timing\n");
      return 1;
    }
    std::printf("All results match. Starting benchmarks.\n");
  }

  const std::vector<int64_t> lengths = sample_lengths(tokens, 1, dist, seed);
  if (args.has("lengths-out")) {
    std::string text;
    for (int64_t length : lengths) text += std::to_string(length) + "\n";
    write_text_file(args.get("lengths-out", ""), text);
  }
  int64_t longest = 0;
  for (int64_t length : lengths) longest = std::max(longest, length);
  std::printf("batch: %zu documents, %lld rows, longest %lld\n", lengths.size(),
              static_cast<long long>(make_layout(lengths, 1).total_rows()), static_cast<long long>(longest));
  std::printf("kernels: %s; bwd: Options::deterministic = true (the default); bwd(nondet): false (portable "
              "kernels: dQ by fp32 atomics; sm90: the same kernels as true)\n",
              cuda::kernel_family());
  std::printf("%-7s %-19s %12s %10s %9s\n", "mask", "pass", "pairs", "ms", "TFLOP/s");
  struct Single {
    double fwd_ms = 0, fwd_bwd_ms = 0;
  } single[2];
  size_t workspace[2] = {0, 0};  // cuda::Attention's device workspace: deterministic, not
  int mask_index = 0;
  for (const auto& m : masks) {
    DeviceBatch batch(lengths, m.mask, p, seed);
    const double pairs = static_cast<double>(table_pairs(batch.host_table));
    const double unit = pairs * p.head_dim * p.q_heads;
    const double fwd_ms = time_median_ms(warmup, iters, nullptr, [&] { batch.forward(nullptr); });
    std::printf("%-7s %-19s %12.0f %10.3f %9.1f\n", m.name, "fwd", pairs, fwd_ms, 4 * unit / (fwd_ms * 1e9));
    single[mask_index].fwd_ms = fwd_ms;
    for (bool deterministic : {true, false}) {
      const char* suffix = deterministic ? "" : "(nondet)";
      const double bwd_ms =
          time_median_ms(warmup, iters, nullptr, [&] { batch.backward(nullptr, deterministic); });
      const double fwd_bwd_ms = time_median_ms(warmup, iters, nullptr, [&] {
        batch.forward(nullptr);
        batch.backward(nullptr, deterministic);
      });
      std::printf("%-7s %-19s %12.0f %10.3f %9.1f\n", m.name, (std::string("bwd") + suffix).c_str(), pairs, bwd_ms,
                  10 * unit / (bwd_ms * 1e9));
      std::printf("%-7s %-19s %12.0f %10.3f %9.1f\n", m.name, (std::string("fwd+bwd") + suffix).c_str(), pairs,
                  fwd_bwd_ms, 14 * unit / (fwd_bwd_ms * 1e9));
      if (deterministic) single[mask_index].fwd_bwd_ms = fwd_bwd_ms;
    }
    if (mask_index == 0) {  // the same for every mask: capacity and shape only
      AttentionOptions nondet;
      nondet.deterministic = false;
      workspace[0] = cuda::Attention::workspace_size(batch.attention_problem);
      workspace[1] = cuda::Attention::workspace_size(batch.attention_problem, nondet);
    }
    ++mask_index;
  }
  std::printf("workspace: cuda::Attention %zu bytes (table, forward, backward), with deterministic = false %zu "
              "bytes\n", workspace[0], workspace[1]);
  if (cp_sizes.empty()) return 0;
  std::printf("\nAllGather CP, ranks sharing this GPU (shared-GPU communicator). step: the whole step of every rank,\n"
              "one CUDA graph, median ms (the backward's reduce-scatter overlapped with its dQ pass); overhead =\n"
              "step / single-device attention (same lengths). Phases: ms per step summed over ranks, from CUDA\n"
              "events of eager steps run in program order (ranks run concurrently, so a phase can include other\n"
              "ranks' work). fwd+bwd*: the backward on the forward's K/V (cp::KvSource::kFromForward).\n");
  std::printf("%-3s %-7s %-8s %9s %9s %9s", "cp", "mask", "pass", "single", "step", "overhead");
  for (int ph = 0; ph < static_cast<int>(cp::Phase::kCount); ++ph) std::printf(" %9s", cp::phase_name(static_cast<cp::Phase>(ph)));
  std::printf("\n");
  for (int cp : cp_sizes) {
    mask_index = 0;
    for (const auto& m : masks) {
      const CpTiming t = time_cp(cp, lengths, m.mask, p.q_heads, p.kv_heads, p.head_dim, p.dtype, seed, warmup, iters);
      const char* pass_names[3] = {"fwd", "fwd+bwd", "fwd+bwd*"};
      for (int pass = 0; pass < 3; ++pass) {
        const double base = pass == 0 ? single[mask_index].fwd_ms : single[mask_index].fwd_bwd_ms;
        const double ms = t.graph_ms[pass];
        std::printf("%-3d %-7s %-8s %9.3f %9.3f %9.3f", cp, m.name, pass_names[pass], base, ms, ms / base);
        for (int ph = 0; ph < static_cast<int>(cp::Phase::kCount); ++ph) {
          std::printf(" %9.3f", t.phases[pass].seconds[ph] * 1e3);
        }
        std::printf("\n");
      }
      ++mask_index;
    }
  }
  return 0;
}

}  // namespace thdcp::tools
