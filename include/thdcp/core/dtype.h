// Storage dtypes and exact conversions of 16-bit floats (stored as raw uint16_t bits).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace thdcp {

enum class DType : int {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
};

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "fp32", "fp16", "bf16"
// Parses "fp32"/"float32", "fp16"/"float16"/"half", "bf16"/"bfloat16"; throws otherwise.
DType parse_dtype(const std::string& name);

// Unit roundoff of the storage format: half the distance from 1 to the next value
// (2^-24 fp32, 2^-11 fp16, 2^-8 bf16). Tolerances are derived from it.
double dtype_unit_roundoff(DType dtype);

inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

// bfloat16 is the upper half of a float: widening is exact.
inline float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

// Round to nearest, ties to even; NaN stays a (quiet) NaN, overflow becomes inf.
inline uint16_t float_to_bf16(float f) {
  const uint32_t x = float_to_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// IEEE binary16 -> float, exact for every value including subnormals.
float fp16_to_float(uint16_t h);
// float -> IEEE binary16, round to nearest, ties to even, with subnormals and overflow to inf.
uint16_t float_to_fp16(float f);

// Reads element i of a buffer of `dtype` as float.
inline float load_as_float(const void* data, DType dtype, size_t i) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<const float*>(data)[i];
    case DType::kFloat16: return fp16_to_float(static_cast<const uint16_t*>(data)[i]);
    case DType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(data)[i]);
  }
  return 0.0f;
}

// Writes element i of a buffer of `dtype`, rounding to nearest even.
inline void store_from_float(void* data, DType dtype, size_t i, float value) {
  switch (dtype) {
    case DType::kFloat32: static_cast<float*>(data)[i] = value; return;
    case DType::kFloat16: static_cast<uint16_t*>(data)[i] = float_to_fp16(value); return;
    case DType::kBFloat16: static_cast<uint16_t*>(data)[i] = float_to_bf16(value); return;
  }
}

}  // namespace thdcp
