#include "bench/harness.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "io/args.h"
#include "step/cuda_head_dims.h"
#include "step/visible_gpus.h"
#include "thdcp/core/cuda_check.h"
#include "thdcp/testing/workload.h"

namespace thdcp::tools {

void require_gpu(const char* what) {
  std::string no_gpu;
  if (visible_gpus(&no_gpu) == 0) throw UsageError(std::string(what) + " times CUDA kernels and needs a GPU: " + no_gpu);
}

StepShape parse_bench_shape(const Args& args) {
  StepShape s;
  s.q_heads = args.get_int("q-heads", 32, 1, 1024);
  s.kv_heads = args.get_int("kv-heads", 8, 1, 1024);
  s.head_dim = args.get_int("head-dim", 128, 1, 1024);
  s.v_head_dim = args.get_int("v-head-dim", s.head_dim, 1, 1024);
  if (s.v_head_dim == s.head_dim) s.v_head_dim = 0;  // the library's "D_v = D_qk"
  s.dtype = parse_dtype(args.get("dtype", "bf16"));
  if (s.dtype != DType::kBFloat16 && s.dtype != DType::kFloat16) {
    throw UsageError(std::string("--dtype ") + dtype_name(s.dtype) + ": the CUDA kernels take bf16 or fp16");
  }
  require_cuda_head_dims(s.head_dim, s.v_head_dim);
  if (s.q_heads % s.kv_heads != 0) {
    throw UsageError("--q-heads " + std::to_string(s.q_heads) + " must be a multiple of --kv-heads " +
                     std::to_string(s.kv_heads));
  }
  return s;
}

PassFlops pass_flops(const HeadShape& heads) {
  const double d_qk = static_cast<double>(heads.head_dim), d_v = static_cast<double>(heads.value_head_dim());
  return PassFlops{2 * (d_qk + d_v), 2 * (3 * d_qk + 2 * d_v)};
}

cudaDeviceProp device_properties(int device) {
  cudaDeviceProp prop{};
  THDCP_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  return prop;
}

std::string device_text(int device, bool with_memory) {
  const cudaDeviceProp prop = device_properties(device);
  std::string text = format("%s (%d SMs, sm_%d%d", prop.name, prop.multiProcessorCount, prop.major, prop.minor);
  if (with_memory) text += format(", %.1f GiB", static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  return text + ")";
}

float elapsed_ms(const Event& start, const Event& stop) {
  float ms = 0;
  THDCP_CHECK_CUDA(cudaEventElapsedTime(&ms, start.get(), stop.get()));
  return ms;
}

std::vector<double> time_runs(const TimingLoop& loop, cudaStream_t stream, const std::function<void()>& body) {
  Event start, stop;
  std::vector<double> ms;
  for (int i = 0; i < loop.warmup + loop.iters; ++i) {
    if (loop.before) loop.before();
    THDCP_CHECK_CUDA(cudaEventRecord(start.get(), stream));
    body();
    THDCP_CHECK_CUDA(cudaEventRecord(stop.get(), stream));
    if (loop.wait) {
      loop.wait();
    } else {
      THDCP_CHECK_CUDA(cudaEventSynchronize(stop.get()));
    }
    if (i >= loop.warmup) ms.push_back(elapsed_ms(start, stop));
  }
  return ms;
}

double time_median_ms(int warmup, int iters, cudaStream_t stream, const std::function<void()>& body) {
  TimingLoop loop;
  loop.warmup = warmup;
  loop.iters = iters;
  return median(time_runs(loop, stream, body));
}

namespace {

// Calls copy(offset, count) for consecutive pieces of at most `block` of `numel` elements.
template <typename Copy>
void repeat_block(int64_t numel, int64_t block, Copy copy) {
  for (int64_t offset = 0; offset < numel; offset += block) copy(offset, std::min(block, numel - offset));
}

HostTensor random_block(DType dtype, int64_t numel, uint64_t seed, int64_t block) {
  HostTensor values(dtype, 1, 1, std::min(numel, block));
  fill_normal(values, seed);
  return values;
}

}  // namespace

void fill_random(HostTensor& tensor, uint64_t seed, int64_t block) {
  if (tensor.numel() == 0) return;
  const HostTensor values = random_block(tensor.dtype(), tensor.numel(), seed, block);
  const size_t element = dtype_size(tensor.dtype());
  auto* to = static_cast<unsigned char*>(tensor.data());
  repeat_block(tensor.numel(), values.numel(), [&](int64_t offset, int64_t count) {
    std::memcpy(to + static_cast<size_t>(offset) * element, values.data(), static_cast<size_t>(count) * element);
  });
}

void fill_random(void* device, DType dtype, int64_t numel, uint64_t seed, int64_t block, cudaStream_t stream) {
  if (numel == 0) return;
  const HostTensor values = random_block(dtype, numel, seed, block);
  const size_t element = dtype_size(dtype);
  auto* to = static_cast<unsigned char*>(device);
  repeat_block(numel, values.numel(), [&](int64_t offset, int64_t count) {
    THDCP_CHECK_CUDA(cudaMemcpyAsync(to + static_cast<size_t>(offset) * element, values.data(),
                                     static_cast<size_t>(count) * element, cudaMemcpyHostToDevice, stream));
  });
  THDCP_CHECK_CUDA(cudaStreamSynchronize(stream));  // before `values` goes
}

void fill_inputs(DeviceTensors& tensors, uint64_t seed, int64_t block, cudaStream_t stream, bool one_seed) {
  uint64_t offset = 0;
  for (const ThdTensor* t : {&tensors.q, &tensors.k, &tensors.v, &tensors.dout}) {
    offset += one_seed ? 0 : 1;
    fill_random(t->data, t->dtype, t->numel(), seed + offset, block, stream);
  }
}

Comparison compare(const HostTensor& got, const HostTensor& ref, const Tolerance& tolerance) {
  return compare_values(got.data(), got.dtype(), ref.data(), ref.dtype(), got.numel(), tolerance);
}

Comparison compare(const std::vector<float>& got, const std::vector<float>& ref, const Tolerance& tolerance) {
  return compare_values(got.data(), DType::kFloat32, ref.data(), DType::kFloat32, static_cast<int64_t>(got.size()),
                        tolerance);
}

Verification::Verification(std::string what, int tensor_width, ErrorFormat errors)
    : what_(std::move(what)), tensor_width_(tensor_width), format_(errors) {}

bool Verification::check(const std::string& tensor, const Comparison& c) {
  const std::string errors =
      format_ == ErrorFormat::kSummary
          ? c.summary()
          : format("max abs err %.3e, max rel err %.3e, %lld/%lld outside tolerance", c.max_abs_error,
                   c.max_rel_error, static_cast<long long>(c.mismatches), static_cast<long long>(c.count));
  std::printf("verify %s %-*s %s\n", what_.c_str(), tensor_width_, tensor.c_str(), errors.c_str());
  passed_ = passed_ && c.passed();
  return c.passed();
}

std::string format(const char* pattern, ...) {
  va_list args;
  va_start(args, pattern);
  va_list again;
  va_copy(again, args);
  const int length = std::vsnprintf(nullptr, 0, pattern, args);
  va_end(args);
  std::string text(static_cast<size_t>(std::max(length, 0)) + 1, '\0');
  std::vsnprintf(text.data(), text.size(), pattern, again);
  va_end(again);
  text.resize(static_cast<size_t>(std::max(length, 0)));
  return text;
}

Table::Table(Style style, std::vector<Column> columns) : style_(style), columns_(std::move(columns)) {}

std::string Table::line(const std::vector<std::string>& cells) const {
  std::string text;
  for (size_t i = 0; i < cells.size(); ++i) {
    if (style_ == Style::kMarkdown) {
      text += (i ? " | " : "| ") + cells[i];
      continue;
    }
    const Column& column = columns_[i];
    text += (i ? " " : "") + format(column.left ? "%-*s" : "%*s", column.width, cells[i].c_str());
  }
  return text + (style_ == Style::kMarkdown ? " |\n" : "\n");
}

void Table::print_header() const {
  std::vector<std::string> headers, rules;
  for (const Column& column : columns_) {
    headers.push_back(column.header);
    rules.push_back(column.left ? "---" : "---:");
  }
  std::fputs(line(headers).c_str(), stdout);
  if (style_ == Style::kMarkdown) std::fputs(line(rules).c_str(), stdout);
}

void Table::print_row(const std::vector<std::string>& cells) const { std::fputs(line(cells).c_str(), stdout); }

}  // namespace thdcp::tools
