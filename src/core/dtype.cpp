#include "thdcp/core/dtype.h"

#include <cmath>

#include "thdcp/core/error.h"
#include "thdcp/core/tensor.h"

namespace thdcp {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
  }
  THDCP_FAIL("unknown dtype " << static_cast<int>(dtype));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "fp32";
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
  }
  return "unknown";
}

DType parse_dtype(const std::string& name) {
  if (name == "fp32" || name == "float32") return DType::kFloat32;
  if (name == "fp16" || name == "float16" || name == "half") return DType::kFloat16;
  if (name == "bf16" || name == "bfloat16") return DType::kBFloat16;
  THDCP_FAIL("dtype " << quote_excerpt(name) << " is not supported: use bf16, fp16 or fp32");
}

double dtype_unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return std::ldexp(1.0, -24);
    case DType::kFloat16: return std::ldexp(1.0, -11);
    case DType::kBFloat16: return std::ldexp(1.0, -8);
  }
  THDCP_FAIL("unknown dtype " << static_cast<int>(dtype));
}

float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return bits_to_float(sign | 0x7f800000u | (mantissa << 13));
  return bits_to_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint16_t float_to_fp16(float f) {
  uint32_t x = float_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (x < 0x38800000u) {
    // Below the smallest normal half (2^-14): scale to units of 2^-24 and round to
    // nearest even in the current (default) rounding mode. Scaling by 2^24 is exact.
    const float units = std::nearbyint(bits_to_float(x) * 16777216.0f);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(units));
  }
  // Normal: rebias the exponent, then round the 13 dropped bits to nearest even; a carry
  // out of the mantissa correctly bumps the exponent.
  const uint32_t rebiased = x - (112u << 23);
  return static_cast<uint16_t>(sign | ((rebiased + 0x0fffu + ((rebiased >> 13) & 1u)) >> 13));
}

}  // namespace thdcp

namespace thdcp {

size_t checked_tensor_bytes(int64_t tokens, int64_t heads, int64_t head_dim, DType dtype) {
  THDCP_CHECK(tokens >= 0 && heads >= 0 && head_dim >= 0,
              "tensor shape [" << tokens << ", " << heads << ", " << head_dim << "] has a negative dimension");
  int64_t n = 0;
  const bool overflow = __builtin_mul_overflow(tokens, heads, &n) || __builtin_mul_overflow(n, head_dim, &n) ||
                        __builtin_mul_overflow(n, static_cast<int64_t>(dtype_size(dtype)), &n);
  THDCP_CHECK(!overflow, "tensor shape [" << tokens << ", " << heads << ", " << head_dim << "] of " << dtype_name(dtype)
                                          << " has more bytes than a 64-bit size holds: lower the tokens, heads or "
                                             "head dim");
  return static_cast<size_t>(n);
}

}  // namespace thdcp
