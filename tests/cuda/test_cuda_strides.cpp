// Strided THD tensors on the CUDA backend: q, k, v as views of one packed QKV buffer (and
// dq, dk, dv of one packed dQKV buffer), head-major views ([H, T, D] memory), rows
// interleaved with heads and padded views give the same bits as contiguous copies, forward
// and deterministic backward; bad strides and overlapping outputs throw naming the tensor
// before anything is written.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "support/cuda/cuda_test.h"
#include "support/cuda/device_step.h"
#include "support/cuda/one_shot.h"
#include "support/cuda/placed_group.h"
#include "support/expect_error.h"
#include "support/strided_views.h"
#include "thdcp/core/error.h"
#include "thdcp/cuda/attention.h"
#include "thdcp/cuda/reorder.h"
#include "thdcp/plan/layout.h"
#include "thdcp/testing/workload.h"

namespace thdcp::test {
namespace {

// A batch of the given lengths in a capacity with room to spare, its device table (single
// device) and the metadata it was built from.
struct Batch {
  BatchLayout layout;
  DeviceBuffer cu_seqlens, cu_seqlens_padded, segments;
  cuda::DeviceSegmentTable table;

  Batch(const std::vector<int64_t>& lengths, const Mask& mask) {
    const BatchLayout plain = make_layout(lengths, 1);
    layout = make_layout(lengths, 1, Capacity{static_cast<int>(lengths.size()) + 2, plain.total_rows() + 24});
    const int max_seqs = layout.num_seqs();
    cu_seqlens = DeviceBuffer(sizeof(int32_t) * (max_seqs + 1));
    cu_seqlens_padded = DeviceBuffer(sizeof(int32_t) * (max_seqs + 1));
    segments = DeviceBuffer(sizeof(Segment) * table_entries(cuda::TableKind::kSingleDevice, max_seqs));
    cu_seqlens.upload(layout.cu_seqlens.data(), cu_seqlens.bytes());
    cu_seqlens_padded.upload(layout.cu_seqlens_padded.data(), cu_seqlens_padded.bytes());
    table = build_segment_table(cu_seqlens.as<int32_t>(), cu_seqlens_padded.as<int32_t>(), max_seqs,
                                layout.total_rows(), mask, segments.as<Segment>(), nullptr);
  }
  int64_t rows() const { return table.q_rows; }
};

// A device buffer of `rows` rows of `row_stride` elements holding several THD tensors side by
// side (heads `head_stride` apart), every byte 0xff (NaN) until written: padding between
// heads and rows stays NaN, so a kernel that reads it poisons its result and one that
// writes it is caught.
struct Packed {
  DType dtype;
  int64_t rows, row_stride, head_stride, head_dim;
  DeviceBuffer buffer;

  Packed(DType dtype_, int64_t rows_, int64_t row_stride_, int64_t head_stride_, int64_t head_dim_)
      : dtype(dtype_), rows(rows_), row_stride(row_stride_), head_stride(head_stride_), head_dim(head_dim_),
        buffer(static_cast<size_t>(rows_ * row_stride_) * dtype_size(dtype_)) {
    buffer.poison();
  }
  // The view of `heads` heads from head slot `first_head` on.
  ThdTensor view(int64_t first_head, int64_t heads) const {
    ThdTensor t;
    t.data = static_cast<unsigned char*>(buffer.data()) +
             static_cast<size_t>(first_head * head_stride) * dtype_size(dtype);
    t.dtype = dtype;
    t.tokens = rows;
    t.heads = heads;
    t.head_dim = head_dim;
    t.row_stride = row_stride;
    t.head_stride = head_stride;
    return t;
  }
  std::vector<unsigned char> download() const { return download_vector<unsigned char>(buffer, buffer.bytes()); }
};

// Host copies between a contiguous tensor and the strided view `first_head` of a packed
// host image.
void scatter(const HostTensor& src, std::vector<unsigned char>& image, const Packed& p, int64_t first_head) {
  const size_t element = dtype_size(src.dtype());
  const size_t row_bytes = static_cast<size_t>(src.head_dim()) * element;
  for (int64_t r = 0; r < src.tokens(); ++r) {
    for (int64_t h = 0; h < src.heads(); ++h) {
      std::memcpy(image.data() + static_cast<size_t>(r * p.row_stride + (first_head + h) * p.head_stride) * element,
                  static_cast<const unsigned char*>(src.data()) +
                      static_cast<size_t>((r * src.heads() + h) * src.head_dim()) * element,
                  row_bytes);
    }
  }
}

HostTensor gather(const std::vector<unsigned char>& image, const Packed& p, int64_t first_head, int64_t heads) {
  HostTensor out(p.dtype, p.rows, heads, p.head_dim);
  const size_t element = dtype_size(p.dtype);
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      std::memcpy(static_cast<unsigned char*>(out.data()) + static_cast<size_t>((r * heads + h) * p.head_dim) * element,
                  image.data() + static_cast<size_t>(r * p.row_stride + (first_head + h) * p.head_stride) * element,
                  static_cast<size_t>(p.head_dim) * element);
    }
  }
  return out;
}

