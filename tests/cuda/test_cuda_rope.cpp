// The CUDA RoPE plan against the CPU reference (both pair layouts, both CP layouts, partial
// rotary, start offsets, a caller's table, cp 1..4 every rank, bf16/fp16, packed-QKV strided
// views, the 16-byte and the element path), forward and backward; head-major, padded and interleaved views equal to
// contiguous tensors bit for bit; placeholder rows unchanged and every row finite;
// a captured launch replayed on new metadata equal to the eager one bit for bit; the table
// bound clamped and reported; argument checks.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "support/cuda/cuda_test.h"
#include "support/cuda/rope_shape.h"
#include "support/expect_error.h"
#include "support/strided_views.h"
#include "thdcp/cpu/rope.h"
#include "thdcp/cuda/rope.h"
#include "thdcp/plan/layout.h"
#include "thdcp/testing/compare.h"
#include "thdcp/testing/workload.h"

namespace thdcp::test {
namespace {

// GPU against CPU from theta: the device's sincosf and the host's cosf/sinf differ by a few
// fp32 ulp, which moves a result across a rounding boundary at most once: one storage ulp
// (<= 2u relative), plus an absolute floor for values near 0 (subnormal fp16, cancellation).
Tolerance theta_tolerance(DType dtype) { return Tolerance{2 * dtype_unit_roundoff(dtype), std::ldexp(1.0, -16)}; }

bool same_bits(const HostTensor& a, const HostTensor& b) {
  return a.numel() == b.numel() && a.dtype() == b.dtype() &&
         std::memcmp(a.data(), b.data(), static_cast<size_t>(a.numel()) * dtype_size(a.dtype())) == 0;
}

bool all_finite(const HostTensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (!std::isfinite(t.get(i))) return false;
  }
  return true;
}

struct RopeCase {
  const char* name;
  int cp;
  RopeLayout layout;
  int64_t rotary_dim;  // 0: head_dim
  int64_t head_dim;
  int64_t q_heads, kv_heads;
  DType dtype;
  bool table;       // cos/sin from a caller's table built by cpu::rope_table (same bits as theta on the CPU)
  bool offsets;     // per-sequence start offsets
  bool packed_qkv;  // q and k are views of one [T, Hq + 2 Hkv, D] buffer
  CpLayout cp_layout = CpLayout::kDualChunk;  // which global rows a rank's rows are
};

const std::vector<RopeCase>& rope_cases() {
  static const std::vector<RopeCase> cases = {
      {"cp1_halfsplit_bf16_d128", 1, RopeLayout::kHalfSplit, 0, 128, 8, 2, DType::kBFloat16, false, false, false},
      {"cp2_interleaved_fp16_d64_partial32_offsets", 2, RopeLayout::kInterleaved, 32, 64, 4, 4, DType::kFloat16,
       false, true, false},
      {"cp4_halfsplit_bf16_d256_table_offsets", 4, RopeLayout::kHalfSplit, 0, 256, 2, 1, DType::kBFloat16, true, true,
       false},
      {"cp2_interleaved_bf16_d128_packed_qkv", 2, RopeLayout::kInterleaved, 0, 128, 8, 2, DType::kBFloat16, false,
       true, true},
      {"cp2_halfsplit_fp16_d128_partial64_packed_table", 2, RopeLayout::kHalfSplit, 64, 128, 4, 1, DType::kFloat16,
       true, false, true},
      // Element path: 12 pairs of a half-split head do not fill 16-byte words.
      {"cp4_halfsplit_fp16_d72_partial24_packed", 4, RopeLayout::kHalfSplit, 24, 72, 3, 1, DType::kFloat16, false,
       true, true},
      {"cp1_interleaved_bf16_d6_table", 1, RopeLayout::kInterleaved, 0, 6, 2, 2, DType::kBFloat16, true, false,
       false},
      {"cp3_halfsplit_bf16_d64_q_only", 3, RopeLayout::kHalfSplit, 0, 64, 4, 0, DType::kBFloat16, false, true, false},
      // The contiguous layout: positions follow the rank's piece of the packed rows.
      {"contiguous_cp3_halfsplit_bf16_d128_offsets", 3, RopeLayout::kHalfSplit, 0, 128, 4, 2, DType::kBFloat16, false,
       true, false, CpLayout::kContiguous},
      {"contiguous_cp4_interleaved_fp16_d64_table_packed", 4, RopeLayout::kInterleaved, 0, 64, 4, 1, DType::kFloat16,
       true, false, true, CpLayout::kContiguous},
  };
  return cases;
}

// Lengths with an empty document, a length-1 one, lengths not multiples of 2*cp; capacity with
// spare placeholders and slack rows; in the rows of `cp_layout`.
BatchLayout case_layout(int cp, bool second, CpLayout cp_layout = CpLayout::kDualChunk) {
  std::vector<int64_t> lengths = {0, 1, 17, 300, 2, 45};
  if (second) lengths = {120, 3, 0, 211, 9};
  const Capacity capacity{9, cp_padded_length(400, cp) + 8 * cp};
  return cp_layout == CpLayout::kDualChunk ? make_layout(lengths, cp, capacity)
                                           : make_contiguous_layout(lengths, cp, capacity);
}

std::vector<int32_t> case_offsets(int max_seqs, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> offsets;
  for (int b = 0; b < max_seqs; ++b) offsets.push_back(static_cast<int32_t>(rng.uniform_int(0, 500)));
  return offsets;
}

// q and k of one rank on the host and the device: separate tensors or views of packed QKV.
struct QkBuffers {
  const RopeCase& c;
  int64_t rows;
  std::vector<HostTensor> host;  // packed: {qkv}; separate: {q, k}
  std::vector<DeviceTensor> device;

