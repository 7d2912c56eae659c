// What describes an attention call on every backend: its heads (HeadShape), a single-device
// call's problem (AttentionProblem), its tensors (ForwardTensors, BackwardTensors) and its
// options (AttentionOptions). The CPU reference, the CUDA plans, AllGather CP, RoPE, the C ABI and
// the PyTorch package all take these two types; a backend ignores the options it has no use
// for (each field says whose it is).
#pragma once

#include <cstdint>

#include "thdcp/core/dtype.h"
#include "thdcp/core/tensor.h"
#include "thdcp/plan/layout.h"
#include "thdcp/plan/mask.h"

namespace thdcp {

// The heads of a call: Hq query heads, Hkv key/value heads (GQA/MQA: Hq a multiple of Hkv),
// the q/k head dim D_qk and the value head dim D_v (v, out, dout, dv; MLA: 192 and 128).
// Shapes of every backend derive from it (a params base, as FlashAttention's Qkv_params), so
// `shape.q_heads` reads the same everywhere.
struct HeadShape {
  int64_t q_heads = 0;     // Hq
  int64_t kv_heads = 0;    // Hkv; Hq % Hkv == 0
  int64_t head_dim = 0;    // D_qk: q and k (and the default softmax scale 1/sqrt(D_qk))
  int64_t v_head_dim = 0;  // D_v: v, out, dout, dv; 0 means D_v = D_qk

  const HeadShape& heads() const { return *this; }
  // D_v as the call uses it: v_head_dim, or head_dim where v_head_dim is 0.
  int64_t value_head_dim() const { return v_head_dim != 0 ? v_head_dim : head_dim; }
};

// Throws thdcp::Error unless 1 <= Hkv, Hq is a multiple of Hkv, Hq < 2^31, D_qk >= 1 and
// v_head_dim >= 0, naming the fields as `prefix` + "q_heads" (e.g. "params->" at the C
// boundary). Backends check their own limits on D_qk and D_v: the CPU backend any multiples of
// 8 in [8, 256] (check_cpu_head_dims), the CUDA backend D_qk = D_v in {64, 96, 128, 192, 256}
// or D_qk 192 with D_v 128 (cuda::cuda_supports_head_dims).
void check_head_shape(const HeadShape& heads, const char* prefix = "");

// What a single-device attention call is planned for (cuda::Attention, the C ABI's attention
// plan): its heads, its capacity, its mask and its dtypes.
struct AttentionProblem : HeadShape {
  Capacity capacity;  // layouts of max_seqs + 1 entries; tensors of max_tokens rows
  Mask mask;
  DType dtype = DType::kBFloat16;      // q, k, v, out, dout
  DType dq_dtype = DType::kBFloat16;   // dtype or fp32
  DType dkv_dtype = DType::kBFloat16;  // dtype or fp32 (dk and dv)
};

// The tensors of one forward call, on every backend (single-device or this rank's part of a
// CP step): q [rows, Hq, D_qk], k [k_rows, Hkv, D_qk] and v [k_rows, Hkv, D_v] (a CP step:
// the rank's own rows), out [rows, Hq, D_v], lse [Hq, rows] fp32, max_logit [Hq] fp32 or null. What each call writes is said
// where it is declared (cuda::Attention, cpu::attention_forward, cp::CudaPlan).
//
// Attention sinks (gpt-oss; optional; the CPU and CUDA backends, single device and AllGather CP):
// sinks [Hq] fp32, one learnable logit per query head, in the memory space of the tensors.
// Each query row's softmax denominator gains exp(sinks[h] - m) (m the running max, the sink
// included); the sink contributes no value. The sink is an unscaled logit (softmax_scale
// does not apply to it). lse includes the sink, so a row that sees no key but has a sink has
// lse = sinks[h] and out 0. max_logit stays the max of the scaled q.k scores over allowed
// pairs, without the sink: it measures q.k for QK-clip, which a sink cannot change.
struct ForwardTensors {
  ConstThdTensor q, k, v;
  ThdTensor out;
  float* lse = nullptr;
  float* max_logit = nullptr;    // optional
  const float* sinks = nullptr;  // optional, [Hq] fp32
};

// The tensors of one backward call: the forward's (out and its lse) with dout like out, dq
// like q, dk like k and dv like v. dq: q's dtype or fp32; dk, dv: k's dtype or fp32.
struct BackwardTensors {
  ConstThdTensor q, k, v, out, dout;
  const float* lse = nullptr;
  ThdTensor dq, dk, dv;
  // CUDA plans only, optional, device int32 [k_rows]: the row of dk/dv that key row i's
  // gradient goes to (a permutation of [0, k_rows)); null: row i. AllGather CP passes the map
  // from sequence order to the ranks' order, so the gradients need no reorder before the
  // reduce-scatter.
  const int32_t* dkv_rows = nullptr;
  // Attention sinks (see ForwardTensors): the forward's sinks, or null when it had none; and
  // dsinks [Hq] fp32, null or where d(loss)/d(sink) is written (it needs sinks). Each head's
  // dsink is summed over every query row in a fixed order (deterministic); under CP over the
  // rows of every rank, every rank receiving the whole [Hq].
  const float* sinks = nullptr;
  float* dsinks = nullptr;
};

// The reference backend's arithmetic.
enum class Accumulate {
  kFloat32,  // as the GPU kernels do
  kFloat64,  // for tests that need a tighter reference
};

struct AttentionOptions {
  // Every backend: scale of q.k; 0 means 1/sqrt(head_dim) (D_qk).
  float softmax_scale = 0.0f;

  // CUDA backward. true: same bits on every run. Each fp32 dK/dV element receives at most
  // two atomic additions onto zero (one per segment that reaches the key row; every table
  // the CUDA backend builds has at most two), and two additions onto zero give the same bits
  // in either order. dQ: on Hopper (kernel_family() "sm90") at head dim 128 without a left
  // window, the dK/dV pass adds each key tile's share into fp32 accumulator tiles, the key
  // tiles of a query tile one after the other in a fixed order; otherwise dQ comes from a
  // pass of its own with no atomics.
  // false: the order of additions may vary where that is faster. With the portable kernels,
  // dQ is accumulated inside the dK/dV pass with fp32 atomics (as FlashAttention-2 does), so
  // its last bits depend on the order the blocks run in. On Hopper the deterministic kernels
  // measured faster than any-order ones, so they run for both settings (bench/RESULTS.md).
  // The CPU reference is always deterministic.
  bool deterministic = true;

  // CUDA forward, Hopper kernels: SMs the persistent forward leaves free, for work that runs
  // beside it on another stream (a collective of context parallelism: NCCL's kernels need SMs
  // of their own). The forward then runs multiprocessors - sm_margin blocks. Same results for
  // every margin. FlashAttention-3 calls the same knob sm_margin. 0 <= sm_margin < the
  // device's SM count; the portable kernels (not persistent) ignore it.
  int sm_margin = 0;

  // CUDA backward, Hopper kernels: true runs dQ in a pass of its own after the dK/dV pass
  // where the one pass would compute it beside dK and dV (head dim 128, no left window, or on
  // a single-device table one of at least 4096 keys), so that work on another stream can run
  // beside the dQ pass: AllGather CP reduce-scatters dK/dV there. Deterministic either way;
  // dQ's last bits differ between the two.
  bool separate_dq_pass = false;

  // CPU reference: fp32 (as the kernels) or fp64 arithmetic, and its worker threads (0: every
  // hardware thread).
  Accumulate accumulate = Accumulate::kFloat32;
  int num_threads = 0;
};

}  // namespace thdcp