// Bytes of the image that no view of `used_heads` heads covers (head padding, row tail)
// still hold the poison: nothing wrote outside the tensors.
bool padding_untouched(const std::vector<unsigned char>& image, const Packed& p, int64_t used_heads) {
  const size_t element = dtype_size(p.dtype);
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t e = 0; e < p.row_stride; ++e) {
      const int64_t head = e / p.head_stride;
      const bool covered = head < used_heads && e % p.head_stride < p.head_dim;
      if (covered) continue;
      const unsigned char* byte = image.data() + static_cast<size_t>(r * p.row_stride + e) * element;
      for (size_t b = 0; b < element; ++b) {
        if (byte[b] != 0xff) return false;
      }
    }
  }
  return true;
}

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.numel() == b.numel() && a.dtype() == b.dtype() &&
         std::memcmp(a.data(), b.data(), static_cast<size_t>(a.numel()) * dtype_size(a.dtype())) == 0;
}

struct StrideCase {
  std::string name;
  DType dtype;
  int head_dim;
  Mask mask;
  int head_padding;  // head_stride = head_dim + head_padding
};

std::ostream& operator<<(std::ostream& os, const StrideCase& c) { return os << c.name; }

std::vector<StrideCase> stride_cases() {
  std::vector<StrideCase> cases;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (int head_dim : {64, 128}) {
      for (bool causal : {true, false}) {
        for (int padding : {0, 8}) {
          StrideCase c;
          c.dtype = dtype;
          c.head_dim = head_dim;
          c.mask = causal ? Mask::causal() : Mask::window(40, 7);
          c.head_padding = padding;
          c.name = std::string(dtype == DType::kBFloat16 ? "bf16" : "fp16") + "_d" + std::to_string(head_dim) +
                   (causal ? "_causal" : "_window40_7") + (padding ? "_head_stride_d_plus_8" : "_packed");
          cases.push_back(c);
        }
      }
    }
  }
  return cases;
}

// The inputs of a stride test (GQA 4: Hq 8, Hkv 2; N(0, 1) values from `seed`) and their
// forward and deterministic backward as contiguous tensors: what the strided views must give
// bit for bit.
struct ContiguousRun {
  static constexpr int64_t kHq = 8, kHkv = 2;
  Batch batch;
  HostTensor q, k, v, dout;
  DeviceStep step;
  DeviceBuffer fwd_ws, bwd_ws;

  // The batch of every stride test (lengths 100, 1, 257, 0, 64, 130) under `mask`, values seeded
  // by the case's name.
  ContiguousRun(const Mask& mask, DType dtype, int64_t d, const std::string& name)
      : batch({100, 1, 257, 0, 64, 130}, mask),
        q(dtype, batch.rows(), kHq, d),
        k(dtype, batch.rows(), kHkv, d),
        v(dtype, batch.rows(), kHkv, d),
        dout(dtype, batch.rows(), kHq, d),
        step(dtype, batch.rows(), batch.rows(), HeadShape{kHq, kHkv, d}, dtype),
        fwd_ws(forward_workspace_size(batch.table)),
        bwd_ws(backward_workspace_size(batch.table, kHq, kHkv, d, dtype)) {
    const uint64_t seed = std::hash<std::string>{}(name);
    fill_normal(q, seed + 1);
    fill_normal(k, seed + 2);
    fill_normal(v, seed + 3);
    fill_normal(dout, seed + 4);
    step.upload_inputs(q, k, v, dout);
    step.poison_outputs();
    attention_step(batch.table, step, fwd_ws, bwd_ws, nullptr);
    THDCP_CHECK_CUDA(cudaDeviceSynchronize());
  }
};