  QkBuffers(const RopeCase& c_, int64_t rows_, uint64_t seed) : c(c_), rows(rows_) {
    if (c.packed_qkv) {
      host.emplace_back(c.dtype, rows, c.q_heads + 2 * c.kv_heads, c.head_dim);
    } else {
      host.emplace_back(c.dtype, rows, c.q_heads, c.head_dim);
      host.emplace_back(c.dtype, rows, c.kv_heads, c.head_dim);
    }
    for (HostTensor& h : host) {
      fill_normal(h, seed++);
      device.emplace_back(h);
    }
  }

  static ThdTensor view(void* data, const HostTensor& whole, int64_t first_head, int64_t heads) {
    const int64_t row_stride = whole.heads() * whole.head_dim();
    void* at = static_cast<unsigned char*>(data) + first_head * whole.head_dim() * dtype_size(whole.dtype());
    return ThdTensor{at, whole.dtype(), whole.tokens(), heads, whole.head_dim(), row_stride, whole.head_dim()};
  }
  ThdTensor q(bool on_device) {
    return view(on_device ? device[0].buffer.data() : host[0].data(), host[0], 0, c.q_heads);
  }
  ThdTensor k(bool on_device) {
    if (c.kv_heads == 0) return ThdTensor{};
    if (c.packed_qkv) return view(on_device ? device[0].buffer.data() : host[0].data(), host[0], c.q_heads, c.kv_heads);
    return view(on_device ? device[1].buffer.data() : host[1].data(), host[1], 0, c.kv_heads);
  }
  std::vector<HostTensor> download() const {
    std::vector<HostTensor> r;
    for (const DeviceTensor& d : device) r.push_back(d.download());
    return r;
  }
  void upload(const std::vector<HostTensor>& values) {
    for (size_t i = 0; i < device.size(); ++i) device[i].buffer.upload(values[i].data(), device[i].bytes());
  }
};

// Everything one rank of a case needs on the device: metadata, offsets, table, the plan.
struct RankSetup {
  const RopeCase& c;
  int rank;
  BatchLayout layout;
  std::vector<int32_t> offsets;
  std::vector<float> cos, sin;
  int64_t table_rows = 0;
  DeviceBuffer cu, cup, offsets_device, cos_device, sin_device;

  RankSetup(const RopeCase& c_, int rank_, const BatchLayout& layout_, uint64_t seed)
      : c(c_), rank(rank_), layout(layout_),
        cu(sizeof(int32_t) * layout_.cu_seqlens.size()), cup(sizeof(int32_t) * layout_.cu_seqlens.size()),
        offsets_device(sizeof(int32_t) * static_cast<size_t>(layout_.num_seqs())) {
    if (c.offsets) offsets = case_offsets(layout.num_seqs(), seed);
    load(layout, offsets);
    if (c.table) {
      const RopeConfig config = rope_config();
      const int64_t pairs = rope_rotary_dim(config, c.head_dim) / 2;
      table_rows = layout.total_rows() + (c.offsets ? 501 : 0);
      cos.resize(static_cast<size_t>(table_rows * pairs));
      sin.resize(cos.size());
      cpu::rope_table(config, c.head_dim, table_rows, cos.data(), sin.data());
      cos_device = DeviceBuffer(cos.size() * sizeof(float));
      sin_device = DeviceBuffer(sin.size() * sizeof(float));
      cos_device.upload(cos.data(), cos_device.bytes());
      sin_device.upload(sin.data(), sin_device.bytes());
    }
  }

