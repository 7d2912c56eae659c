// Helper of check_npy_interop.py (the test npy_numpy_interop):
//   npy_interop write DIR   writes one file per dtype with values from formulas
//   npy_interop read DIR    reads the files NumPy saved there and checks their values
// The formulas are repeated in check_npy_interop.py. Exit 0: all good; 1: a mismatch.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "npy.h"
#include "thdcp/core/error.h"

using thdcp::tools::NpyArray;

namespace {

// value(i) of each file, as double, and its dtype and shape.
struct Case {
  const char* name;
  const char* descr;
  std::vector<int64_t> shape;
};
const Case kCases[] = {
    {"f4", "<f4", {3, 5, 2}}, {"f2", "<f2", {4, 3}}, {"u2", "<u2", {7}}, {"i4", "<i4", {2, 5}}, {"i8", "<i8", {6}},
};

double value(const std::string& name, int64_t i) {
  if (name == "f4" || name == "f2") return i * 0.5 - 7;
  if (name == "u2") return i * 3;
  if (name == "i4") return i * i - 10;
  return static_cast<double>(i * (int64_t{1} << 33) - 5);  // i8
}

// float <-> IEEE half for the exactly representable values above.
uint16_t to_half(double v) {
  if (v == 0) return 0;
  const uint16_t sign = v < 0 ? 0x8000 : 0;
  double a = v < 0 ? -v : v;
  int exponent = 0;
  while (a >= 2) a /= 2, ++exponent;
  while (a < 1) a *= 2, --exponent;
  return static_cast<uint16_t>(sign | ((exponent + 15) << 10) | static_cast<uint16_t>((a - 1) * 1024));
}

std::vector<unsigned char> encode(const Case& c) {
  int64_t n = 1;
  for (int64_t d : c.shape) n *= d;
  std::vector<unsigned char> bytes(static_cast<size_t>(n) * thdcp::tools::npy_itemsize(c.descr));
  for (int64_t i = 0; i < n; ++i) {
    const double v = value(c.name, i);
    unsigned char* p = bytes.data() + i * thdcp::tools::npy_itemsize(c.descr);
    if (std::strcmp(c.name, "f4") == 0) {
      const float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
    } else if (std::strcmp(c.name, "f2") == 0) {
      const uint16_t h = to_half(v);
      std::memcpy(p, &h, 2);
    } else if (std::strcmp(c.name, "u2") == 0) {
      const uint16_t u = static_cast<uint16_t>(v);
      std::memcpy(p, &u, 2);
    } else if (std::strcmp(c.name, "i4") == 0) {
      const int32_t x = static_cast<int32_t>(v);
      std::memcpy(p, &x, 4);
    } else {
      const int64_t x = static_cast<int64_t>(v);
      std::memcpy(p, &x, 8);
    }
  }
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::strcmp(argv[1], "write") != 0 && std::strcmp(argv[1], "read") != 0)) {
    std::fprintf(stderr, "usage: npy_interop write|read DIR\n");
    return 2;
  }
  const std::string dir = argv[2];
  int failures = 0;
  try {
    for (const Case& c : kCases) {
      const std::vector<unsigned char> expected = encode(c);
      if (std::strcmp(argv[1], "write") == 0) {
        thdcp::tools::write_npy(dir + "/" + c.name + ".npy", c.descr, c.shape, expected.data());
        continue;
      }
      // NumPy saved each case in versions 1.0, 2.0 and 3.0.
      for (const char* version : {"v1", "v2", "v3"}) {
        const std::string path = dir + "/" + c.name + "_" + version + ".npy";
        const NpyArray a = thdcp::tools::read_npy(path);
        if (a.descr != c.descr || a.shape != c.shape || a.data != expected) {
          std::fprintf(stderr, "%s: read %s %s, expected %s %s (or the values differ)\n", path.c_str(),
                       a.descr.c_str(), thdcp::tools::format_shape(a.shape).c_str(), c.descr,
                       thdcp::tools::format_shape(c.shape).c_str());
          ++failures;
        }
      }
    }
  } catch (const thdcp::Error& e) {
    std::fprintf(stderr, "npy_interop: %s\n", e.what());
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
