// Test support for the C ABI: C descriptors of host tensors, status checks that also read
// thdcp_last_error(), and byte snapshots that prove a refused call wrote nothing.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "thdcp/core/tensor.h"
#include "thdcp/plan/layout.h"
#include "thdcp/thdcp.h"

namespace thdcp::test {

inline thdcp_dtype_t c_dtype(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return THDCP_DTYPE_BF16;
    case DType::kFloat16: return THDCP_DTYPE_FP16;
    case DType::kFloat32: return THDCP_DTYPE_FP32;
  }
  return THDCP_DTYPE_DEFAULT;
}

// The C descriptor of a contiguous host tensor (inputs are only read through it).
inline thdcp_tensor_t c_tensor(const HostTensor& t) {
  thdcp_tensor_t c{};
  c.data = const_cast<void*>(t.data());
  c.rows = t.tokens();
  c.heads = t.heads();
  c.head_dim = t.head_dim();
  c.dtype = c_dtype(t.dtype());
  return c;
}

// Stores any int in an enum field, as a C caller may: C++ may not form an enum value outside
// its enumerators' range, so the bytes are copied.
template <typename Enum>
void set_raw(Enum& field, int value) {
  static_assert(sizeof(Enum) == sizeof(int), "the enums of thdcp.h are int-sized");
  std::memcpy(&field, &value, sizeof(value));
}

inline thdcp_layout_t c_layout(const BatchLayout& layout) {
  return thdcp_layout_t{layout.cu_seqlens.data(), layout.cu_seqlens_padded.data(), layout.num_seqs()};
}

// `status` is `expected`, and (for a failure) thdcp_last_error() names the function and
// contains every part.
inline ::testing::AssertionResult status_is(thdcp_status_t status, thdcp_status_t expected,
                                            const std::vector<std::string>& parts = {}) {
  const std::string message = thdcp_last_error();
  if (status != expected) {
    return ::testing::AssertionFailure() << "status " << thdcp_status_name(status) << ", expected "
                                         << thdcp_status_name(expected) << "; last error: " << message;
  }
  for (const std::string& part : parts) {
    if (message.find(part) == std::string::npos) {
      return ::testing::AssertionFailure() << "the message does not contain '" << part << "': " << message;
    }
  }
  return ::testing::AssertionSuccess();
}

#define EXPECT_C_OK(call) EXPECT_TRUE(::thdcp::test::status_is((call), THDCP_SUCCESS))
#define ASSERT_C_OK(call) ASSERT_TRUE(::thdcp::test::status_is((call), THDCP_SUCCESS))
// EXPECT_C_STATUS(call, THDCP_ERROR_..., "part", ...): the status and the message's parts.
#define EXPECT_C_STATUS(call, expected, ...) \
  EXPECT_TRUE(::thdcp::test::status_is((call), (expected), {__VA_ARGS__}))

// The bytes of a set of buffers, to check that a refused call left them as they were.
class Snapshot {
 public:
  Snapshot& add(const void* data, size_t bytes) {
    buffers_.push_back({data, std::vector<unsigned char>(static_cast<const unsigned char*>(data),
                                                         static_cast<const unsigned char*>(data) + bytes)});
    return *this;
  }
  Snapshot& add(const HostTensor& t) { return add(t.data(), static_cast<size_t>(t.numel()) * dtype_size(t.dtype())); }
  Snapshot& add(const std::vector<float>& v) { return add(v.data(), v.size() * sizeof(float)); }

  ::testing::AssertionResult unchanged() const {
    for (size_t i = 0; i < buffers_.size(); ++i) {
      const Buffer& b = buffers_[i];
      if (std::memcmp(b.data, b.bytes.data(), b.bytes.size()) != 0) {
        return ::testing::AssertionFailure() << "buffer " << i << " was written by a refused call";
      }
    }
    return ::testing::AssertionSuccess();
  }

 private:
  struct Buffer {
    const void* data;
    std::vector<unsigned char> bytes;
  };
  std::vector<Buffer> buffers_;
};

}  // namespace thdcp::test
