// Test support: random packed batches and comparisons with readable failure messages.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "support/expect_error.h"
#include "thdcp/core/error.h"
#include "thdcp/core/tensor.h"
#include "thdcp/cpu/attention.h"
#include "thdcp/plan/layout.h"
#include "thdcp/testing/compare.h"
#include "thdcp/testing/workload.h"

namespace thdcp::test {

struct Batch {
  BatchLayout layout;
  HostTensor q, k, v, dout;
};

// Random tensors for a layout: q and k of head dim `head_dim`, v and dout of `v_head_dim`
// (0: head_dim). Padding rows hold random values too: a kernel that reads them would show up
// as a mismatch.
Batch make_batch(const BatchLayout& layout, DType dtype, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                 uint64_t seed, int64_t v_head_dim = 0);

// `count` lengths drawn uniformly from [0, max_length].
std::vector<int64_t> random_lengths(Rng& rng, int count, int64_t max_length);

// Attention sinks [heads] for a test: head 0's far above every score (its rows' out shrinks
// to almost 0 and the running max starts at the sink), head 1 without one (-inf), the others
// in [-1, 1].
std::vector<float> sink_logits(int64_t heads);

// Fills a tensor / float buffer with NaN so that an unwritten element cannot pass.
void poison(HostTensor& t);
void poison(std::vector<float>& v);

// `actual` against `reference` within `tolerance` (compare_values); the failure names the
// values, the tolerance and the worst element.
::testing::AssertionResult matches(const char* name, const void* actual, DType actual_dtype, const void* reference,
                                   DType reference_dtype, int64_t n, const Tolerance& tolerance);
::testing::AssertionResult matches(const char* name, const HostTensor& actual, const HostTensor& reference,
                                   const Tolerance& tolerance);
::testing::AssertionResult matches(const char* name, const std::vector<float>& actual,
                                   const std::vector<float>& reference, const Tolerance& tolerance);

// "L<left>_R<right>" with "inf" for an unbounded side: a mask in a test's name.
std::string mask_label(const Mask& m);

// The masks every test table runs: causal, full and the windows of the issue, including
// windows wider than a chunk.
std::vector<Mask> all_test_masks();

}  // namespace thdcp::test