  // New metadata of the same capacity (outside any graph).
  void load(const BatchLayout& new_layout, const std::vector<int32_t>& new_offsets) {
    layout = new_layout;
    offsets = new_offsets;
    cu.upload(layout.cu_seqlens.data(), cu.bytes());
    cup.upload(layout.cu_seqlens_padded.data(), cup.bytes());
    if (!offsets.empty()) offsets_device.upload(offsets.data(), offsets_device.bytes());
  }

  RopeConfig rope_config() const { return RopeConfig{c.layout, c.rotary_dim, c.offsets ? 500000.0f : 10000.0f}; }
  RopeTable host_table() const { return c.table ? RopeTable{cos.data(), sin.data(), table_rows} : RopeTable{}; }
  const int32_t* host_offsets() const { return offsets.empty() ? nullptr : offsets.data(); }
  const int32_t* device_offsets() const { return offsets.empty() ? nullptr : offsets_device.as<int32_t>(); }
  DeviceLayout device_layout() const {
    return DeviceLayout{cu.as<int32_t>(), cup.as<int32_t>(), Capacity{layout.num_seqs(), layout.total_rows()}};
  }

  cuda::RopeShape shape() const {
    cuda::RopeShape s = rope_shape(c.cp, rank, Capacity{layout.num_seqs(), layout.total_rows()},
                                   HeadShape{c.q_heads, c.kv_heads, c.head_dim}, c.dtype, rope_config());
    if (c.table) s.table = RopeTable{cos_device.as<float>(), sin_device.as<float>(), table_rows};
    s.with_start_offsets = c.offsets;
    s.cp_layout = c.cp_layout;
    return s;
  }

  // The CPU reference, in place on host buffers laid out as the device ones.
  void reference(QkBuffers& b, bool backward) const {
    const auto rotate = backward ? cpu::rope_backward : cpu::rope_forward;
    rotate(layout.view(), c.cp, rank, rope_config(), b.q(false), host_offsets(), host_table(), c.cp_layout);
    if (c.kv_heads > 0) {
      rotate(layout.view(), c.cp, rank, rope_config(), b.k(false), host_offsets(), host_table(), c.cp_layout);
    }
  }
};

::testing::AssertionResult matches_reference(const RopeCase& c, const std::vector<HostTensor>& gpu,
                                             const std::vector<HostTensor>& cpu) {
  for (size_t i = 0; i < gpu.size(); ++i) {
    if (!all_finite(gpu[i])) return ::testing::AssertionFailure() << "buffer " << i << " holds a non-finite value";
    if (c.table) {
      // The same fp32 arithmetic on the same cos/sin: the same bits.
      if (!same_bits(gpu[i], cpu[i])) return ::testing::AssertionFailure() << "buffer " << i << " differs (table)";
      continue;
    }
    const Tolerance tol = theta_tolerance(c.dtype);
    const Comparison cmp = compare_values(gpu[i].data(), c.dtype, cpu[i].data(), c.dtype, gpu[i].numel(), tol);
    if (!cmp.passed()) return ::testing::AssertionFailure() << "buffer " << i << ": " << cmp.summary();
  }
  return ::testing::AssertionSuccess();
}

// The plan's forward (or backward) in place on `buffers` (on the device), against the CPU
// reference on their host copies; returns what the GPU gave.
std::vector<HostTensor> rotate_and_check(const cuda::RopePlan& plan, const RankSetup& setup, QkBuffers& buffers,
                                         bool backward, cudaStream_t stream) {
  if (backward) {
    plan.backward(setup.device_layout(), setup.device_offsets(), buffers.q(true), buffers.k(true), stream);
  } else {
    plan.forward(setup.device_layout(), setup.device_offsets(), buffers.q(true), buffers.k(true), stream);
  }
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
  const std::vector<HostTensor> gpu = buffers.download();
  setup.reference(buffers, backward);
  EXPECT_TRUE(matches_reference(setup.c, gpu, buffers.host)) << (backward ? "backward" : "forward");
  return gpu;
}

// Rows (local) of sequences with no valid token.
std::vector<int64_t> empty_sequence_rows(const BatchLayout& layout, int cp, int rank, CpLayout cp_layout) {
  std::vector<int64_t> rows;
  for (int64_t row = 0; row < layout.total_rows() / cp; ++row) {
    const int b = cp_layout_row(cp_layout, layout.cu_seqlens_padded.data(), layout.num_seqs(), cp, rank, row).sequence;
    if (layout.cu_seqlens[b + 1] == layout.cu_seqlens[b]) rows.push_back(row);
  }
  return rows;
}

class CudaRope : public CudaTest, public ::testing::WithParamInterface<int> {};

TEST_P(CudaRope, ForwardAndBackwardMatchCpuOnEveryRank) {
  const RopeCase& c = rope_cases()[static_cast<size_t>(GetParam())];
  const BatchLayout layout = case_layout(c.cp, false, c.cp_layout);
  cudaStream_t stream = nullptr;
  THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int rank = 0; rank < c.cp; ++rank) {
    SCOPED_TRACE(std::string(c.name) + " rank " + std::to_string(rank));
    RankSetup setup(c, rank, layout, 40 + rank);
    const cuda::RopePlan plan(setup.shape());
    QkBuffers buffers(c, layout.total_rows() / c.cp, 100 * rank + 1);
    const std::vector<HostTensor> input = buffers.download();
    plan.check_tensors(buffers.q(true), buffers.k(true));
    THDCP_CHECK_CUDA(cudaDeviceSynchronize());  // the uploads ran on the legacy stream

    const std::vector<HostTensor> forward = rotate_and_check(plan, setup, buffers, false, stream);

    // Rows of empty sequences (placeholders, slack) turn by angle 0: unchanged.
    for (int64_t row : empty_sequence_rows(layout, c.cp, rank, c.cp_layout)) {
      for (size_t i = 0; i < forward.size(); ++i) {
        const int64_t elements = forward[i].heads() * c.head_dim;
        for (int64_t e = 0; e < elements; ++e) {
          ASSERT_EQ(forward[i].get(row * elements + e), input[i].get(row * elements + e)) << "empty row " << row;
        }
      }
    }

    // The backward on the GPU's forward result, against the CPU backward on the same values.
    buffers.host = forward;
    THDCP_CHECK_CUDA(cudaDeviceSynchronize());
    const std::vector<HostTensor> backward = rotate_and_check(plan, setup, buffers, true, stream);
    // And it undoes the forward up to two roundings to storage.
    const double u = dtype_unit_roundoff(c.dtype);
    const Tolerance round_trip{2 * u, 4 * u};
    for (size_t i = 0; i < backward.size(); ++i) {
      const Comparison cmp =
          compare_values(backward[i].data(), c.dtype, input[i].data(), c.dtype, input[i].numel(), round_trip);
      EXPECT_TRUE(cmp.passed()) << "backward(forward(x)) vs x, buffer " << i << ": " << cmp.summary();
    }
  }
  THDCP_CHECK_CUDA(cudaStreamDestroy(stream));
}

