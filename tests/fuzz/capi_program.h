// The input of fuzz_capi read as a program of C ABI calls: a reader of its bytes, and the
// arguments decoded from them (versioned params structs in buffers of their struct_size,
// layouts, lengths, tensors in buffers the harness owns and sizes from their description).
//
// Format (tests/fuzz/make_seeds.py writes the seeds in it): a sequence of operations, each an
// opcode byte followed by its operands, read front to back; a read past the end gives 0, so
// every input is a program. Integer operands are mostly one byte (a small value), with
// escapes to the boundary values of their type (value_i64, value_i32).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "thdcp/thdcp.h"

namespace thdcp::fuzz {

class Program {
 public:
  Program(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool done() const { return at_ >= size_; }
  uint8_t u8() { return at_ < size_ ? data_[at_++] : 0; }
  uint16_t u16() { return static_cast<uint16_t>(u8() | u8() << 8); }
  uint32_t u32() { return static_cast<uint32_t>(u16()) | static_cast<uint32_t>(u16()) << 16; }
  uint64_t u64() { return static_cast<uint64_t>(u32()) | static_cast<uint64_t>(u32()) << 32; }
  bool flag() { return (u8() & 1) != 0; }

  // One byte b: b < 224 is the small value b - 16 ([-16, 207]); else one of the values at
  // the edges of what the C ABI checks (int32 and 2^53 limits, overflow, the group, thread
  // and struct limits) or raw bytes.
  int64_t value_i64() {
    const uint8_t b = u8();
    if (b < 224) return static_cast<int64_t>(b) - 16;
    switch (b - 224) {
      case 0: return std::numeric_limits<int64_t>::min();
      case 1: return std::numeric_limits<int64_t>::max();
      case 2: return std::numeric_limits<int32_t>::max();
      case 3: return int64_t{std::numeric_limits<int32_t>::max()} + 1;
      case 4: return std::numeric_limits<int32_t>::min();
      case 5: return int64_t{1} << 53;
      case 6: return (int64_t{1} << 53) - 1;
      case 7: return int64_t{1} << 62;
      case 8: return std::numeric_limits<int64_t>::max() - 3;
      case 9: return std::numeric_limits<uint32_t>::max();
      case 10: return 1024;
      case 11: return 1025;
      case 12: return 4096;
      case 13: return 4097;
      case 14: return 65536;
      case 15: return int64_t{1} << 47;
      case 16: return static_cast<int16_t>(u16());
      case 17: return static_cast<int32_t>(u32());
      default: return static_cast<int64_t>(u64());
    }
  }
  int32_t value_i32() {
    const int64_t v = value_i64();
    return static_cast<int32_t>(std::clamp<int64_t>(v, std::numeric_limits<int32_t>::min(),
                                                    std::numeric_limits<int32_t>::max()));
  }
  // A float: 0, small fractions, and the ones that must be refused (negative, NaN, inf).
  float value_float() {
    switch (u8() % 8) {
      case 0: return 0.0f;
      case 1: return 0.125f;
      case 2: return 1.0f;
      case 3: return -1.0f;
      case 4: return std::numeric_limits<float>::quiet_NaN();
      case 5: return std::numeric_limits<float>::infinity();
      case 6: return std::numeric_limits<float>::denorm_min();
      default: {
        const uint32_t bits = u32();
        float f;
        std::memcpy(&f, &bits, sizeof(f));
        return f;
      }
    }
  }
  // A dtype value: the three storage dtypes, DEFAULT (0) and values that are none.
  thdcp_dtype_t value_dtype() {
    const uint8_t b = u8();
    if (b < 250) return static_cast<thdcp_dtype_t>(1 + b % 3);
    return static_cast<thdcp_dtype_t>(b == 250 ? 0 : b == 251 ? 4 : b == 252 ? -1 : static_cast<int32_t>(u32()));
  }
  thdcp_backend_t value_backend() {
    const uint8_t b = u8();
    return static_cast<thdcp_backend_t>(b < 240 ? 0 : b < 250 ? 1 : b == 250 ? 2 : static_cast<int32_t>(u32()));
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

// A versioned params struct as a caller hands it over: `struct_size` bytes of its own
// (exactly that many, so a read past them is a sanitizer report), the fields of `value` that
// fit, zeros past them, or a set byte past the library's fields (to be refused). A
// struct_size above THDCP_MAX_STRUCT_SIZE keeps sizeof(T) bytes: the library promises to
// refuse it before reading past the field.
template <typename T>
class ParamsBuffer {
 public:
  ParamsBuffer(Program& p, const T& value, size_t min_size) {
    size_t size = sizeof(T);
    bool dirty_tail = false;
    switch (p.u8() % 12) {
      case 6: size = min_size; break;                                 // the first version
      case 7: size = p.flag() ? sizeof(size_t) : min_size - 8; break;  // too small
      case 8: size = sizeof(T) + 8 * (1 + p.u8() % 8); dirty_tail = p.flag(); break;  // a newer struct
      case 9: size = p.flag() ? THDCP_MAX_STRUCT_SIZE : THDCP_MAX_STRUCT_SIZE + 8; break;
      case 10: size = sizeof(T) + 1 + p.u8() % 7; break;  // not a multiple of 8
      case 11: size = static_cast<size_t>(p.u64()); break;
      default: break;  // sizeof(T), as THDCP_*_INIT sets it
    }
    T copy = value;
    copy.struct_size = size;
    const size_t owned = size <= 2 * THDCP_MAX_STRUCT_SIZE ? std::max(size, sizeof(size_t)) : sizeof(T);
    bytes_.assign(owned, 0);
    std::memcpy(bytes_.data(), &copy, std::min(owned, sizeof(T)));
    if (dirty_tail) bytes_[sizeof(T) + p.u8() % (size - sizeof(T))] = 1;
  }
  const T* get() const { return reinterpret_cast<const T*>(bytes_.data()); }

 private:
  std::vector<unsigned char> bytes_;
};

// The fields of a params struct the library reads: those within struct_size, defaults past it.
template <typename T>
T as_read(const T& value, size_t struct_size, const T& defaults) {
  T out = defaults;
  std::memcpy(&out, &value, std::min(struct_size, sizeof(T)));
  return out;
}

// Document lengths for the capacity helpers: `count` is what the call is told and the
// harness owns that many entries, except for counts the library must refuse before reading
// (negative, or above 2^31-1), which get one. Counts in between that memory cannot back are
// brought into [0, kMaxDocuments].
constexpr int64_t kMaxDocuments = 4096;

struct Lengths {
  int64_t count = 0;
  std::vector<int64_t> values;
  bool null = false;
  const int64_t* data() const { return null ? nullptr : values.data(); }
};

inline Lengths decode_lengths(Program& p) {
  Lengths l;
  const uint8_t b = p.u8();
  if (b < 240) {
    l.count = b % 40;
  } else if (b < 252) {
    l.count = p.value_i64();
  } else {
    l.count = b - 252;  // with NULL lengths
    l.null = true;
  }
  const bool refused = l.count < 0 || l.count > std::numeric_limits<int32_t>::max();
  if (!refused && l.count > kMaxDocuments) l.count %= kMaxDocuments + 1;
  l.values.resize(refused ? 1 : static_cast<size_t>(l.count));
  for (int64_t& v : l.values) {
    const uint8_t kind = p.u8();
    v = kind < 200 ? kind % 50 : p.value_i64();
  }
  return l;
}

// A host layout: num_seqs + 1 entries per array (num_seqs in [-2, 64], every one backed), built
// from lengths aligned to 2*cp (what a valid batch looks like) or from raw offsets, then
// perhaps one entry changed; the arrays may be NULL or one array for both.
struct Layout {
  std::vector<int32_t> cu, padded;
  thdcp_layout_t c{};
  // The rows the layout claims (cu_seqlens_padded[num_seqs] of the array the call is given,
  // which may be `cu`), or -1 when it has none.
  int64_t total_rows() const {
    return c.cu_seqlens_padded && c.num_seqs >= 0 ? c.cu_seqlens_padded[c.num_seqs] : -1;
  }
};

// `rows`: when > 0 and the built layout has fewer padded rows, its last sequence's padding
// grows to that many (a run's layout must end at max_tokens).
inline void decode_layout(Program& p, int64_t align, int64_t rows, Layout& l) {
  const uint8_t shape = p.u8();
  const int num_seqs = shape < 240 ? 1 + shape % 8 : static_cast<int>(shape % 16) - 2 + (shape >= 248 ? 50 : 0);
  const size_t entries = static_cast<size_t>(std::max(num_seqs, 0)) + 1;
  l.cu.assign(entries, 0);
  l.padded.assign(entries, 0);
  const bool raw = (p.u8() & 7) == 7;
  for (size_t i = 1; i < entries; ++i) {
    if (raw) {
      l.cu[i] = static_cast<int32_t>(l.cu[i - 1] + static_cast<int8_t>(p.u8()));
      l.padded[i] = static_cast<int32_t>(l.padded[i - 1] + static_cast<int8_t>(p.u8()));
    } else {
      const int64_t length = p.u8() % 24;
      const int64_t padded = (length + align - 1) / align * align + (p.u8() % 4 == 0 ? align : 0);
      l.cu[i] = static_cast<int32_t>(l.cu[i - 1] + length);
      l.padded[i] = static_cast<int32_t>(l.padded[i - 1] + padded);
    }
  }
  if (!raw && rows > l.padded.back() && rows <= std::numeric_limits<int32_t>::max()) {
    l.padded.back() = static_cast<int32_t>(rows);
  }
  const uint8_t change = p.u8();
  if (change >= 224) {
    std::vector<int32_t>& which = change & 1 ? l.padded : l.cu;
    which[p.u8() % entries] = p.value_i32();
  }
  const uint8_t form = p.u8();
  l.c.num_seqs = num_seqs;
  l.c.cu_seqlens = form == 255 ? nullptr : l.cu.data();
  l.c.cu_seqlens_padded = form == 254 ? nullptr : form == 253 ? l.cu.data() : l.padded.data();
}

// The value of a C enum field as an int: C callers may store any int there, and C++ must not
// load such a value as the enum type.
template <typename Enum>
int32_t raw_value(const Enum& e) {
  static_assert(sizeof(Enum) == sizeof(int32_t));
  int32_t v;
  std::memcpy(&v, &e, sizeof(v));
  return v;
}

inline size_t dtype_bytes(int32_t dtype) { return dtype == THDCP_DTYPE_FP32 ? 4 : 2; }

// A THD tensor argument and the memory behind it. decode_tensor describes the tensor the call
// expects ([rows, heads, head_dim] of `dtype`, contiguous) or, now and then, one that differs
// in a field (a shape, the dtype, a stride, NULL data); the memory is exactly what the
// description reaches. A description whose memory the harness cannot give (strides reaching
// beyond kMaxTensorBytes) makes `ok` false: the call is not made.
struct Tensor {
  thdcp_tensor_t t{};
  std::vector<unsigned char> memory;
  bool null = false;  // the tensor pointer itself is NULL
  bool ok = true;
  const thdcp_tensor_t* get() const { return null ? nullptr : &t; }
};

constexpr int64_t kMaxTensorBytes = int64_t{1} << 22;

// Bytes from data to the end of the last element, or -1 when a dimension or stride is
// negative or the offset overflows 64 bits, computed as the library checks it (it must refuse
// those before reading).
inline int64_t reach_bytes(const thdcp_tensor_t& t) {
  if (t.rows < 0 || t.heads < 0 || t.head_dim < 0 || t.row_stride < 0 || t.head_stride < 0) return -1;
  if (t.rows == 0 || t.heads == 0 || t.head_dim == 0) return 0;
  int64_t row_step = t.row_stride, head_step = t.head_stride != 0 ? t.head_stride : t.head_dim;
  int64_t last_row = 0, last_head = 0, last = 0, bytes = 0;
  const bool overflow = (row_step == 0 && __builtin_mul_overflow(t.heads, t.head_dim, &row_step)) ||
                        __builtin_mul_overflow(t.rows - 1, row_step, &last_row) ||
                        __builtin_mul_overflow(t.heads - 1, head_step, &last_head) ||
                        __builtin_add_overflow(last_row, last_head, &last) ||
                        __builtin_add_overflow(last, t.head_dim, &last) ||
                        __builtin_mul_overflow(last, static_cast<int64_t>(dtype_bytes(raw_value(t.dtype))), &bytes);
  return overflow ? -1 : bytes;
}

inline void decode_tensor(Program& p, int64_t rows, int64_t heads, int64_t head_dim, thdcp_dtype_t dtype,
                          uint8_t fill, Tensor& x) {
  x.t = thdcp_tensor_t{nullptr, rows, heads, head_dim, 0, 0, dtype};
  const uint8_t how = p.u8();
  if (how >= 224) {
    switch (how % 8) {
      case 0: x.t.rows = p.value_i64(); break;
      case 1: x.t.heads = p.value_i64(); break;
      case 2: x.t.head_dim = p.value_i64(); break;
      case 3: x.t.dtype = p.value_dtype(); break;
      case 4: x.t.row_stride = p.value_i64(); break;
      case 5: x.t.head_stride = p.value_i64(); break;
      case 6: x.null = true; break;
      default: x.t.row_stride = heads * head_dim + p.u8() % 8; break;  // padded rows
    }
  }
  const int64_t bytes = reach_bytes(x.t);
  if (bytes > kMaxTensorBytes) {
    x.ok = false;
    return;
  }
  // Memory for what the description reaches; a refused description (negative, overflow)
  // gets a few bytes, never read if the library keeps its promise.
  x.memory.assign(static_cast<size_t>(std::max<int64_t>(bytes, 16)), fill);
  x.t.data = p.u8() == 255 ? nullptr : x.memory.data();
}

}  // namespace thdcp::fuzz
