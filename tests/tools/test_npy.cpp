// .npy reader and writer: files NumPy wrote (fixtures), round trips of every dtype, the
// byte-exact header NumPy writes, and every rejected input with its message.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "atomic_file.h"
#include "npy.h"
#include "support/expect_error.h"
#include "thdcp/core/error.h"

namespace thdcp::tools {
namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& name) { return std::string(THDCP_NPY_FIXTURES) + "/" + name; }

std::string temp_dir() {
  const fs::path dir = fs::path(::testing::TempDir()) /
                       ("thdcp_npy_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::vector<unsigned char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void put_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
std::vector<T> values_of(const NpyArray& a) {
  std::vector<T> v(a.data.size() / sizeof(T));
  std::memcpy(v.data(), a.data.data(), a.data.size());
  return v;
}

// IEEE half -> float, written out independently of the library's dtype code.
float half_to_float(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  double v;
  if (exponent == 0) {
    v = std::ldexp(mantissa, -24);
  } else if (exponent == 31) {
    v = mantissa ? NAN : INFINITY;
  } else {
    v = std::ldexp(1024 + mantissa, exponent - 25);
  }
  return static_cast<float>(sign ? -v : v);
}

using test::expect_error;

TEST(Npy, ReadsFloat32WrittenByNumpy) {
  const NpyArray a = read_npy(fixture("f4_v1.npy"));
  EXPECT_EQ(a.descr, "<f4");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3, 4}));
  const std::vector<float> v = values_of<float>(a);
  ASSERT_EQ(v.size(), 24u);
  for (int i = 0; i < 24; ++i) EXPECT_EQ(v[i], i / 4.0f - 3.0f) << i;
}

TEST(Npy, ReadsFloat16AndBfloat16Bits) {
  const NpyArray h = read_npy(fixture("f2_v1.npy"));
  EXPECT_EQ(h.descr, "<f2");
  EXPECT_EQ(h.shape, (std::vector<int64_t>{2, 3, 4}));
  const std::vector<uint16_t> hv = values_of<uint16_t>(h);
  for (int i = 0; i < 24; ++i) EXPECT_EQ(half_to_float(hv[i]), i / 4.0f - 3.0f) << i;

  const NpyArray b = read_npy(fixture("u2_bf16_v1.npy"));
  EXPECT_EQ(b.descr, "<u2");
  EXPECT_EQ(b.shape, (std::vector<int64_t>{3, 2}));
  const std::vector<uint16_t> bv = values_of<uint16_t>(b);
  for (int i = 0; i < 6; ++i) {
    const uint32_t bits = static_cast<uint32_t>(bv[i]) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    EXPECT_EQ(f, i * 0.5f - 1.0f) << i;
  }
}

TEST(Npy, ReadsIntegersAsInt64) {
  EXPECT_EQ(npy_to_int64(read_npy(fixture("i4_v1.npy")), "cu_seqlens"), (std::vector<int64_t>{0, 5, 12, 20}));
  EXPECT_EQ(npy_to_int64(read_npy(fixture("i8_v1.npy")), "cu_seqlens"),
            (std::vector<int64_t>{0, int64_t{1} << 40, -3}));
  expect_error([] { npy_to_int64(read_npy(fixture("f4_v1.npy")), "cu_seqlens"); },
               {"f4_v1.npy", "cu_seqlens", "'<f4'", "int32 (<i4) or int64 (<i8)"});
}

// An array of no elements converts to no values: its vectors hold no memory, and memcpy of
// their NULL data is undefined even for 0 bytes (tests/fuzz findings, 3; UBSan).
TEST(Npy, ConvertsEmptyIntegerArrays) {
  const std::string dir = temp_dir();
  for (const char* descr : {"<i8", "<i4"}) {
    const std::string path = dir + "/empty.npy";
    write_npy(path, descr, {0}, nullptr);
    const NpyArray empty = read_npy(path);
    EXPECT_TRUE(empty.data.empty());
    EXPECT_EQ(npy_to_int64(empty, "cu_seqlens"), std::vector<int64_t>{}) << descr;
  }
}

TEST(Npy, ReadsVersions2And3AndScalars) {
  const NpyArray v2 = read_npy(fixture("f4_v2.npy"));
  EXPECT_EQ(v2.shape, (std::vector<int64_t>{6, 4}));
  const std::vector<float> v = values_of<float>(v2);
  for (int i = 0; i < 24; ++i) EXPECT_EQ(v[i], i / 4.0f - 3.0f);
  EXPECT_EQ(npy_to_int64(read_npy(fixture("i4_v3.npy")), "x"), (std::vector<int64_t>{7, -8, 9}));
  const NpyArray s = read_npy(fixture("f4_scalar_v1.npy"));
  EXPECT_TRUE(s.shape.empty());
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(values_of<float>(s), std::vector<float>{2.5f});
}