std::string case_name(const ::testing::TestParamInfo<int>& param) {
  return rope_cases()[static_cast<size_t>(param.param)].name;
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaRope, ::testing::Range(0, static_cast<int>(rope_cases().size())), case_name);

class CudaRopeStrides : public CudaTest {};

// q and k as head-major views ([H, T, D] memory, a slice of a longer cache), padded views
// and rows interleaved with heads rotate like contiguous tensors, bit for bit (the kernel's
// arithmetic does not depend on where an element sits), and nothing between their elements
// is written. Forward and backward, both pair layouts, bf16 and fp16, head dims 64 and 128.
TEST_F(CudaRopeStrides, StridedViewsEqualContiguousBitForBit) {
  for (Arrangement arrangement : {Arrangement::kHeadMajor, Arrangement::kPadded, Arrangement::kInterleaved}) {
    for (const RopeCase& base : {rope_cases()[0], rope_cases()[1]}) {
      RopeCase c = base;
      c.kv_heads = 2;  // the interleaved arrangement applies to two-head tensors
      SCOPED_TRACE(std::string(c.name) + " " + arrangement_name(arrangement));
      const BatchLayout layout = case_layout(c.cp, false, c.cp_layout);
      const int64_t rows = layout.total_rows() / c.cp;
      RankSetup setup(c, 0, layout, 7);
      const cuda::RopePlan plan(setup.shape());
      for (bool backward : {false, true}) {
        QkBuffers contiguous(c, rows, 11);
        const GroupLayout at = arrange(arrangement, rows, {c.q_heads, c.kv_heads}, c.head_dim);
        std::vector<unsigned char> image = poisoned_image(c.dtype, at.elements);
        const ThdTensor q_host = placed_view(image.data(), c.dtype, rows, c.q_heads, c.head_dim, at.placements[0]);
        const ThdTensor k_host = placed_view(image.data(), c.dtype, rows, c.kv_heads, c.head_dim, at.placements[1]);
        scatter_into(contiguous.host[0], q_host);
        scatter_into(contiguous.host[1], k_host);
        DeviceBuffer device(image.size());
        device.upload(image.data(), image.size());
        const ThdTensor q = placed_view(device.data(), c.dtype, rows, c.q_heads, c.head_dim, at.placements[0]);
        const ThdTensor k = placed_view(device.data(), c.dtype, rows, c.kv_heads, c.head_dim, at.placements[1]);
        plan.check_tensors(q, k);
        if (backward) {
          plan.backward(setup.device_layout(), setup.device_offsets(), q, k, nullptr);
          plan.backward(setup.device_layout(), setup.device_offsets(), contiguous.q(true), contiguous.k(true),
                        nullptr);
        } else {
          plan.forward(setup.device_layout(), setup.device_offsets(), q, k, nullptr);
          plan.forward(setup.device_layout(), setup.device_offsets(), contiguous.q(true), contiguous.k(true), nullptr);
        }
        THDCP_CHECK_CUDA(cudaDeviceSynchronize());
        device.download(image.data(), image.size());
        const std::vector<HostTensor> expected = contiguous.download();
        EXPECT_TRUE(same_bits(gather_from(q_host), expected[0])) << "q, backward " << backward;
        EXPECT_TRUE(same_bits(gather_from(k_host), expected[1])) << "k, backward " << backward;
        EXPECT_TRUE(poison_kept_outside(image, {q_host, k_host}));
      }
    }
  }
}

