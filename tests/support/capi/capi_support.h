// Test support for the C ABI: C descriptors of host tensors and layouts, params of a shape,
// status checks that also read thdcp_last_error(), byte snapshots that prove a refused call
// wrote nothing, and a rank's rows split and merged through thdcp_cp_split_ex / thdcp_cp_merge_ex.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "support/outputs.h"
#include "support/shape.h"
#include "thdcp/core/tensor.h"
#include "thdcp/plan/capacity.h"
#include "thdcp/plan/layout.h"
#include "thdcp/thdcp.h"

namespace thdcp::test {

thdcp_dtype_t c_dtype(DType dtype);
// The storage dtype of a C dtype (bf16 for THDCP_DTYPE_DEFAULT and unknown values).
DType dtype_of(thdcp_dtype_t dtype);

// The C descriptor of a contiguous host tensor (inputs are only read through it).
thdcp_tensor_t c_tensor(const HostTensor& t);

// Stores any int in an enum field, as a C caller may: C++ may not form an enum value outside
// its enumerators' range, so the bytes are copied.
template <typename Enum>
void set_raw(Enum& field, int value) {
  static_assert(sizeof(Enum) == sizeof(int), "the enums of thdcp.h are int-sized");
  std::memcpy(&field, &value, sizeof(value));
}

thdcp_layout_t c_layout(const BatchLayout& layout);

// Sets the fields that thdcp_attention_params and thdcp_cp_params share from a shape and a
// capacity: dtype, max_tokens, max_seqs, heads, head_dim, window.
template <typename Params>
void set_shape(Params& p, const Shape& s, const Capacity& capacity) {
  p.dtype = c_dtype(s.dtype);
  p.max_tokens = capacity.max_tokens;
  p.max_seqs = capacity.max_seqs;
  p.q_heads = s.q_heads;
  p.kv_heads = s.kv_heads;
  p.head_dim = s.head_dim;
  p.window_left = s.mask.window_left;
  p.window_right = s.mask.window_right;
}

// `status` is `expected`, and (for a failure) thdcp_last_error() names the function and
// contains every part.
::testing::AssertionResult status_is(thdcp_status_t status, thdcp_status_t expected,
                                     const std::vector<std::string>& parts = {});

#define EXPECT_C_OK(call) EXPECT_TRUE(::thdcp::test::status_is((call), THDCP_SUCCESS))
#define ASSERT_C_OK(call) ASSERT_TRUE(::thdcp::test::status_is((call), THDCP_SUCCESS))
// EXPECT_C_STATUS(call, THDCP_ERROR_..., "part", ...): the status and the message's parts.
#define EXPECT_C_STATUS(call, expected, ...) \
  EXPECT_TRUE(::thdcp::test::status_is((call), (expected), {__VA_ARGS__}))

// The bytes of a set of buffers, to check that a refused call left them as they were.
class Snapshot {
 public:
  Snapshot& add(const void* data, size_t bytes);
  Snapshot& add(const HostTensor& t);
  Snapshot& add(const std::vector<float>& v);

  ::testing::AssertionResult unchanged() const;

 private:
  struct Buffer {
    const void* data;
    std::vector<unsigned char> bytes;
  };
  std::vector<Buffer> buffers_;
};

// Forward then backward of the whole of `b` through a C ABI attention plan of `params` on
// the CPU backend (no workspace, no stream), into `r`.
void c_attention_on_host(const thdcp_attention_params* params, const Batch& b, Outputs& r);

// The rows of `rank` of a global host tensor under `cp_layout` (thdcp_cp_split_ex).
HostTensor c_local_rows(const HostTensor& global, const thdcp_layout_t& layout, int cp, int rank,
                        thdcp_cp_layout_t cp_layout = THDCP_CP_LAYOUT_DUAL_CHUNK);

// Writes the rows of `rank`'s outputs into `global` (thdcp_cp_merge_ex; lse plane by plane);
// max_logit is left to the caller (max-reduced, the same on every rank).
void c_merge_rows(const Outputs& local, Outputs& global, const thdcp_layout_t& layout, int cp, int rank,
                  thdcp_cp_layout_t cp_layout = THDCP_CP_LAYOUT_DUAL_CHUNK);

}  // namespace thdcp::test
