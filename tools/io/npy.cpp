#include "io/npy.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <utility>

#include "io/atomic_file.h"
#include "thdcp/core/error.h"
#include "thdcp/plan/planner.h"

namespace thdcp::tools {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;
const char* kSupported = "<f4 (float32), <f2 (float16), <u2 (bfloat16 bits), <i4 (int32), <i8 (int64)";

// A parsed header value: the subset of Python literals NumPy writes.
struct HeaderValue {
  enum Kind { kString, kBool, kTuple, kOther } kind = kOther;
  std::string text;              // kString
  bool flag = false;             // kBool
  std::vector<int64_t> numbers;  // kTuple
};

// Recursive-descent parser of the header dict: {'descr': '<f4', 'fortran_order': False,
// 'shape': (2, 3), }. Anything else (a structured dtype's list, ...) is kOther and rejected
// by the caller with a message that names it.
class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& path) : text_(text), path_(path) {}

  void parse(std::string& descr, bool& fortran_order, std::vector<int64_t>& shape) {
    bool have_descr = false, have_order = false, have_shape = false;
    skip_space();
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = parse_string();
      skip_space();
      expect(':');
      skip_space();
      const size_t value_start = pos_;
      const HeaderValue value = parse_value();
      const std::string value_text = text_.substr(value_start, pos_ - value_start);
      if (key == "descr") {
        THDCP_CHECK(value.kind == HeaderValue::kString,
                    path_ << ": dtype " << value_text << " is a structured or nested dtype: save a plain array with "
                          << "one of " << kSupported);
        descr = value.text;
        have_descr = true;
      } else if (key == "fortran_order") {
        THDCP_CHECK(value.kind == HeaderValue::kBool,
                    fail_text("fortran_order must be True or False, not " + value_text));
        fortran_order = value.flag;
        have_order = true;
      } else if (key == "shape") {
        THDCP_CHECK(value.kind == HeaderValue::kTuple,
                    fail_text("shape must be a tuple of integers, not " + value_text));
        shape = value.numbers;
        have_shape = true;
      } else {
        THDCP_FAIL(fail_text("unexpected key '" + key + "' (an .npy header has descr, fortran_order and shape)"));
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      skip_space();
      THDCP_CHECK(peek() == '}', fail_text("expected ',' or '}' after the value of '" + key + "'"));
    }
    THDCP_CHECK(have_descr && have_order && have_shape,
                fail_text("the header lacks one of descr, fortran_order, shape"));
  }

 private:
  std::string fail_text(const std::string& what) const {
    return path_ + ": malformed .npy header (" + what + ") at byte " + std::to_string(pos_) + " of '" + text_ +
           "': re-save the array with numpy.save";
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n')) ++pos_;
  }
  void expect(char c) {
    THDCP_CHECK(peek() == c, fail_text(std::string("expected '") + c + "'"));
    ++pos_;
  }
  std::string parse_string() {
    const char quote = peek();
    THDCP_CHECK(quote == '\'' || quote == '"', fail_text("expected a quoted string"));
    ++pos_;
    const size_t begin = pos_;
    while (pos_ < text_.size() && text_[pos_] != quote) ++pos_;
    THDCP_CHECK(pos_ < text_.size(), fail_text("unterminated string"));
    return text_.substr(begin, pos_++ - begin);
  }
  int64_t parse_integer() {
    const size_t begin = pos_;
    int64_t value = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      THDCP_CHECK(value <= (std::numeric_limits<int64_t>::max() - 9) / 10, fail_text("dimension too large"));
      value = value * 10 + (text_[pos_++] - '0');
    }
    if (peek() == 'L') ++pos_;  // Python 2 longs, written by very old NumPy
    THDCP_CHECK(pos_ > begin, fail_text("expected a non-negative integer dimension"));
    return value;
  }
  HeaderValue parse_value() {
    HeaderValue v;
    const char c = peek();
    if (c == '\'' || c == '"') {
      v.kind = HeaderValue::kString;
      v.text = parse_string();
    } else if (text_.compare(pos_, 4, "True") == 0) {
      v.kind = HeaderValue::kBool;
      v.flag = true;
      pos_ += 4;
    } else if (text_.compare(pos_, 5, "False") == 0) {
      v.kind = HeaderValue::kBool;
      pos_ += 5;
    } else if (c == '(') {
      v.kind = HeaderValue::kTuple;
      ++pos_;
      skip_space();
      while (peek() != ')') {
        v.numbers.push_back(parse_integer());
        skip_space();
        if (peek() == ',') {
          ++pos_;
          skip_space();
        } else {
          THDCP_CHECK(peek() == ')', fail_text("expected ',' or ')' in the shape"));
        }
      }
      ++pos_;
    } else {
      // Skip a bracketed value (e.g. a structured dtype list) so the caller can quote it.
      int depth = 0;
      while (pos_ < text_.size()) {
        const char d = text_[pos_];
        if (d == '[' || d == '(' || d == '{') ++depth;
        if (d == ']' || d == ')' || d == '}') {
          if (depth == 0) break;
          --depth;
        }
        if (d == ',' && depth == 0) break;
        ++pos_;
      }
    }
    return v;
  }

  const std::string& text_;
  const std::string& path_;
  size_t pos_ = 0;
};

