// Exact 16-bit conversions: round trips and round-to-nearest-even against brute force.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "thdcp/core/dtype.h"
#include "thdcp/core/error.h"
#include "thdcp/core/tensor.h"
#include "thdcp/testing/workload.h"

namespace thdcp {
namespace {

TEST(DType, EveryHalfAndBfloat16RoundTrips) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float f = fp16_to_float(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(f))));
    } else {
      EXPECT_EQ(float_to_fp16(f), h) << std::hex << bits;
    }
    const float g = bf16_to_float(h);
    if (std::isnan(g)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(g))));
    } else {
      EXPECT_EQ(float_to_bf16(g), h) << std::hex << bits;
    }
  }
}

// The nearest representable value, ties to the even encoding, found by looking at the two
// neighbours of the candidate.
template <typename ToFloat>
void expect_nearest_even(float f, uint16_t got, ToFloat to_float) {
  const double x = f;
  const double here = to_float(got);
  if (std::isinf(here)) return;  // overflow: checked separately
  for (int step : {-1, 1}) {
    const uint16_t other = static_cast<uint16_t>(got + step);
    const double there = to_float(other);
    if (std::isnan(there) || std::signbit(there) != std::signbit(here)) continue;
    const double d_here = std::fabs(x - here), d_there = std::fabs(x - there);
    ASSERT_TRUE(d_here < d_there || (d_here == d_there && (got & 1) == 0))
        << "x=" << x << " got " << here << " but " << there << " is nearer (or the even tie)";
  }
}

TEST(DType, RoundsToNearestEven) {
  Rng rng(3);
  for (int i = 0; i < 200000; ++i) {
    // Magnitudes across the normal and subnormal half range and the bf16 range.
    const float f = static_cast<float>(rng.normal() * std::ldexp(1.0, static_cast<int>(rng.uniform_int(-26, 15))));
    expect_nearest_even(f, float_to_fp16(f), fp16_to_float);
    expect_nearest_even(f, float_to_bf16(f), bf16_to_float);
  }
  // Ties: 1 + 2^-11 lies halfway between two halves and goes to the even one (1.0).
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7bff);  // below the halfway point to 65536
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);  // halfway rounds to even: infinity
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // half of the smallest subnormal: tie to 0
  EXPECT_EQ(float_to_fp16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 units: tie to even 2
}

TEST(DType, ParsesNamesAndRejectsOthers) {
  EXPECT_EQ(parse_dtype("bf16"), DType::kBFloat16);
  EXPECT_EQ(parse_dtype("float16"), DType::kFloat16);
  EXPECT_EQ(parse_dtype("fp32"), DType::kFloat32);
  try {
    parse_dtype("int8");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dtype 'int8' is not supported: use bf16, fp16 or fp32"), std::string::npos);
  }
}

// Issue 10, class 2: tensor sizes are checked products, not wrapped ones.
TEST(TensorSize, ProductsAreCheckedForOverflowAndNegativeDimensions) {
  EXPECT_EQ(checked_tensor_bytes(16, 4, 8, DType::kBFloat16), size_t{16 * 4 * 8 * 2});
  EXPECT_EQ(checked_tensor_bytes(0, 4, 8, DType::kFloat32), size_t{0});
  for (const auto& shape : {std::vector<int64_t>{int64_t{1} << 30, int64_t{1} << 30, 256},
                            std::vector<int64_t>{int64_t{1} << 40, int64_t{1} << 20, 8}}) {
    try {
      HostTensor t(DType::kBFloat16, shape[0], shape[1], shape[2]);
      FAIL() << "no error for a wrapped size";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("has more bytes than a 64-bit size holds"), std::string::npos) << e.what();
    }
  }
  try {
    checked_tensor_bytes(-1, 4, 8, DType::kFloat32);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("negative dimension"), std::string::npos) << e.what();
  }
}

// Issue 10, class 9: user values in messages are short, escaped excerpts.
TEST(QuoteExcerpt, EscapesControlCharactersMarksTheBomAndTruncates) {
  EXPECT_EQ(quote_excerpt("12"), "'12'");
  EXPECT_EQ(quote_excerpt(std::string("a\x1b]0;t\x07\n\tb", 10)), "'a\\x1b]0;t\\x07\\n\\tb'");
  EXPECT_EQ(quote_excerpt(std::string("x\0y", 3)), "'x\\x00y'");
  EXPECT_EQ(quote_excerpt("\xef\xbb\xbf" "12"), "'\\ufeff12'");
  EXPECT_EQ(quote_excerpt("it's"), "'it\\'s'");
  EXPECT_EQ(quote_excerpt(std::string(50000000, '7'), 8), "'77777777'... (50000000 bytes)");
}

}  // namespace
}  // namespace thdcp