class CudaRopeGraph : public CudaTest {};

// The forward captured once (global capture mode), replayed after new metadata, offsets and
// data of the same capacity were loaded: equal to the eager forward on them, bit for bit,
// and to the CPU reference.
TEST_F(CudaRopeGraph, ReplayOnNewMetadataEqualsEager) {
  for (int index : {1, 2, 5}) {
    const RopeCase& c = rope_cases()[static_cast<size_t>(index)];
    const int rank = c.cp - 1;
    SCOPED_TRACE(c.name);
    RankSetup setup(c, rank, case_layout(c.cp, false, c.cp_layout), 7);
    const cuda::RopePlan plan(setup.shape());
    QkBuffers buffers(c, setup.layout.total_rows() / c.cp, 3);
    cudaStream_t stream = nullptr;
    THDCP_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    auto enqueue = [&] {
      plan.forward(setup.device_layout(), setup.device_offsets(), buffers.q(true),
                   buffers.k(true), stream);
    };
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    THDCP_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    enqueue();
    THDCP_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    THDCP_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));

    const BatchLayout second = case_layout(c.cp, true, c.cp_layout);
    setup.load(second, c.offsets ? case_offsets(second.num_seqs(), 77) : std::vector<int32_t>());
    QkBuffers fresh(c, buffers.rows, 500);
    const std::vector<HostTensor> input = fresh.download();
    buffers.upload(input);
    THDCP_CHECK_CUDA(cudaDeviceSynchronize());  // the uploads ran on the legacy stream
    THDCP_CHECK_CUDA(cudaGraphLaunch(exec, stream));
    THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
    const std::vector<HostTensor> replayed = buffers.download();

    buffers.upload(input);
    THDCP_CHECK_CUDA(cudaDeviceSynchronize());
    enqueue();
    THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));
    const std::vector<HostTensor> eager = buffers.download();
    for (size_t i = 0; i < eager.size(); ++i) EXPECT_TRUE(same_bits(replayed[i], eager[i])) << "buffer " << i;
    buffers.host = input;
    setup.reference(buffers, false);
    EXPECT_TRUE(matches_reference(c, replayed, buffers.host));
    THDCP_CHECK_CUDA(cudaGraphExecDestroy(exec));
    THDCP_CHECK_CUDA(cudaGraphDestroy(graph));
    THDCP_CHECK_CUDA(cudaStreamDestroy(stream));
  }
}

class CudaRopeTableBound : public CudaTest {};

