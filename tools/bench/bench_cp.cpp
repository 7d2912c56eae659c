// thdcp bench --cp N: AllGather CP with N ranks sharing one GPU (shared-GPU communicator).
// Verifies the CP step against the CPU reference on a small batch, then times, on the large
// batch: each phase with CUDA events (every rank's, summed over ranks; the ranks run
// concurrently on the one GPU, so a phase's events can include other ranks' work), and the
// whole step of all ranks as one captured CUDA graph, against the single-device attention.
#include "bench/bench_cp.h"

#include "step/rank_rows.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <vector>

#include "thdcp/comm_device/shared_gpu.h"
#include "thdcp/cp/cuda.h"
#include "thdcp/core/cuda_check.h"
#include "thdcp/plan/rank_split.h"
#include "thdcp/plan/segment_table.h"
#include "thdcp/testing/compare.h"
#include "thdcp/testing/device_buffer.h"
#include "thdcp/testing/thread_barrier.h"
#include "thdcp/testing/workload.h"

namespace thdcp::tools {

namespace {

using cuda::DeviceBuffer;


struct RankBuffers {
  DeviceBuffer q, k, v, dout, out, dq, dk, dv, lse, max_logit, cu, cup, workspace;
};

size_t tensor_bytes(int64_t rows, int64_t heads, int64_t dim, DType dtype) {
  return static_cast<size_t>(rows * heads * dim) * dtype_size(dtype);
}

// One rank's buffers of a problem: local tensors, lse, max_logit, layout arrays of
// `offsets` entries, the plan's workspace.
RankBuffers make_rank_buffers(const cp::Problem& p, size_t offsets) {
  const int64_t local = p.local_rows();
  auto tensor = [&](int64_t heads) { return DeviceBuffer(tensor_bytes(local, heads, p.head_dim, p.dtype)); };
  return RankBuffers{tensor(p.q_heads), tensor(p.kv_heads), tensor(p.kv_heads), tensor(p.q_heads),
                     tensor(p.q_heads), tensor(p.q_heads), tensor(p.kv_heads), tensor(p.kv_heads),
                     DeviceBuffer(sizeof(float) * static_cast<size_t>(local * p.q_heads)),
                     DeviceBuffer(sizeof(float) * static_cast<size_t>(p.q_heads)),
                     DeviceBuffer(sizeof(int32_t) * offsets), DeviceBuffer(sizeof(int32_t) * offsets),
                     DeviceBuffer(cp::cuda_workspace_size(p))};
}

ThdTensor view(const DeviceBuffer& b, const cp::Problem& p, int64_t heads) {
  return ThdTensor{b.data(), p.dtype, p.local_rows(), heads, p.head_dim};
}

// What a timed step runs.
enum class Pass { kForward = 0, kForwardBackward = 1, kForwardBackwardKeptKv = 2 };

void step(cp::CudaPlan& plan, RankBuffers& b, const cp::Problem& p, cudaStream_t stream, Pass pass) {
  const DeviceLayout layout{b.cu.as<int32_t>(), b.cup.as<int32_t>(), p.capacity};
  plan.forward(layout,
               ForwardTensors{view(b.q, p, p.q_heads), view(b.k, p, p.kv_heads), view(b.v, p, p.kv_heads),
                                  view(b.out, p, p.q_heads), b.lse.as<float>(), b.max_logit.as<float>()},
               stream);
  if (pass == Pass::kForward) return;
  plan.backward(layout,
                BackwardTensors{view(b.q, p, p.q_heads), view(b.k, p, p.kv_heads), view(b.v, p, p.kv_heads),
                                    view(b.out, p, p.q_heads), view(b.dout, p, p.q_heads), b.lse.as<float>(),
                                    view(b.dq, p, p.q_heads), view(b.dk, p, p.kv_heads), view(b.dv, p, p.kv_heads)},
                stream, pass == Pass::kForwardBackwardKeptKv ? cp::KvSource::kFromForward : cp::KvSource::kGather);
}

}  // namespace

bool verify_cp(int cp, const std::vector<int64_t>& lengths, const Mask& mask, const char* mask_name, int q_heads,
               int kv_heads, int head_dim, DType dtype, uint64_t seed) {
  const BatchLayout layout = make_layout(lengths, cp, Capacity{static_cast<int>(lengths.size()) + 1,
                                                               make_layout(lengths, cp).total_rows()});
  const LayoutView view_ = layout.view();
  const int64_t rows = layout.total_rows();
  HostTensor q(dtype, rows, q_heads, head_dim), k(dtype, rows, kv_heads, head_dim), v(dtype, rows, kv_heads, head_dim),
      dout(dtype, rows, q_heads, head_dim);
  fill_normal(q, seed + 1);
  fill_normal(k, seed + 2);
  fill_normal(v, seed + 3);
  fill_normal(dout, seed + 4);
  const SegmentTable table = build_segment_table(view_, mask);
  HostTensor out_ref(dtype, rows, q_heads, head_dim), dq_ref(dtype, rows, q_heads, head_dim),
      dk_ref(dtype, rows, kv_heads, head_dim), dv_ref(dtype, rows, kv_heads, head_dim);
  std::vector<float> lse_ref(static_cast<size_t>(rows * q_heads)), max_ref(static_cast<size_t>(q_heads));
  cpu::attention_forward(table, q.view(), k.view(), v.view(), out_ref.view(), lse_ref.data(), max_ref.data());
  cpu::attention_backward(table, q.view(), k.view(), v.view(), out_ref.view(), dout.view(), lse_ref.data(),
                          dq_ref.view(), dk_ref.view(), dv_ref.view());

  cp::Problem p;
  p.cp = cp;
  p.capacity = Capacity{layout.num_seqs(), rows};
  p.mask = mask;
  p.q_heads = q_heads;
  p.kv_heads = kv_heads;
  p.head_dim = head_dim;
  p.dtype = dtype;
  HostTensor out(dtype, rows, q_heads, head_dim), dq(dtype, rows, q_heads, head_dim), dk(dtype, rows, kv_heads, head_dim),
      dv(dtype, rows, kv_heads, head_dim);
  run_shared_gpu(cp, [&](DeviceCommunicator& comm) {
    const int rank = comm.rank();
    const int64_t local = p.local_rows();
    RankBuffers b = make_rank_buffers(p, layout.cu_seqlens.size());
    for (auto [host, device] : {std::make_pair(&q, &b.q), std::make_pair(&k, &b.k), std::make_pair(&v, &b.v),
                                std::make_pair(&dout, &b.dout)}) {
      const HostTensor part = split_for_rank(*host, view_, cp, rank);
      device->upload(part.data(), device->bytes());
    }
    b.cu.upload(layout.cu_seqlens.data(), b.cu.bytes());
    b.cup.upload(layout.cu_seqlens_padded.data(), b.cup.bytes());
    for (DeviceBuffer* o : {&b.out, &b.dq, &b.dk, &b.dv}) o->poison();
    cudaStream_t stream;
    THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cp::CudaPlan plan(comm, p, AttentionOptions{}, b.workspace.data(), b.workspace.bytes());
    step(plan, b, p, stream, Pass::kForwardBackward);
    comm.synchronize(stream, 120);
    THDCP_CHECK_CUDA(cudaStreamDestroy(stream));
    for (auto [host, device, heads] : {std::make_tuple(&out, &b.out, q_heads), std::make_tuple(&dq, &b.dq, q_heads),
                                       std::make_tuple(&dk, &b.dk, kv_heads), std::make_tuple(&dv, &b.dv, kv_heads)}) {
      HostTensor part(dtype, local, heads, head_dim);
      device->download(part.data(), device->bytes());
      thdcp::merge_from_rank(part.data(), host->data(), part.row_bytes(), view_, cp, rank);
    }
  });
  bool ok = true;
  for (auto [name, got, ref, rounded] : {std::make_tuple("out", &out, &out_ref, 1), std::make_tuple("dq", &dq, &dq_ref, 2),
                                         std::make_tuple("dk", &dk, &dk_ref, 2), std::make_tuple("dv", &dv, &dv_ref, 2)}) {
    const Comparison c = compare_values(got->data(), dtype, ref->data(), dtype, got->numel(),
                                        derive_tensor_core_tolerance(dtype, rounded));
    std::printf("verify cp=%d %-7s %-10s %s\n", cp, mask_name, name, c.summary().c_str());
    ok = ok && c.passed();
  }
  return ok;
}

CpTiming time_cp(int cp, const std::vector<int64_t>& lengths, const Mask& mask, int q_heads, int kv_heads,
                 int head_dim, DType dtype, uint64_t seed, int warmup, int iters) {
  const BatchLayout layout = make_layout(lengths, cp, Capacity{static_cast<int>(lengths.size()) + 1,
                                                               make_layout(lengths, cp).total_rows()});
  cp::Problem p;
  p.cp = cp;
  p.capacity = Capacity{layout.num_seqs(), layout.total_rows()};
  p.mask = mask;
  p.q_heads = q_heads;
  p.kv_heads = kv_heads;
  p.head_dim = head_dim;
  p.dtype = dtype;
  CpTiming result;
  result.rows = layout.total_rows();
  ThreadBarrier barrier(cp);
  cudaStream_t origin;
  THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&origin, cudaStreamNonBlocking));
  cudaEvent_t fork, start, stop;
  THDCP_CHECK_CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  THDCP_CHECK_CUDA(cudaEventCreate(&start));
  THDCP_CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<cudaEvent_t> joins(static_cast<size_t>(cp));
  for (cudaEvent_t& e : joins) THDCP_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  std::mutex mutex;
  for (Pass pass : {Pass::kForward, Pass::kForwardBackward, Pass::kForwardBackwardKeptKv}) {
    const bool backward = pass != Pass::kForward;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cp::Timings& phases = result.phases[static_cast<int>(pass)];
    run_shared_gpu(cp, [&](DeviceCommunicator& comm) {
      RankBuffers b = make_rank_buffers(p, layout.cu_seqlens.size());
      // Timing needs values that are not zeros, not a particular batch.
      for (DeviceBuffer* t : {&b.q, &b.k, &b.v, &b.dout}) {
        HostTensor block(dtype, 1, 1, static_cast<int64_t>(std::min<size_t>(t->bytes() / dtype_size(dtype), 1 << 22)));
        fill_normal(block, seed + static_cast<uint64_t>(comm.rank()));
        const size_t chunk = static_cast<size_t>(block.numel()) * dtype_size(dtype);
        for (size_t at = 0; at < t->bytes(); at += chunk) {
          THDCP_CHECK_CUDA(cudaMemcpy(t->as<unsigned char>() + at, block.data(), std::min(chunk, t->bytes() - at),
                                      cudaMemcpyHostToDevice));
        }
      }
      b.cu.upload(layout.cu_seqlens.data(), b.cu.bytes());
      b.cup.upload(layout.cu_seqlens_padded.data(), b.cup.bytes());
      cudaStream_t stream;
      THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      cp::CudaPlan plan(comm, p, AttentionOptions{}, b.workspace.data(), b.workspace.bytes());
      plan.enable_phase_timing();
      comm.warm_up(stream);
      // Phases: eager steps, events on this rank's stream, summed over the timed steps.
      for (int i = 0; i < warmup; ++i) step(plan, b, p, stream, pass);
      comm.synchronize(stream, 120);
      cp::Timings mine;
      for (int i = 0; i < iters; ++i) {
        cp::Timings one;
        step(plan, b, p, stream, Pass::kForward);
        comm.synchronize(stream, 120);
        plan.add_phase_timings(one);
        if (backward) {
          plan.backward(DeviceLayout{b.cu.as<int32_t>(), b.cup.as<int32_t>(), p.capacity},
                        BackwardTensors{view(b.q, p, q_heads), view(b.k, p, kv_heads), view(b.v, p, kv_heads),
                                            view(b.out, p, q_heads), view(b.dout, p, q_heads), b.lse.as<float>(),
                                            view(b.dq, p, q_heads), view(b.dk, p, kv_heads), view(b.dv, p, kv_heads)},
                        stream,
                        pass == Pass::kForwardBackwardKeptKv ? cp::KvSource::kFromForward : cp::KvSource::kGather);
          comm.synchronize(stream, 120);
          plan.add_phase_timings(one);
        }
        for (int ph = 0; ph < static_cast<int>(cp::Phase::kCount); ++ph) mine.seconds[ph] += one.seconds[ph] / iters;
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        for (int ph = 0; ph < static_cast<int>(cp::Phase::kCount); ++ph) phases.seconds[ph] += mine.seconds[ph];
      }
      // The whole step of every rank as one graph, from a plan without phase timing (which
      // runs a step in program order on one stream): its collectives overlap the attention.
      cp::CudaPlan overlapped(comm, p, AttentionOptions{}, b.workspace.data(), b.workspace.bytes());
      barrier.wait();
      if (comm.rank() == 0) {
        THDCP_CHECK_CUDA(cudaStreamBeginCapture(origin, cudaStreamCaptureModeGlobal));
        THDCP_CHECK_CUDA(cudaEventRecord(fork, origin));
      }
      barrier.wait();
      THDCP_CHECK_CUDA(cudaStreamWaitEvent(stream, fork, 0));
      step(overlapped, b, p, stream, pass);
      THDCP_CHECK_CUDA(cudaEventRecord(joins[comm.rank()], stream));
      barrier.wait();
      if (comm.rank() == 0) {
        for (cudaEvent_t e : joins) THDCP_CHECK_CUDA(cudaStreamWaitEvent(origin, e, 0));
        THDCP_CHECK_CUDA(cudaStreamEndCapture(origin, &graph));
        THDCP_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        for (int i = 0; i < warmup; ++i) THDCP_CHECK_CUDA(cudaGraphLaunch(exec, origin));
        std::vector<float> ms(static_cast<size_t>(iters));
        for (int i = 0; i < iters; ++i) {
          THDCP_CHECK_CUDA(cudaEventRecord(start, origin));
          THDCP_CHECK_CUDA(cudaGraphLaunch(exec, origin));
          THDCP_CHECK_CUDA(cudaEventRecord(stop, origin));
          THDCP_CHECK_CUDA(cudaEventSynchronize(stop));
          THDCP_CHECK_CUDA(cudaEventElapsedTime(&ms[static_cast<size_t>(i)], start, stop));
        }
        std::sort(ms.begin(), ms.end());
        result.graph_ms[static_cast<int>(pass)] = ms[ms.size() / 2];
        THDCP_CHECK_CUDA(cudaGraphExecDestroy(exec));
        THDCP_CHECK_CUDA(cudaGraphDestroy(graph));
      }
      barrier.wait();
      THDCP_CHECK_CUDA(cudaStreamDestroy(stream));
    });
  }
  for (cudaEvent_t e : joins) cudaEventDestroy(e);
  cudaEventDestroy(fork);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(origin);
  return result;
}

}  // namespace thdcp::tools