TEST(Npy, WritesTheSameBytesAsNumpy) {
  // Same array as the fixture: the whole file, header padding included, must match NumPy's.
  std::vector<float> values(24);
  for (int i = 0; i < 24; ++i) values[i] = i / 4.0f - 3.0f;
  const std::string path = temp_dir() + "/f4.npy";
  write_npy(path, "<f4", {2, 3, 4}, values.data());
  EXPECT_EQ(file_bytes(path), file_bytes(fixture("f4_v1.npy")));
  const std::vector<int64_t> offsets{0, 5, 12, 20};
  std::vector<int32_t> offsets32(offsets.begin(), offsets.end());
  write_npy(path, "<i4", {4}, offsets32.data());
  EXPECT_EQ(file_bytes(path), file_bytes(fixture("i4_v1.npy")));
  const float scalar = 2.5f;
  write_npy(path, "<f4", {}, &scalar);
  EXPECT_EQ(file_bytes(path), file_bytes(fixture("f4_scalar_v1.npy")));
}

TEST(Npy, RoundTripsEveryDtype) {
  const std::string dir = temp_dir();
  std::mt19937 rng(7);
  const std::vector<std::vector<int64_t>> shapes{{0}, {1}, {5}, {3, 7}, {2, 3, 5}, {4, 1, 2, 3}};
  for (const std::string descr : {"<f4", "<f2", "<u2", "<i4", "<i8"}) {
    for (const auto& shape : shapes) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      std::vector<unsigned char> data(static_cast<size_t>(n) * npy_itemsize(descr));
      for (auto& byte : data) byte = static_cast<unsigned char>(rng());
      const std::string path = dir + "/a.npy";
      write_npy(path, descr, shape, data.data());
      const std::vector<unsigned char> bytes = file_bytes(path);
      const size_t header_end = bytes.size() - data.size();
      EXPECT_EQ(header_end % 64, 0u) << "data must start 64-byte aligned, as NumPy writes it";
      EXPECT_EQ(bytes[header_end - 1], '\n');
      const NpyArray a = read_npy(path);
      EXPECT_EQ(a.descr, descr);
      EXPECT_EQ(a.shape, shape);
      EXPECT_EQ(a.data, data) << descr << " " << format_shape(shape);
      EXPECT_FALSE(fs::exists(path + ".tmp"));
    }
  }
}

TEST(Npy, UsesVersion2WhenTheHeaderIsLarge) {
  const std::vector<int64_t> shape(25000, 1);  // a header of ~75 KB, over v1.0's 65535 bytes
  const float value = 1.5f;
  const std::string path = temp_dir() + "/big_header.npy";
  write_npy(path, "<f4", shape, &value);
  const std::vector<unsigned char> bytes = file_bytes(path);
  EXPECT_EQ(bytes[6], 2);
  const uint32_t header_len = bytes[8] | bytes[9] << 8 | bytes[10] << 16 | static_cast<uint32_t>(bytes[11]) << 24;
  EXPECT_EQ(12 + header_len + 4, bytes.size());
  // NumPy reads it; thdcp's reader stops at kMaxNpyHeaderBytes (no NumPy array has 25000
  // dimensions: it allows 64), saying so.
  expect_error([&] { read_npy(path); }, {"big_header.npy", "header is " + std::to_string(header_len) + " bytes",
                                         "more than the 65536"});
}

// An .npy file of format 1.0 with `dict` as its header (padded as NumPy pads it), no data.
std::vector<unsigned char> npy_bytes(const std::string& dict) {
  std::string header = dict;
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header.push_back('\n');
  const std::string file = std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(header.size() & 0xff) +
                           static_cast<char>(header.size() >> 8) + header;
  return std::vector<unsigned char>(file.begin(), file.end());
}

// Bytes this process has read through read(2)/pread(2) so far (Linux /proc/self/io), or -1.
int64_t bytes_read_so_far() {
  std::ifstream io("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (io >> key >> value) {
    if (key == "rchar:") return value;
  }
  return -1;
}

// Runs `fn` (which must throw thdcp::Error with every one of `parts`) and returns how many
// bytes it read from files (reading /proc/self/io itself counts: measured and taken off).
template <typename Fn>
int64_t bytes_read_by(Fn fn, const std::vector<std::string>& parts) {
  const int64_t first = bytes_read_so_far();
  const int64_t before = bytes_read_so_far();
  expect_error(fn, parts);
  const int64_t after = bytes_read_so_far();
  return after - before - (before - first);
}