// With start offsets the plan cannot bound the positions: a position past the table (or
// below 0) is clamped to the nearest table row and reported in the status word; in range,
// the status stays 0.
TEST_F(CudaRopeTableBound, PositionsOutsideTheTableAreClampedAndReported) {
  const RopeCase c{"bound", 2, RopeLayout::kHalfSplit, 0, 64, 2, 1, DType::kBFloat16, true, true, false};
  const BatchLayout layout = case_layout(c.cp, false, c.cp_layout);
  const int rank = 1;
  const RopeConfig config{c.layout, 0, 10000.0f};
  const int64_t table_rows = 200, pairs = c.head_dim / 2;
  std::vector<float> cos(static_cast<size_t>(table_rows * pairs)), sin(cos.size());
  cpu::rope_table(config, c.head_dim, table_rows, cos.data(), sin.data());
  DeviceBuffer cos_device(cos.size() * sizeof(float)), sin_device(sin.size() * sizeof(float));
  cos_device.upload(cos.data(), cos_device.bytes());
  sin_device.upload(sin.data(), sin_device.bytes());
  DeviceBuffer cu(sizeof(int32_t) * layout.cu_seqlens.size()), cup(cu.bytes());
  cu.upload(layout.cu_seqlens.data(), cu.bytes());
  cup.upload(layout.cu_seqlens_padded.data(), cup.bytes());
  DeviceBuffer status(sizeof(int)), offsets_device(sizeof(int32_t) * static_cast<size_t>(layout.num_seqs()));
  THDCP_CHECK_CUDA(cudaMemset(status.data(), 0, sizeof(int)));

  cuda::RopeShape shape = rope_shape(c.cp, rank, Capacity{layout.num_seqs(), layout.total_rows()},
                                     HeadShape{c.q_heads, c.kv_heads, c.head_dim}, c.dtype, config);
  shape.table = RopeTable{cos_device.as<float>(), sin_device.as<float>(), table_rows};
  shape.with_start_offsets = true;
  shape.status = status.as<int>();
  const cuda::RopePlan plan(shape);
  ASSERT_LT(table_rows, layout.total_rows()) << "the case needs a table shorter than max_tokens";

  auto run = [&](const std::vector<int32_t>& offsets, QkBuffers& buffers) {
    offsets_device.upload(offsets.data(), offsets_device.bytes());
    plan.forward(DeviceLayout{cu.as<int32_t>(), cup.as<int32_t>(), shape.capacity}, offsets_device.as<int32_t>(),
                 buffers.q(true), buffers.k(true), nullptr);
    THDCP_CHECK_CUDA(cudaDeviceSynchronize());
    return download_vector<int>(status, 1)[0];
  };

  // In range: a layout without the 300-token sequence; the longest (45 tokens, padded to 48)
  // gets offset 100, so no position exceeds 47 + 100 < 200.
  std::vector<int32_t> offsets(static_cast<size_t>(layout.num_seqs()), 0);
  {
    const BatchLayout small = make_layout({0, 1, 17, 2, 45}, c.cp, Capacity{layout.num_seqs(), layout.total_rows()});
    cu.upload(small.cu_seqlens.data(), cu.bytes());
    cup.upload(small.cu_seqlens_padded.data(), cup.bytes());
    offsets[4] = 100;
    QkBuffers buffers(c, layout.total_rows() / c.cp, 9);
    EXPECT_EQ(run(offsets, buffers), 0) << "no position was outside the table";
    const RopeTable table{cos.data(), sin.data(), table_rows};
    cpu::rope_forward(small.view(), c.cp, rank, config, buffers.q(false), offsets.data(), table);
    cpu::rope_forward(small.view(), c.cp, rank, config, buffers.k(false), offsets.data(), table);
    EXPECT_TRUE(matches_reference(c, buffers.download(), buffers.host));
  }

  // Out of range above (the 300-token sequence, offset 50: positions up to 299 + 50) and below
  // (sequence 5, offset -1000): clamped to rows 199 and 0, and reported.
  cu.upload(layout.cu_seqlens.data(), cu.bytes());
  cup.upload(layout.cu_seqlens_padded.data(), cup.bytes());
  offsets.assign(offsets.size(), 0);
  offsets[3] = 50;
  offsets[5] = -1000;
  QkBuffers buffers(c, layout.total_rows() / c.cp, 10);
  const std::vector<HostTensor> input = buffers.download();
  EXPECT_EQ(run(offsets, buffers), cuda::kRopeStatusPositionOutsideTable);
  const std::vector<HostTensor> got = buffers.download();
  for (const HostTensor& t : got) EXPECT_TRUE(all_finite(t));
  // Expected: a table extended past 199 with copies of row 199 for the high side; for the low
  // side, sequence 5's rows all clamp to row 0 (angle 0): unchanged. The CPU reference runs
  // with offset 0 for sequence 5 and those rows are then taken from the input.
  const int64_t extended_rows = layout.total_rows() + 51;
  std::vector<float> cos_ext(static_cast<size_t>(extended_rows * pairs)), sin_ext(cos_ext.size());
  for (int64_t t = 0; t < extended_rows; ++t) {
    const int64_t from = t < table_rows ? t : table_rows - 1;
    for (int64_t i = 0; i < pairs; ++i) {
      cos_ext[static_cast<size_t>(t * pairs + i)] = cos[static_cast<size_t>(from * pairs + i)];
      sin_ext[static_cast<size_t>(t * pairs + i)] = sin[static_cast<size_t>(from * pairs + i)];
    }
  }
  std::vector<int32_t> cpu_offsets = offsets;
  cpu_offsets[5] = 0;
  buffers.host = input;
  const RopeTable extended{cos_ext.data(), sin_ext.data(), extended_rows};
  cpu::rope_forward(layout.view(), c.cp, rank, config, buffers.q(false), cpu_offsets.data(), extended);
  cpu::rope_forward(layout.view(), c.cp, rank, config, buffers.k(false), cpu_offsets.data(), extended);
  std::vector<HostTensor> expected = std::move(buffers.host);
  for (int64_t row = 0; row < layout.total_rows() / c.cp; ++row) {
    if (dual_chunk_row(layout.cu_seqlens_padded.data(), layout.num_seqs(), c.cp, rank, row).sequence != 5) continue;
    for (size_t i = 0; i < expected.size(); ++i) {
      const int64_t elements = expected[i].heads() * c.head_dim;
      for (int64_t e = 0; e < elements; ++e) expected[i].set(row * elements + e, input[i].get(row * elements + e));
    }
  }
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(same_bits(got[i], expected[i])) << "buffer " << i;
}