class CudaStrides : public CudaTest, public ::testing::WithParamInterface<StrideCase> {};

// GQA 4: Hq = 8, Hkv = 2. Packed QKV [T, Hq + 2 Hkv, D] (head slots head_stride apart);
// with head padding, out and dout are strided too (rows 16 elements longer than needed).
TEST_P(CudaStrides, PackedViewsMatchContiguousBitForBit) {
  const StrideCase& c = GetParam();
  constexpr int64_t kHq = 8, kHkv = 2;
  const ContiguousRun run(c.mask, c.dtype, c.head_dim, c.name);
  const int64_t d = c.head_dim, head_stride = d + c.head_padding, rows = run.batch.rows();
  const HostTensor &q = run.q, &k = run.k, &v = run.v, &dout = run.dout;

  // The same through strided views.
  const int64_t slots = kHq + 2 * kHkv;
  Packed qkv(c.dtype, rows, slots * head_stride, head_stride, d);
  std::vector<unsigned char> image = qkv.download();
  scatter(q, image, qkv, 0);
  scatter(k, image, qkv, kHq);
  scatter(v, image, qkv, kHq + kHkv);
  qkv.buffer.upload(image.data(), image.size());
  const int64_t extra = c.head_padding ? 16 : 0;
  Packed out_s(c.dtype, rows, kHq * head_stride + extra, head_stride, d);
  Packed dout_s(c.dtype, rows, kHq * head_stride + extra, head_stride, d);
  std::vector<unsigned char> dout_image = dout_s.download();
  scatter(dout, dout_image, dout_s, 0);
  dout_s.buffer.upload(dout_image.data(), dout_image.size());
  Packed dqkv(c.dtype, rows, slots * head_stride, head_stride, d);
  DeviceBuffer lse_s(sizeof(float) * kHq * rows), max_s(sizeof(float) * kHq);
  lse_s.poison();
  max_s.poison();

  const ConstThdTensor q_view = qkv.view(0, kHq), k_view = qkv.view(kHq, kHkv), v_view = qkv.view(kHq + kHkv, kHkv);
  attention_forward(run.batch.table, q_view, k_view, v_view, out_s.view(0, kHq), lse_s.as<float>(), max_s.as<float>(),
                    run.fwd_ws.data(), run.fwd_ws.bytes(), nullptr);
  attention_backward(run.batch.table, q_view, k_view, v_view, out_s.view(0, kHq), dout_s.view(0, kHq), lse_s.as<float>(),
                     dqkv.view(0, kHq), dqkv.view(kHq, kHkv), dqkv.view(kHq + kHkv, kHkv), run.bwd_ws.data(),
                     run.bwd_ws.bytes(), nullptr);
  THDCP_CHECK_CUDA(cudaDeviceSynchronize());

  const std::vector<unsigned char> out_image = out_s.download();
  EXPECT_TRUE(same_bytes(gather(out_image, out_s, 0, kHq), run.step.out.download())) << "out differs";
  EXPECT_TRUE(padding_untouched(out_image, out_s, kHq)) << "the forward wrote outside out's view";
  EXPECT_TRUE(download_vector<float>(lse_s, kHq * rows) == download_vector<float>(run.step.lse, kHq * rows))
      << "lse differs";
  EXPECT_TRUE(download_vector<float>(max_s, kHq) == download_vector<float>(run.step.max_logit, kHq))
      << "max_logit differs";
  const std::vector<unsigned char> grad_image = dqkv.download();
  EXPECT_TRUE(same_bytes(gather(grad_image, dqkv, 0, kHq), run.step.dq.download())) << "dq differs";
  EXPECT_TRUE(same_bytes(gather(grad_image, dqkv, kHq, kHkv), run.step.dk.download())) << "dk differs";
  EXPECT_TRUE(same_bytes(gather(grad_image, dqkv, kHq + kHkv, kHkv), run.step.dv.download())) << "dv differs";
  EXPECT_TRUE(padding_untouched(grad_image, dqkv, slots)) << "the backward wrote into dQKV's head padding";
  EXPECT_TRUE(qkv.download() == image) << "the calls wrote into the inputs";

  // deterministic = false: the portable kernels' fused pass accumulates dQ with atomics in a
  // contiguous workspace and casts it into the strided dq (on Hopper the sm90 passes run
  // again). dK/dV are still added once per segment: same bits. dQ's fp32 sums may differ in
  // order, so within a few units of the storage dtype.
  AttentionOptions fast;
  fast.deterministic = false;
  DeviceBuffer fast_ws(backward_workspace_size(run.batch.table, kHq, kHkv, d, c.dtype, fast));
  DeviceTensor dq_f(c.dtype, rows, kHq, d), dk_f(c.dtype, rows, kHkv, d), dv_f(c.dtype, rows, kHkv, d);
  attention_backward(run.batch.table, run.step.q.cview(), run.step.k.cview(), run.step.v.cview(),
                     run.step.out.cview(), run.step.dout.cview(), run.step.lse.as<float>(), dq_f.view(),
                     dk_f.view(), dv_f.view(), fast_ws.data(), fast_ws.bytes(), nullptr, fast);
  dqkv.buffer.poison();
  attention_backward(run.batch.table, q_view, k_view, v_view, out_s.view(0, kHq), dout_s.view(0, kHq), lse_s.as<float>(),
                     dqkv.view(0, kHq), dqkv.view(kHq, kHkv), dqkv.view(kHq + kHkv, kHkv), fast_ws.data(),
                     fast_ws.bytes(), nullptr, fast);
  THDCP_CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<unsigned char> fast_image = dqkv.download();
  EXPECT_TRUE(same_bytes(gather(fast_image, dqkv, kHq, kHkv), dk_f.download())) << "dk differs (deterministic=false)";
  EXPECT_TRUE(same_bytes(gather(fast_image, dqkv, kHq + kHkv, kHkv), dv_f.download()))
      << "dv differs (deterministic=false)";
  EXPECT_TRUE(padding_untouched(fast_image, dqkv, slots)) << "the fused backward wrote into dQKV's head padding";
  const HostTensor dq_strided = gather(fast_image, dqkv, 0, kHq);
  const HostTensor dq_reference = dq_f.download();
  double max_abs = 0.0;
  for (int64_t i = 0; i < dq_reference.numel(); ++i) {
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(dq_reference.get(i))));
  }
  const double tolerance = 4.0 * dtype_unit_roundoff(c.dtype) * max_abs;
  for (int64_t i = 0; i < dq_reference.numel(); ++i) {
    ASSERT_LE(std::fabs(static_cast<double>(dq_strided.get(i)) - dq_reference.get(i)), tolerance)
        << "dq element " << i << " (deterministic=false): strided " << dq_strided.get(i) << ", contiguous "
        << dq_reference.get(i);
  }

  // fp32 dq may be strided too (stored by the dQ pass directly); fp32 dk/dv stay run.step.
  if (c.head_padding) {
    Packed dq32(DType::kFloat32, rows, kHq * head_stride, head_stride, d);
    DeviceTensor dq32_c(DType::kFloat32, rows, kHq, d), dk32(DType::kFloat32, rows, kHkv, d),
        dv32(DType::kFloat32, rows, kHkv, d);
    DeviceBuffer ws32(backward_workspace_size(run.batch.table, kHq, kHkv, d, DType::kFloat32));
    attention_backward(run.batch.table, run.step.q.cview(), run.step.k.cview(), run.step.v.cview(),
                       run.step.out.cview(), run.step.dout.cview(), run.step.lse.as<float>(), dq32_c.view(),
                       dk32.view(), dv32.view(), ws32.data(), ws32.bytes(), nullptr);
    attention_backward(run.batch.table, q_view, k_view, v_view, out_s.view(0, kHq), dout_s.view(0, kHq), lse_s.as<float>(),
                       dq32.view(0, kHq), dk32.view(), dv32.view(), ws32.data(), ws32.bytes(), nullptr);
    THDCP_CHECK_CUDA(cudaDeviceSynchronize());
    const std::vector<unsigned char> dq32_image = dq32.download();
    EXPECT_TRUE(same_bytes(gather(dq32_image, dq32, 0, kHq), dq32_c.download())) << "fp32 dq differs";
    EXPECT_TRUE(padding_untouched(dq32_image, dq32, kHq)) << "the backward wrote into fp32 dq's head padding";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaStrides, ::testing::ValuesIn(stride_cases()),
                         [](const ::testing::TestParamInfo<StrideCase>& param_info) { return param_info.param.name; });