int64_t checked_numel(const std::vector<int64_t>& shape, const std::string& where) {
  int64_t n = 1;
  for (int64_t d : shape) {
    THDCP_CHECK(d >= 0, where << ": shape " << format_shape(shape) << " has a negative dimension");
    THDCP_CHECK(d == 0 || n <= std::numeric_limits<int64_t>::max() / 16 / d,
                where << ": shape " << format_shape(shape) << " is too large");
    n *= d;
  }
  return n;
}

uint32_t read_le(const unsigned char* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

int64_t NpyArray::numel() const { return checked_numel(shape, path.empty() ? "array" : path); }

size_t npy_itemsize(const std::string& descr) {
  if (descr == "<f4" || descr == "<i4") return 4;
  if (descr == "<f2" || descr == "<u2") return 2;
  if (descr == "<i8") return 8;
  THDCP_FAIL("dtype '" << descr << "' is not supported: use one of " << kSupported);
}

std::string format_shape(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += shape[i] < 0 ? std::string("any") : std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

NpyArray read_npy(const std::string& path) {
  // A regular file (a FIFO would block the open forever, a device never end).
  check_input_file(path, ".npy", std::numeric_limits<uintmax_t>::max());
  std::ifstream in(path, std::ios::binary);
  THDCP_CHECK(in.is_open(), path << ": cannot open (" << std::strerror(errno) << "): check the path");
  // One read of the whole file: inputs are tensors of up to a few GB, read once.
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  THDCP_CHECK(size >= 0, path << ": cannot determine the file size (" << std::strerror(errno) << ")");
  std::vector<unsigned char> bytes(static_cast<size_t>(size));
  in.read(reinterpret_cast<char*>(bytes.data()), size);
  THDCP_CHECK(in.gcount() == size, path << ": read error after " << in.gcount() << " of " << size << " bytes ("
                                        << std::strerror(errno) << ")");

  THDCP_CHECK(bytes.size() >= kMagicSize + 2 && std::memcmp(bytes.data(), kMagic, kMagicSize) == 0,
              path << ": not an .npy file (it does not start with \\x93NUMPY): save arrays with numpy.save, "
                      "not numpy.savez or tofile");
  const int major = bytes[kMagicSize];
  const int minor = bytes[kMagicSize + 1];
  THDCP_CHECK((major == 1 || major == 2 || major == 3) && minor == 0,
              path << ": .npy format version " << major << "." << minor
                   << " is not supported (thdcp reads 1.0, 2.0 and 3.0): re-save with numpy.save");
  const size_t length_bytes = major == 1 ? 2 : 4;
  const size_t prefix = kMagicSize + 2 + length_bytes;
  THDCP_CHECK(bytes.size() >= prefix, path << ": truncated .npy file (" << bytes.size()
                                           << " bytes end inside the header length)");
  const size_t header_len = read_le(bytes.data() + kMagicSize + 2, static_cast<int>(length_bytes));
  THDCP_CHECK(bytes.size() >= prefix + header_len,
              path << ": truncated .npy file: the header claims " << header_len << " bytes but the file has "
                   << bytes.size() << " in all");
  std::string header(reinterpret_cast<const char*>(bytes.data() + prefix), header_len);

  NpyArray array;
  array.path = path;
  bool fortran_order = false;
  HeaderParser(header, path).parse(array.descr, fortran_order, array.shape);
  const std::string& d = array.descr;
  THDCP_CHECK(d.empty() || d[0] != '>',
              path << ": dtype '" << d << "' is big-endian: save it little-endian, e.g. arr.astype('<"
                   << d.substr(1) << "')");
  THDCP_CHECK(d == "<f4" || d == "<f2" || d == "<u2" || d == "<i4" || d == "<i8",
              path << ": dtype '" << d << "' is not supported: convert the array to one of " << kSupported
                   << " (bfloat16: save its bits with arr.view(np.uint16))");
  // With fewer than two dimensions Fortran and C order are the same bytes.
  THDCP_CHECK(!fortran_order || array.shape.size() < 2,
              path << ": the array is in Fortran order: save a C-order array (numpy.ascontiguousarray)");

  const size_t itemsize = npy_itemsize(d);
  const int64_t numel = checked_numel(array.shape, path);
  const size_t needed = static_cast<size_t>(numel) * itemsize;
  const size_t available = bytes.size() - prefix - header_len;
  THDCP_CHECK(available >= needed, path << ": truncated .npy file: shape " << format_shape(array.shape) << " of "
                                        << d << " needs " << needed << " data bytes but the file holds " << available
                                        << ": re-save it (was the write interrupted?)");
  THDCP_CHECK(available == needed, path << ": " << available - needed << " bytes follow the data of shape "
                                        << format_shape(array.shape)
                                        << ": save one array per file with numpy.save");
  // Drop the header in place rather than copying the data: no second buffer of its size.
  bytes.erase(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(prefix + header_len));
  array.data = std::move(bytes);
  return array;
}

std::string npy_header_dict(const std::string& descr, const std::vector<int64_t>& shape) {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + format_shape(shape) + ", }";
  // Pad with spaces and end with '\n' so that magic + version + length + header is a
  // multiple of 64 bytes (NumPy aligns the data that way).
  const size_t length_bytes = dict.size() + 1 + 10 > 65535 ? 4 : 2;
  const size_t unpadded = kMagicSize + 2 + length_bytes + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict.push_back('\n');
  return dict;
}

void write_npy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape,
               const void* data) {
  const size_t itemsize = npy_itemsize(descr);
  const int64_t numel = checked_numel(shape, path);
  THDCP_CHECK(data != nullptr || numel == 0, path << ": no data given for shape " << format_shape(shape));
  const std::string dict = npy_header_dict(descr, shape);
  const bool v2 = dict.size() > 65535;
  std::string head(kMagic, kMagicSize);
  head.push_back(static_cast<char>(v2 ? 2 : 1));
  head.push_back(0);
  const uint32_t len = static_cast<uint32_t>(dict.size());
  for (int i = 0; i < (v2 ? 4 : 2); ++i) head.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  head += dict;

  AtomicFile file(path);
  file.write(head.data(), head.size());
  file.write(data, static_cast<size_t>(numel) * itemsize);
  file.commit();
}

std::vector<int64_t> npy_to_int64(const NpyArray& array, const std::string& name) {
  const int64_t n = array.numel();
  std::vector<int64_t> values(static_cast<size_t>(n));
  if (array.descr == "<i8") {
    std::memcpy(values.data(), array.data.data(), static_cast<size_t>(n) * 8);
  } else if (array.descr == "<i4") {
    for (int64_t i = 0; i < n; ++i) {
      int32_t v;
      std::memcpy(&v, array.data.data() + 4 * i, 4);
      values[static_cast<size_t>(i)] = v;
    }
  } else {
    THDCP_FAIL(array.path << ": " << name << " has dtype '" << array.descr
                          << "' but must be an integer array: save it as int32 (<i4) or int64 (<i8)");
  }
  return values;
}

void check_npy_shape(const NpyArray& array, const std::vector<int64_t>& expected, const std::string& what) {
  bool ok = array.shape.size() == expected.size();
  for (size_t i = 0; ok && i < expected.size(); ++i) ok = expected[i] < 0 || expected[i] == array.shape[i];
  THDCP_CHECK(ok, (array.path.empty() ? std::string("array") : array.path)
                      << ": shape " << format_shape(array.shape) << " does not match " << format_shape(expected)
                      << " expected for " << what);
}

}  // namespace thdcp::tools