void make_plan(const cuda::RopeShape& shape) { const cuda::RopePlan plan(shape); }

// Shape errors are raised before the plan touches the device (these cases run without a GPU).
TEST(CudaRopePlanChecks, BadShapesNameTheArgument) {
  cuda::RopeShape good;
  good.cp = 2;
  good.rank = 1;
  good.capacity = Capacity{4, 256};
  good.q_heads = 4;
  good.kv_heads = 2;
  good.head_dim = 128;
  auto with = [&](auto change) {
    cuda::RopeShape s = good;
    change(s);
    return s;
  };
  EXPECT_THDCP_ERROR(make_plan(with([](cuda::RopeShape& s) { s.cp = 0; })), "RopeShape::cp=0 must be >= 1");
  EXPECT_THDCP_ERROR(make_plan(with([](cuda::RopeShape& s) { s.rank = 2; })), "RopeShape::rank=2 must be in [0, cp=2)");
  EXPECT_THDCP_ERROR(make_plan(with([](cuda::RopeShape& s) { s.capacity.max_tokens = 250; })),
                     "capacity.max_tokens=250 is not a multiple of 2*cp=4");
  EXPECT_THDCP_ERROR(make_plan(with([](cuda::RopeShape& s) {
                       s.cp = 3, s.rank = 0, s.cp_layout = CpLayout::kContiguous;
                     })),
                     "capacity.max_tokens=256 is not a multiple of cp=3: the contiguous layout cuts the rows into cp "
                     "equal pieces");
  EXPECT_THDCP_ERROR(make_plan(with([](cuda::RopeShape& s) { s.cp_layout = static_cast<CpLayout>(7); })),
                     "RopeShape::cp_layout=7 is not a CP layout: use kDualChunk or kContiguous");
  EXPECT_THDCP_ERROR(make_plan(with([](cuda::RopeShape& s) { s.capacity.max_seqs = 0; })),
                     "capacity.max_seqs=0 must be >= 1");
  EXPECT_THDCP_ERROR(make_plan(with([](cuda::RopeShape& s) { s.q_heads = 0; })), "RopeShape::q_heads=0");
  EXPECT_THDCP_ERROR(make_plan(with([](cuda::RopeShape& s) { s.kv_heads = -1; })), "RopeShape::kv_heads=-1");
  EXPECT_THDCP_ERROR(make_plan(with([](cuda::RopeShape& s) { s.head_dim = 320; })),
                     "RopeShape::head_dim=320 is not supported by the CUDA RoPE kernel: use [2, 256]");
  EXPECT_THDCP_ERROR(make_plan(with([](cuda::RopeShape& s) { s.dtype = DType::kFloat32; })),
                     "RopeShape::dtype=fp32");
  EXPECT_THDCP_ERROR(make_plan(with([](cuda::RopeShape& s) { s.config.rotary_dim = 33; })),
                     "RopeConfig::rotary_dim=33");
  EXPECT_THDCP_ERROR(make_plan(with([](cuda::RopeShape& s) { s.config.theta = -5.0f; })), "RopeConfig::theta=-5");
  const float fake = 0.0f;
  EXPECT_THDCP_ERROR(make_plan(with([&](cuda::RopeShape& s) { s.table = RopeTable{&fake, nullptr, 300}; })),
                     "give both (a table) or neither");
  EXPECT_THDCP_ERROR(make_plan(with([&](cuda::RopeShape& s) { s.table = RopeTable{&fake, &fake, 200}; })),
                     "RopeShape::table.rows=200 is less than capacity.max_tokens=256");
}