// The arrangements users hand over (support/strided_views.h), inputs and outputs apart:
// head-major [H, T, D] memory (transformers' K/V from its cache, a slice of a longer cache),
// rows interleaved with heads, padded rows and heads.
struct ArrangementCase {
  std::string name;
  DType dtype;
  int head_dim;
  Mask mask;
  Arrangement inputs, outputs;
};

std::ostream& operator<<(std::ostream& os, const ArrangementCase& c) { return os << c.name; }

std::vector<ArrangementCase> arrangement_cases() {
  const std::pair<Arrangement, Arrangement> pairs[] = {{Arrangement::kHeadMajor, Arrangement::kContiguous},
                                                       {Arrangement::kContiguous, Arrangement::kHeadMajor},
                                                       {Arrangement::kHeadMajor, Arrangement::kHeadMajor},
                                                       {Arrangement::kInterleaved, Arrangement::kPadded},
                                                       {Arrangement::kPadded, Arrangement::kInterleaved}};
  const std::pair<const char*, Mask> masks[] = {
      {"causal", Mask::causal()}, {"window40_7", Mask::window(40, 7)}, {"full", Mask::full()}};
  std::vector<ArrangementCase> cases;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (int head_dim : {64, 128}) {
      for (const auto& [mask_name, mask] : masks) {
        for (const auto& [in, out] : pairs) {
          cases.push_back(ArrangementCase{std::string(dtype == DType::kBFloat16 ? "bf16" : "fp16") + "_d" +
                                              std::to_string(head_dim) + "_" + mask_name + "_in_" +
                                              arrangement_name(in) + "_out_" + arrangement_name(out),
                                          dtype, head_dim, mask, in, out});
        }
      }
    }
  }
  return cases;
}