// A header-first reader: a file is judged by its first bytes and its size, before a byte of
// the data is read or a buffer of the promised size exists (issue 28, class 1).
TEST(Npy, ReadsTheHeaderFirstAndNothingMoreOfABadFile) {
  if (bytes_read_so_far() < 0) GTEST_SKIP() << "/proc/self/io is not readable here";
  const std::string dir = temp_dir();
  const uintmax_t gib = uintmax_t{1} << 30;
  // 3 GiB that are not an .npy file (sparse: no disk blocks): refused after its first bytes.
  const std::string not_npy = dir + "/not_npy.npy";
  put_bytes(not_npy, {'P', 'K', 3, 4, 0, 0, 0, 0, 0, 0, 0, 0});
  fs::resize_file(not_npy, 3 * gib);
  EXPECT_LE(bytes_read_by([&] { read_npy(not_npy); }, {"not_npy.npy", "not an .npy file"}), 12);

  // A valid header followed by 1 GiB more than it promises: refused by size, data unread.
  const std::vector<unsigned char> good = file_bytes(fixture("f4_v1.npy"));
  const std::string trailing = dir + "/trailing.npy";
  put_bytes(trailing, good);
  fs::resize_file(trailing, good.size() + gib);
  EXPECT_LE(bytes_read_by([&] { read_npy(trailing); }, {"trailing.npy", std::to_string(gib) + " bytes follow the data"}),
            512);

  // A header that promises 2^40 float32 elements in a file of 132 bytes: refused before
  // anything of that size is allocated.
  std::vector<unsigned char> promise_bytes =
      npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }");
  promise_bytes.insert(promise_bytes.end(), 4, 0);
  put_bytes(dir + "/promise.npy", promise_bytes);
  EXPECT_LE(bytes_read_by([&] { read_npy(dir + "/promise.npy"); },
                          {"promise.npy", "truncated", "needs 4398046511104 data bytes", "the file holds 4"}),
            512);

  // A 10 MB header (version 2.0): refused by its length field, the header itself unread.
  const std::string huge = dir + "/huge_header.npy";
  const uint32_t huge_len = 10u << 20;
  put_bytes(huge, {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, static_cast<unsigned char>(huge_len),
                   static_cast<unsigned char>(huge_len >> 8), static_cast<unsigned char>(huge_len >> 16),
                   static_cast<unsigned char>(huge_len >> 24)});
  fs::resize_file(huge, 12 + huge_len);
  EXPECT_LE(bytes_read_by([&] { read_npy(huge); }, {"huge_header.npy", "header is 10485760 bytes",
                                                     "more than the 65536 thdcp reads"}),
            12);
}