class CudaRopeRunChecks : public CudaTest {};

TEST_F(CudaRopeRunChecks, BadArgumentsThrowBeforeLaunch) {
  const RopeCase& c = rope_cases()[3];  // cp 2, packed QKV, offsets
  RankSetup setup(c, 0, case_layout(c.cp, false, c.cp_layout), 1);
  const cuda::RopePlan plan(setup.shape());
  QkBuffers buffers(c, setup.layout.total_rows() / c.cp, 1);
  const DeviceLayout layout = setup.device_layout();
  DeviceLayout no_cu = layout;
  no_cu.cu_seqlens = nullptr;
  DeviceLayout other_capacity = layout;
  other_capacity.capacity.max_seqs += 1;
  const int32_t* offsets = setup.device_offsets();
  const std::vector<HostTensor> before = buffers.download();
  ThdTensor q = buffers.q(true), k = buffers.k(true);

  ThdTensor short_q = q;
  short_q.tokens -= 1;
  EXPECT_THDCP_ERROR(plan.forward(layout, offsets, short_q, k, nullptr),
                     "q is [" + std::to_string(short_q.tokens) + ", 8, 128] but must be [max_tokens/cp=");
  ThdTensor fp16_k = k;
  fp16_k.dtype = DType::kFloat16;
  EXPECT_THDCP_ERROR(plan.forward(layout, offsets, q, fp16_k, nullptr), "k has dtype fp16");
  ThdTensor overlapping = q;
  overlapping.head_stride = 64;
  EXPECT_THDCP_ERROR(plan.forward(layout, offsets, overlapping, k, nullptr),
                     "and (row 0, head 1, d 0) share an address, and an output must not overlap itself");
  EXPECT_THDCP_ERROR(plan.forward(no_cu, offsets, q, k, nullptr), "layout.cu_seqlens and layout.cu_seqlens_padded must not");
  EXPECT_THDCP_ERROR(plan.forward(other_capacity, offsets, q, k, nullptr), "differs from the plan's");
  EXPECT_THDCP_ERROR(plan.forward(layout, offsets, q, q, nullptr), "kv_heads=2, head_dim=128]");
  ThdTensor k_on_q = q;
  k_on_q.heads = 2;
  EXPECT_THDCP_ERROR(plan.forward(layout, offsets, q, k_on_q, nullptr), "q and k share memory");
  ThdTensor odd = q;
  odd.data = static_cast<unsigned char*>(odd.data) + 1;
  EXPECT_THDCP_ERROR(plan.forward(layout, offsets, odd, k, nullptr), "is not aligned to its 2-byte elements");

  RopeCase no_offsets_case = c;
  no_offsets_case.offsets = false;
  RankSetup no_offsets(no_offsets_case, 0, case_layout(c.cp, false, c.cp_layout), 1);
  const cuda::RopePlan plain(no_offsets.shape());
  EXPECT_THDCP_ERROR(plain.forward(layout, offsets, q, k, nullptr), "RopeShape::with_start_offsets=false");

  RopeCase q_only_case = c;
  q_only_case.kv_heads = 0;
  RankSetup q_only(q_only_case, 0, case_layout(c.cp, false, c.cp_layout), 1);
  const cuda::RopePlan q_plan(q_only.shape());
  EXPECT_THDCP_ERROR(q_plan.forward(layout, offsets, q, k, nullptr), "plan was made with kv_heads=0");

  // A host table is refused at plan time.
  cuda::RopeShape host_table = setup.shape();
  std::vector<float> host(static_cast<size_t>(setup.layout.total_rows() * 64));
  host_table.table = RopeTable{host.data(), host.data(), setup.layout.total_rows()};
  EXPECT_THDCP_ERROR(cuda::RopePlan{host_table}, "RopeShape::table.cos");

  THDCP_CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<HostTensor> after = buffers.download();
  for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(same_bits(after[i], before[i])) << "a refused call wrote";
}

}  // namespace
}  // namespace thdcp::test