class CudaViewArrangements : public CudaTest, public ::testing::WithParamInterface<ArrangementCase> {};

// GQA 4 (Hq = 8, Hkv = 2). Forward and deterministic backward on the views give the bits of
// the same calls on contiguous tensors; nothing is written between the output views and the
// inputs keep their bytes. Runs the Hopper kernels on Hopper (TMA maps heads outermost for
// head-major q, k, v) and, under the portable_kernels. prefix, the mma.sync ones.
TEST_P(CudaViewArrangements, ForwardAndBackwardMatchContiguousBitForBit) {
  const ArrangementCase& c = GetParam();
  constexpr int64_t kHq = 8, kHkv = 2;
  const ContiguousRun run(c.mask, c.dtype, c.head_dim, c.name);
  const int64_t d = c.head_dim, rows = run.batch.rows();
  const HostTensor &q = run.q, &k = run.k, &v = run.v, &dout = run.dout;

  PlacedGroup qkv(c.inputs, c.dtype, rows, {kHq, kHkv, kHkv}, d), dout_s(c.inputs, c.dtype, rows, {kHq}, d);
  PlacedGroup out_s(c.outputs, c.dtype, rows, {kHq}, d), grads(c.outputs, c.dtype, rows, {kHq, kHkv, kHkv}, d);
  scatter_into(q, qkv.host(0));
  scatter_into(k, qkv.host(1));
  scatter_into(v, qkv.host(2));
  scatter_into(dout, dout_s.host(0));
  const std::vector<unsigned char> inputs_before = qkv.image;
  for (PlacedGroup* p : {&qkv, &dout_s, &out_s, &grads}) p->upload();
  DeviceBuffer lse(sizeof(float) * kHq * rows), max_logit(sizeof(float) * kHq);
  lse.poison();
  max_logit.poison();
  attention_forward(run.batch.table, qkv.on_device(0), qkv.on_device(1), qkv.on_device(2), out_s.on_device(0),
                    lse.as<float>(), max_logit.as<float>(), run.fwd_ws.data(), run.fwd_ws.bytes(), nullptr);
  attention_backward(run.batch.table, qkv.on_device(0), qkv.on_device(1), qkv.on_device(2), out_s.on_device(0),
                     dout_s.on_device(0), lse.as<float>(), grads.on_device(0), grads.on_device(1), grads.on_device(2),
                     run.bwd_ws.data(), run.bwd_ws.bytes(), nullptr);
  THDCP_CHECK_CUDA(cudaDeviceSynchronize());
  for (PlacedGroup* p : {&qkv, &out_s, &grads}) p->download();

  EXPECT_TRUE(same_bytes(gather_from(out_s.host(0)), run.step.out.download())) << "out differs";
  EXPECT_TRUE(download_vector<float>(lse, kHq * rows) == download_vector<float>(run.step.lse, kHq * rows))
      << "lse differs";
  EXPECT_TRUE(download_vector<float>(max_logit, kHq) == download_vector<float>(run.step.max_logit, kHq))
      << "max_logit differs";
  EXPECT_TRUE(same_bytes(gather_from(grads.host(0)), run.step.dq.download())) << "dq differs";
  EXPECT_TRUE(same_bytes(gather_from(grads.host(1)), run.step.dk.download())) << "dk differs";
  EXPECT_TRUE(same_bytes(gather_from(grads.host(2)), run.step.dv.download())) << "dv differs";
  EXPECT_TRUE(poison_kept_outside(out_s.image, out_s.host_views())) << "the forward wrote outside out's view";
  EXPECT_TRUE(poison_kept_outside(grads.image, grads.host_views())) << "the backward wrote outside dq, dk, dv";
  EXPECT_TRUE(qkv.image == inputs_before) << "the calls wrote into q, k or v";
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaViewArrangements, ::testing::ValuesIn(arrangement_cases()),
                         [](const ::testing::TestParamInfo<ArrangementCase>& param_info) {
                           return param_info.param.name;
                         });

