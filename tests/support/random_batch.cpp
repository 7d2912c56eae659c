#include "support/random_batch.h"

#include <limits>

namespace thdcp::test {

Batch make_batch(const BatchLayout& layout, DType dtype, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                 uint64_t seed, int64_t v_head_dim) {
  if (v_head_dim == 0) v_head_dim = head_dim;
  Batch b;
  b.layout = layout;
  const int64_t rows = layout.total_rows();
  b.q = HostTensor(dtype, rows, q_heads, head_dim);
  b.k = HostTensor(dtype, rows, kv_heads, head_dim);
  b.v = HostTensor(dtype, rows, kv_heads, v_head_dim);
  b.dout = HostTensor(dtype, rows, q_heads, v_head_dim);
  fill_normal(b.q, seed * 4 + 1);
  fill_normal(b.k, seed * 4 + 2);
  fill_normal(b.v, seed * 4 + 3);
  fill_normal(b.dout, seed * 4 + 4);
  return b;
}

std::vector<int64_t> random_lengths(Rng& rng, int count, int64_t max_length) {
  std::vector<int64_t> lengths;
  for (int i = 0; i < count; ++i) lengths.push_back(rng.uniform_int(0, max_length));
  return lengths;
}

std::vector<float> sink_logits(int64_t heads) {
  std::vector<float> sinks(static_cast<size_t>(heads));
  for (size_t h = 0; h < sinks.size(); ++h) sinks[h] = 0.5f * static_cast<float>(h % 5) - 1.0f;
  sinks[0] = 6.0f;
  if (heads > 1) sinks[1] = -std::numeric_limits<float>::infinity();
  return sinks;
}

void poison(HostTensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, std::numeric_limits<float>::quiet_NaN());
}

void poison(std::vector<float>& v) { v.assign(v.size(), std::numeric_limits<float>::quiet_NaN()); }

::testing::AssertionResult matches(const char* name, const void* actual, DType actual_dtype, const void* reference,
                                   DType reference_dtype, int64_t n, const Tolerance& tolerance) {
  const Comparison c = compare_values(actual, actual_dtype, reference, reference_dtype, n, tolerance);
  if (c.passed()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << name << ": " << c.summary() << " (rtol " << tolerance.rtol << ", atol "
                                       << tolerance.atol_scale << " x max|ref| " << c.reference_max << "), actual "
                                       << load_as_float(actual, actual_dtype, static_cast<size_t>(c.worst_index))
                                       << " vs reference "
                                       << load_as_float(reference, reference_dtype, static_cast<size_t>(c.worst_index));
}

::testing::AssertionResult matches(const char* name, const HostTensor& actual, const HostTensor& reference,
                                   const Tolerance& tolerance) {
  if (actual.numel() != reference.numel()) {
    return ::testing::AssertionFailure() << name << ": sizes differ";
  }
  return matches(name, actual.data(), actual.dtype(), reference.data(), reference.dtype(), actual.numel(), tolerance);
}

::testing::AssertionResult matches(const char* name, const std::vector<float>& actual,
                                   const std::vector<float>& reference, const Tolerance& tolerance) {
  if (actual.size() != reference.size()) return ::testing::AssertionFailure() << name << ": sizes differ";
  return matches(name, actual.data(), DType::kFloat32, reference.data(), DType::kFloat32,
                 static_cast<int64_t>(actual.size()), tolerance);
}

std::string mask_label(const Mask& m) {
  auto part = [](int32_t w) { return w < 0 ? std::string("inf") : std::to_string(w); };
  return "L" + part(m.window_left) + "_R" + part(m.window_right);
}

std::vector<Mask> all_test_masks() {
  return {Mask::causal(),        Mask::full(),       Mask::window(16, 0),  Mask::window(16, 16),
          Mask::window(64, 200), Mask::window(7, 3), Mask::window(1000, 0)};
}

}  // namespace thdcp::test