TEST(Npy, ReadsTheDataInToTheCallersBuffer) {
  const NpyHeader h = read_npy_header(fixture("f4_v1.npy"));
  EXPECT_EQ(h.descr, "<f4");
  EXPECT_EQ(h.shape, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(h.data_offset, 128u);
  EXPECT_EQ(h.data_bytes, 96u);
  std::vector<float> values(24, NAN);
  read_npy_data(h, values.data());
  for (int i = 0; i < 24; ++i) EXPECT_EQ(values[i], i / 4.0f - 3.0f) << i;
  // A file that changed after its header was read is refused, not read past its end.
  const std::string path = temp_dir() + "/changed.npy";
  fs::copy_file(fixture("f4_v1.npy"), path);
  const NpyHeader changed = read_npy_header(path);
  fs::resize_file(path, 100);
  expect_error([&] { read_npy_data(changed, values.data()); }, {"changed.npy", "changed since its header was read"});
}

// Header text, descr and key names come from the file: messages quote them escaped and
// bounded (quote_excerpt), never raw (issue 28, class 6).
TEST(Npy, QuotesHeaderTextEscapedAndBounded) {
  const std::string dir = temp_dir();
  auto npy_with_header = [&](const std::string& name, const std::string& dict) {
    put_bytes(dir + "/" + name, npy_bytes(dict));
    return dir + "/" + name;
  };
  const auto message_of = [](const std::string& path) { return test::error_of([&] { read_npy(path); }); };
  const std::string title = "\x1b]0;owned\x07\x1b[2J";
  const std::string descr = message_of(
      npy_with_header("descr.npy", "{'descr': '<f4" + title + "', 'fortran_order': False, 'shape': (1,), }"));
  const std::string key = message_of(npy_with_header("key.npy", "{'" + title + "': 1, 'descr': '<f4', }"));
  const std::string text = message_of(npy_with_header("text.npy", "{'descr': '<f4', 'shape': (1" + title + "), }"));
  const std::string structured = message_of(
      npy_with_header("structured.npy", "{'descr': [('a" + title + "', '<f4')], 'fortran_order': False, 'shape': (1,), }"));
  const std::string long_key =
      message_of(npy_with_header("long_key.npy", "{'" + std::string(30000, 'k') + "': 1, }"));
  for (const std::string& m : {descr, key, text, structured, long_key}) {
    ASSERT_FALSE(m.empty());
    EXPECT_EQ(m.find('\x1b'), std::string::npos) << m;
    EXPECT_EQ(m.find('\x07'), std::string::npos) << m;
    EXPECT_LT(m.size(), 700u) << m;
  }
  test::expect_contains(descr, "dtype '<f4\\x1b]0;owned\\x07\\x1b[2J' is not supported");
  test::expect_contains(key, "unexpected key '\\x1b]0;owned\\x07\\x1b[2J'");
  test::expect_contains(text, "malformed .npy header");
  test::expect_contains(text, "\\x1b]0;owned");
  test::expect_contains(structured, "is a structured or nested dtype");
  test::expect_contains(long_key, "... (30000 bytes)");
}

TEST(Npy, RejectsBadFilesWithAMessageThatSaysWhatToChange) {
  const std::string dir = temp_dir();
  const std::vector<unsigned char> good = file_bytes(fixture("f4_v1.npy"));

  expect_error([&] { read_npy(dir + "/missing.npy"); }, {"missing.npy", "cannot open", "No such file"});
  expect_error([&] { read_npy(dir); }, {"is a directory"});

  put_bytes(dir + "/text.npy", {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'});
  expect_error([&] { read_npy(dir + "/text.npy"); }, {"text.npy", "not an .npy file", "numpy.save"});

  std::vector<unsigned char> truncated(good.begin(), good.end() - 1);
  put_bytes(dir + "/truncated.npy", truncated);
  expect_error([&] { read_npy(dir + "/truncated.npy"); },
               {"truncated.npy", "truncated", "needs 96 data bytes", "holds 95"});
  put_bytes(dir + "/header_cut.npy", std::vector<unsigned char>(good.begin(), good.begin() + 40));
  expect_error([&] { read_npy(dir + "/header_cut.npy"); }, {"header_cut.npy", "truncated", "header"});

  std::vector<unsigned char> trailing = good;
  trailing.push_back(0);
  put_bytes(dir + "/trailing.npy", trailing);
  expect_error([&] { read_npy(dir + "/trailing.npy"); }, {"trailing.npy", "1 bytes follow the data", "one array"});

  std::vector<unsigned char> version = good;
  version[6] = 9;
  put_bytes(dir + "/version.npy", version);
  expect_error([&] { read_npy(dir + "/version.npy"); }, {"version.npy", "version 9.0", "not supported"});

  std::vector<unsigned char> header = good;
  const std::string text(good.begin(), good.end());
  header[text.find("'shape'") + 10] = 'x';  // "(2, 3, 4)" -> "(x, 3, 4)"
  put_bytes(dir + "/header.npy", header);
  expect_error([&] { read_npy(dir + "/header.npy"); }, {"header.npy", "malformed .npy header", "numpy.save"});

  expect_error([] { read_npy(fixture("bad_big_endian.npy")); },
               {"bad_big_endian.npy", "'>f4' is big-endian", "astype('<f4')"});
  expect_error([] { read_npy(fixture("bad_fortran.npy")); },
               {"bad_fortran.npy", "Fortran order", "ascontiguousarray"});
  expect_error([] { read_npy(fixture("bad_float64.npy")); }, {"bad_float64.npy", "'<f8' is not supported", "<f4"});
}

TEST(Npy, ChecksShapes) {
  const NpyArray a = read_npy(fixture("f4_v1.npy"));
  check_npy_shape(a, {2, -1, 4}, "q ([T, H, D])");
  expect_error([&] { check_npy_shape(a, {2, -1, 8}, "q ([T, H, D])"); },
               {"f4_v1.npy", "shape (2, 3, 4) does not match (2, any, 8)", "q ([T, H, D])"});
  expect_error([&] { check_npy_shape(a, {2, 3}, "x"); }, {"does not match (2, 3)"});
  EXPECT_EQ(format_shape({5}), "(5,)");
  EXPECT_EQ(format_shape({}), "()");
}

TEST(Npy, FailedWritesLeaveNoFile) {
  const std::string dir = temp_dir();
  const std::string path = dir + "/out.npy";
  const int32_t value = 1;
  write_npy(path, "<i4", {1}, &value);
  const std::vector<unsigned char> before = file_bytes(path);
  expect_error([&] { write_npy(path, ">f4", {1}, &value); }, {"'>f4' is not supported"});
  expect_error([&] { write_npy(dir + "/no/such/dir/x.npy", "<i4", {1}, &value); }, {"x.npy", "cannot create"});
  EXPECT_EQ(file_bytes(path), before);
  {
    AtomicFile file(path);
    file.write("partial", 7);
    // destroyed without commit(), as when an exception unwinds past it
  }
  EXPECT_EQ(file_bytes(path), before);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

}  // namespace
}  // namespace thdcp::tools