class CudaPackRows : public CudaTest {};

// cuda::pack_rows (the send buffer of CP's gather from a strided local K or V) gives the dense
// rows of any view, in 16-, 8-, 4- and 2-byte words (views shifted off 16-byte boundaries),
// and writes nothing past them.
TEST_F(CudaPackRows, DenseRowsOfAnyView) {
  for (Arrangement a : all_arrangements()) {
    for (int64_t shift : {0, 8, 4, 2}) {  // bytes off a 16-byte boundary
      SCOPED_TRACE(std::string(arrangement_name(a)) + " shifted by " + std::to_string(shift) + " bytes");
      const int64_t rows = 37, heads = 2, head_dim = 64;
      PlacedGroup g(a, DType::kBFloat16, rows, {heads}, head_dim);
      HostTensor x(DType::kBFloat16, rows, heads, head_dim);
      fill_normal(x, 3 + static_cast<uint64_t>(shift));
      g.image.resize(g.image.size() + 16, 0xff);
      g.device = DeviceBuffer(g.image.size());
      auto shifted = [&](ThdTensor t) {
        t.data = static_cast<unsigned char*>(t.data) + shift;
        return t;
      };
      scatter_into(x, shifted(g.host(0)));
      g.upload();
      DeviceBuffer dense(static_cast<size_t>(x.numel()) * 2 + 16);
      dense.poison();
      cuda::pack_rows(shifted(g.on_device(0)), dense.data(), nullptr);
      THDCP_CHECK_CUDA(cudaDeviceSynchronize());
      const std::vector<unsigned char> got = download_vector<unsigned char>(dense, dense.bytes());
      EXPECT_EQ(0, std::memcmp(got.data(), x.data(), static_cast<size_t>(x.numel()) * 2));
      for (size_t i = static_cast<size_t>(x.numel()) * 2; i < got.size(); ++i) ASSERT_EQ(got[i], 0xff) << i;
    }
  }
}

class CudaBadStrides : public CudaTest {};

