#include "io/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
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
                    quote_excerpt(path_, kPathExcerptChars)
                        << ": dtype " << quote_excerpt(value_text) << " is a structured or nested dtype: save a plain "
                        << "array with one of " << kSupported);
        descr = value.text;
        have_descr = true;
      } else if (key == "fortran_order") {
        THDCP_CHECK(value.kind == HeaderValue::kBool,
                    fail_text("fortran_order must be True or False, not " + quote_excerpt(value_text)));
        fortran_order = value.flag;
        have_order = true;
      } else if (key == "shape") {
        THDCP_CHECK(value.kind == HeaderValue::kTuple,
                    fail_text("shape must be a tuple of integers, not " + quote_excerpt(value_text)));
        shape = value.numbers;
        have_shape = true;
      } else {
        THDCP_FAIL(fail_text("unexpected key " + quote_excerpt(key) + " (an .npy header has descr, fortran_order and shape)"));
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      skip_space();
      THDCP_CHECK(peek() == '}', fail_text("expected ',' or '}' after the value of " + quote_excerpt(key)));
    }
    THDCP_CHECK(have_descr && have_order && have_shape,
                fail_text("the header lacks one of descr, fortran_order, shape"));
  }

 private:
  std::string fail_text(const std::string& what) const {
    // The header is the file's text: an excerpt, escaped, never the raw bytes.
    return quote_excerpt(path_, kPathExcerptChars) + ": malformed .npy header (" + what + ") at byte " +
           std::to_string(pos_) + " of " + quote_excerpt(text_, 80) + ": re-save the array with numpy.save";
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

int64_t NpyHeader::numel() const {
  return checked_numel(shape, path.empty() ? std::string("array") : quote_excerpt(path, kPathExcerptChars));
}

size_t npy_itemsize(const std::string& descr) {
  if (descr == "<f4" || descr == "<i4") return 4;
  if (descr == "<f2" || descr == "<u2") return 2;
  if (descr == "<i8") return 8;
  THDCP_FAIL("dtype " << quote_excerpt(descr) << " is not supported: use one of " << kSupported);
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

namespace {

// An open file, closed when it goes out of scope.
class InputFile {
 public:
  explicit InputFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    THDCP_CHECK(fd_ >= 0, quote_excerpt(path, kPathExcerptChars) << ": cannot open (" << std::strerror(errno)
                                                                  << "): check the path");
  }
  ~InputFile() { ::close(fd_); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  uint64_t size() const {
    struct stat st {};
    THDCP_CHECK(::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode),
                quote_excerpt(path_, kPathExcerptChars) << ": cannot determine the file size: give a regular file");
    return static_cast<uint64_t>(st.st_size);
  }

  // Up to `count` bytes at `offset`; returns how many there were (fewer only at the end).
  size_t read_at(void* into, size_t count, uint64_t offset) const {
    size_t done = 0;
    while (done < count) {
      const ssize_t n = ::pread(fd_, static_cast<char*>(into) + done, std::min<size_t>(count - done, size_t{1} << 30),
                                static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      THDCP_CHECK(n >= 0, quote_excerpt(path_, kPathExcerptChars)
                              << ": read error after " << offset + done << " bytes (" << std::strerror(errno) << ")");
      if (n == 0) break;
      done += static_cast<size_t>(n);
    }
    return done;
  }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace

NpyHeader read_npy_header(const std::string& path) {
  // A regular file (a FIFO would block the open forever, a device never end).
  check_input_file(path, ".npy", std::numeric_limits<uintmax_t>::max());
  const std::string at = quote_excerpt(path, kPathExcerptChars);
  const InputFile file(path);
  const uint64_t size = file.size();
  // Magic, version and header length: 10 bytes (1.0) or 12 (2.0, 3.0). Nothing more is read
  // until they are checked.
  unsigned char prefix[12] = {};
  const size_t got = file.read_at(prefix, sizeof(prefix), 0);
  THDCP_CHECK(got >= kMagicSize + 2 && std::memcmp(prefix, kMagic, kMagicSize) == 0,
              at << ": not an .npy file (it does not start with \\x93NUMPY): save arrays with numpy.save, "
                    "not numpy.savez or tofile");
  const int major = prefix[kMagicSize];
  const int minor = prefix[kMagicSize + 1];
  THDCP_CHECK((major == 1 || major == 2 || major == 3) && minor == 0,
              at << ": .npy format version " << major << "." << minor
                 << " is not supported (thdcp reads 1.0, 2.0 and 3.0): re-save with numpy.save");
  const size_t length_bytes = major == 1 ? 2 : 4;
  const size_t prefix_size = kMagicSize + 2 + length_bytes;
  THDCP_CHECK(got >= prefix_size, at << ": truncated .npy file (" << size << " bytes end inside the header length)");
  const size_t header_len = read_le(prefix + kMagicSize + 2, static_cast<int>(length_bytes));
  THDCP_CHECK(header_len <= kMaxNpyHeaderBytes,
              at << ": the .npy header is " << header_len << " bytes, more than the " << kMaxNpyHeaderBytes
                 << " thdcp reads (NumPy writes a few hundred): re-save the array with numpy.save");
  THDCP_CHECK(size >= prefix_size + header_len, at << ": truncated .npy file: the header claims " << header_len
                                                   << " bytes but the file has " << size << " in all");
  std::string text(header_len, '\0');
  THDCP_CHECK(file.read_at(text.data(), header_len, prefix_size) == header_len,
              at << ": truncated .npy file: it ended inside the header (changed while being read?)");

  NpyHeader header;
  header.path = path;
  bool fortran_order = false;
  HeaderParser(text, path).parse(header.descr, fortran_order, header.shape);
  const std::string& d = header.descr;
  THDCP_CHECK(d.empty() || d[0] != '>',
              at << ": dtype " << quote_excerpt(d) << " is big-endian: save it little-endian, e.g. arr.astype("
                 << quote_excerpt("<" + d.substr(1)) << ")");
  THDCP_CHECK(d == "<f4" || d == "<f2" || d == "<u2" || d == "<i4" || d == "<i8",
              at << ": dtype " << quote_excerpt(d) << " is not supported: convert the array to one of " << kSupported
                 << " (bfloat16: save its bits with arr.view(np.uint16))");
  // With fewer than two dimensions Fortran and C order are the same bytes.
  THDCP_CHECK(!fortran_order || header.shape.size() < 2,
              at << ": the array is in Fortran order: save a C-order array (numpy.ascontiguousarray)");

  // The file must hold exactly what the header promises: checked here, before the caller
  // sizes anything by the shape or reads a byte of the data.
  const uint64_t numel = static_cast<uint64_t>(checked_numel(header.shape, at));
  header.data_offset = prefix_size + header_len;
  header.data_bytes = numel * npy_itemsize(d);
  const uint64_t available = size - header.data_offset;
  THDCP_CHECK(available >= header.data_bytes,
              at << ": truncated .npy file: shape " << format_shape(header.shape) << " of " << d << " needs "
                 << header.data_bytes << " data bytes but the file holds " << available
                 << ": re-save it (was the write interrupted?)");
  THDCP_CHECK(available == header.data_bytes, at << ": " << available - header.data_bytes
                                                 << " bytes follow the data of shape " << format_shape(header.shape)
                                                 << ": save one array per file with numpy.save");
  return header;
}

void read_npy_data(const NpyHeader& header, void* data) {
  const InputFile file(header.path);
  const std::string at = quote_excerpt(header.path, kPathExcerptChars);
  THDCP_CHECK(file.size() == header.data_offset + header.data_bytes,
              at << ": the file changed since its header was read (" << file.size() << " bytes, "
                 << header.data_offset + header.data_bytes << " expected): read it again");
  THDCP_CHECK(file.read_at(data, header.data_bytes, header.data_offset) == header.data_bytes,
              at << ": the file ended before its " << header.data_bytes << " data bytes (changed while being read?)");
}

NpyArray read_npy(const std::string& path) {
  NpyArray array;
  static_cast<NpyHeader&>(array) = read_npy_header(path);
  array.data.resize(array.data_bytes);
  read_npy_data(array, array.data.data());
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
  THDCP_CHECK(data != nullptr || numel == 0, quote_excerpt(path, kPathExcerptChars) << ": no data given for shape " << format_shape(shape));
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
    // An empty array's vectors have no memory, and memcpy needs valid pointers even for 0 bytes.
    if (n > 0) std::memcpy(values.data(), array.data.data(), static_cast<size_t>(n) * 8);
  } else if (array.descr == "<i4") {
    for (int64_t i = 0; i < n; ++i) {
      int32_t v;
      std::memcpy(&v, array.data.data() + 4 * i, 4);
      values[static_cast<size_t>(i)] = v;
    }
  } else {
    THDCP_FAIL(quote_excerpt(array.path, kPathExcerptChars) << ": " << name << " has dtype " << quote_excerpt(array.descr)
                                                             << " but must be an integer array: save it as int32 (<i4) or int64 (<i8)");
  }
  return values;
}

void check_npy_shape(const NpyHeader& array, const std::vector<int64_t>& expected, const std::string& what) {
  bool ok = array.shape.size() == expected.size();
  for (size_t i = 0; ok && i < expected.size(); ++i) ok = expected[i] < 0 || expected[i] == array.shape[i];
  THDCP_CHECK(ok, (array.path.empty() ? std::string("array") : quote_excerpt(array.path, kPathExcerptChars))
                      << ": shape " << format_shape(array.shape) << " does not match " << format_shape(expected)
                      << " expected for " << what);
}

}  // namespace thdcp::tools