// Bad strides are caught on the host, before anything is enqueued: the poisoned outputs
// keep their poison.
TEST_F(CudaBadStrides, ThrowNamingTheTensorBeforeWriting) {
  constexpr int64_t kHq = 4, kHkv = 2, kD = 64;
  const Batch batch({50, 70}, Mask::causal());
  const int64_t rows = batch.rows();
  DeviceStep step(DType::kBFloat16, rows, rows, HeadShape{kHq, kHkv, kD}, DType::kBFloat16);
  DeviceBuffer fwd_ws(forward_workspace_size(batch.table));
  DeviceBuffer bwd_ws(backward_workspace_size(batch.table, kHq, kHkv, kD, DType::kBFloat16));
  // A buffer big enough for any view below.
  DeviceBuffer wide(static_cast<size_t>(rows * 4 * kHq * kD) * 2);
  step.poison_outputs();
  const ConstThdTensor q = step.q.cview(), k = step.k.cview(), v = step.v.cview();
  const ThdTensor out = step.out.view(), dq = step.dq.view(), dk = step.dk.view(), dv = step.dv.view();

  auto forward = [&](ConstThdTensor q_, ConstThdTensor k_, ConstThdTensor v_, ThdTensor out_) {
    return error_of([&] {
      attention_forward(batch.table, q_, k_, v_, out_, step.lse.as<float>(), step.max_logit.as<float>(),
                        fwd_ws.data(), fwd_ws.bytes(), nullptr);
    });
  };
  auto backward = [&](ThdTensor dq_, ThdTensor dk_, ThdTensor dv_) {
    return error_of([&] {
      attention_backward(batch.table, q, k, v, out, step.dout.cview(), step.lse.as<float>(), dq_, dk_, dv_,
                         bwd_ws.data(), bwd_ws.bytes(), nullptr);
    });
  };
  auto view_of = [&](int64_t heads, int64_t row_stride, int64_t head_stride) {
    return ThdTensor{wide.data(), DType::kBFloat16, rows, heads, kD, row_stride, head_stride};
  };

  // Not a multiple of 16 bytes (8 elements of bf16).
  expect_contains(forward(q, view_of(kHkv, 204, 0), v, out),
                  "k.row_stride=204 is not a multiple of 8 elements (16 bytes of bf16)");
  expect_contains(forward(q, k, view_of(kHkv, 2 * 76, 76), out), "v.head_stride=76 is not a multiple of 8 elements");
  ConstThdTensor misaligned = view_of(kHkv, 0, 0);
  misaligned.data = static_cast<const unsigned char*>(misaligned.data) + 8;
  expect_contains(forward(q, misaligned, v, out), "is not 16-byte aligned");
  // The heads of a row beyond 32-bit offsets.
  expect_contains(forward(q, view_of(kHkv, 128, int64_t{1} << 31), v, out),
                  "(heads - 1) * head_stride + head_dim = 2147483712 is above 2^31 elements");
  // Outputs that overlap themselves or an input (inputs may overlap: read only).
  expect_contains(forward(q, k, v, view_of(kHq, kHq * kD - 8, kD)),
                  "with row_stride=248 and head_stride=64: its elements");
  expect_contains(forward(q, k, v, view_of(kHq, 4 * kHq * kD, kD - 8)),
                  "head_stride=56: its elements (row 0, head 0, d 56) and (row 0, head 1, d 0) share an address");
  expect_contains(forward(q, k, v, ThdTensor{const_cast<void*>(q.data), q.dtype, q.tokens, q.heads, q.head_dim}),
                  "out and q share memory");
  expect_contains(forward(q, view_of(kHkv, -8, 0), v, out), "k has row_stride=-8");
  // Backward outputs.
  expect_contains(backward(view_of(kHq, kHq * kD + 4, kD), dk, dv), "dq.row_stride=260");
  expect_contains(backward(dq, view_of(kHkv, 2 * kHkv * kD, 2 * kD), view_of(kHkv, kHkv * kD, kD - 16)),
                  "with row_stride=128 and head_stride=48: its elements");
  expect_contains(backward(dq, dk, dk), "dk and dv share memory");
  // fp32 dk/dv are the accumulators: contiguous only.
  DeviceBuffer ws32(backward_workspace_size(batch.table, kHq, kHkv, kD, DType::kFloat32));
  DeviceBuffer dk32(static_cast<size_t>(rows * 2 * kHkv * kD) * 4), dv32(static_cast<size_t>(rows * kHkv * kD) * 4);
  const ThdTensor dk32_strided{dk32.data(), DType::kFloat32, rows, kHkv, kD, 2 * kHkv * kD, 0};
  const ThdTensor dv32_view{dv32.data(), DType::kFloat32, rows, kHkv, kD};
  expect_contains(error_of([&] {
                    attention_backward(batch.table, q, k, v, out, step.dout.cview(), step.lse.as<float>(), dq,
                                       dk32_strided, dv32_view, ws32.data(), ws32.bytes(), nullptr);
                  }),
                  "dk is fp32 and strided");

  THDCP_CHECK_CUDA(cudaDeviceSynchronize());
  EXPECT_TRUE(still_poisoned(step)) << "by a call that threw";
}

}  // namespace
}  // namespace thdcp::test
