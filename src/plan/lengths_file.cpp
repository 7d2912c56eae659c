// Readers of the planner's text inputs: lengths files and batches files (thdcp/planner.h).
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "thdcp/core/error.h"
#include "thdcp/plan/planner.h"

namespace thdcp {

namespace {

// Offsets are int32 (cu_seqlens), so no document can be longer than that.
constexpr int64_t kMaxLength = std::numeric_limits<int32_t>::max();

// A path as messages quote it: escaped and bounded, never raw.
std::string quote_path(const std::string& path) { return quote_excerpt(path, kPathExcerptChars); }

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

std::ifstream open_text(const std::string& path, const char* what) {
  check_input_file(path, what, kMaxTextInputBytes);
  std::ifstream in(path);
  THDCP_CHECK(in.is_open(), quote_path(path) << ": cannot open the " << what << " file (" << std::strerror(errno)
                                 << "): check the path");
  return in;
}

// The next line of `in` into `line`; false at the end. A line longer than kMaxTextLineBytes
// is an error naming path:number (a file of one huge line is not a lengths file).
bool next_line(std::istream& in, std::string& line, const std::string& path, int64_t number) {
  if (!std::getline(in, line)) return false;
  THDCP_CHECK(line.size() <= kMaxTextLineBytes, quote_path(path) << ":" << number << ": a line of " << line.size()
                                                     << " bytes, more than " << kMaxTextLineBytes
                                                     << ": write one document length per line");
  return true;
}

// The line without its '#' comment.
std::string strip_comment(const std::string& line) {
  const size_t hash = line.find('#');
  return hash == std::string::npos ? line : line.substr(0, hash);
}

// One length: decimal digits, >= 1, <= kMaxLength.
int64_t parse_length(const std::string& text, const std::string& path, int64_t line) {
  const std::string at = quote_path(path) + ":" + std::to_string(line) + ": ";
  THDCP_CHECK(!text.empty(), at << "empty field: separate lengths by single commas or spaces");
  size_t i = text[0] == '+' ? 1 : 0;
  const std::string quoted = quote_excerpt(text);
  THDCP_CHECK(text[0] != '-', at << quoted << " is negative: a document length counts tokens (>= 1)");
  THDCP_CHECK(i < text.size(), at << quoted << " is not a document length: use a whole number >= 1");
  int64_t value = 0;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    THDCP_CHECK(c >= '0' && c <= '9', at << quoted << " is not a document length: use a whole number >= 1");
    value = value * 10 + (c - '0');
    THDCP_CHECK(value <= kMaxLength, at << quoted << " is longer than int32 offsets allow (2^31-1 tokens)");
  }
  THDCP_CHECK(value >= 1, at << quoted << " is a zero-length document: remove the line "
                                "(empty documents take a capacity slot without any token)");
  return value;
}

// Splits a comment-free line into fields separated by whitespace and/or one comma. A comma
// with no value on one side (",,", a leading or a trailing comma) gives an empty field, which
// parse_length reports rather than silently skipping a value the user meant to write.
std::vector<std::string> split_fields(const std::string& text) {
  std::vector<std::string> fields;
  bool value_since_comma = false;  // a value was seen since the line start or the last comma
  bool seen_comma = false;
  size_t i = 0;
  while (i < text.size()) {
    if (is_space(text[i])) {
      ++i;
    } else if (text[i] == ',') {
      if (!value_since_comma) fields.push_back("");
      value_since_comma = false;
      seen_comma = true;
      ++i;
    } else {
      const size_t begin = i;
      while (i < text.size() && !is_space(text[i]) && text[i] != ',') ++i;
      fields.push_back(text.substr(begin, i - begin));
      value_since_comma = true;
    }
  }
  if (seen_comma && !value_since_comma) fields.push_back("");
  return fields;
}

// Calls take(text, number) for each line of the file at `path` (its number from 1), without
// its '#' comment; the file is checked and bounded first, each line is bounded.
void read_lines(const std::string& path, const char* what,
                const std::function<void(const std::string& text, int64_t number)>& take) {
  std::ifstream in = open_text(path, what);
  std::string line;
  for (int64_t number = 1; next_line(in, line, path, number); ++number) take(strip_comment(line), number);
  THDCP_CHECK(!in.bad(), quote_path(path) << ": read error (" << std::strerror(errno) << ")");
}

}  // namespace

void check_input_file(const std::string& path, const char* what, uintmax_t max_bytes) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  THDCP_CHECK(!error && fs::exists(status), quote_path(path) << ": cannot open the " << what << " file ("
                                                 << (error ? error.message() : "no such file")
                                                 << "): check the path");
  const char* kind = fs::is_directory(status) ? "a directory"
                     : fs::is_fifo(status)     ? "a FIFO"
                     : fs::is_socket(status)   ? "a socket"
                     : fs::is_character_file(status) || fs::is_block_file(status) ? "a device"
                     : fs::is_regular_file(status)                                ? nullptr
                                                                                  : "not a regular file";
  THDCP_CHECK(kind == nullptr, quote_path(path) << ": is " << kind << ", not a " << what
                                    << " file: give a regular file (special files can block or never end)");
  const uintmax_t size = fs::file_size(path, error);
  THDCP_CHECK(!error, quote_path(path) << ": cannot read the size of the " << what << " file (" << error.message() << ")");
  THDCP_CHECK(size <= max_bytes, quote_path(path) << ": the " << what << " file has " << size << " bytes, more than the "
                                      << max_bytes << " a " << what << " file may have: split it");
}

DocumentLengths read_lengths_file(const std::string& path) {
  DocumentLengths out;
  out.source = path;
  read_lines(path, "lengths", [&](const std::string& line, int64_t number) {
    size_t begin = 0, end = line.size();
    while (begin < end && is_space(line[begin])) ++begin;
    while (end > begin && is_space(line[end - 1])) --end;
    if (begin == end) return;
    const std::string text = line.substr(begin, end - begin);
    THDCP_CHECK(text.find_first_of(", \t") == std::string::npos,
                quote_path(path) << ":" << number << ": " << quote_excerpt(text) << " holds more than one value: a lengths file has one "
                     << "document length per line (use a batches file for several documents per line)");
    out.lengths.push_back(parse_length(text, path, number));
    out.lines.push_back(number);
  });
  THDCP_CHECK(!out.lengths.empty(), quote_path(path) << ": no document lengths found: write one length (>= 1) per line");
  return out;
}

namespace {

// Each batch of a batches file: its document lengths, checked, and its line.
void for_each_batch(const std::string& path,
                    const std::function<void(std::vector<int64_t>&& batch, int64_t number)>& take) {
  read_lines(path, "batches", [&](const std::string& line, int64_t number) {
    const std::vector<std::string> fields = split_fields(line);
    if (fields.empty()) return;
    std::vector<int64_t> batch;
    batch.reserve(fields.size());
    for (const std::string& field : fields) batch.push_back(parse_length(field, path, number));
    take(std::move(batch), number);
  });
}

}  // namespace

PackingSize count_batches_file(const std::string& path) {
  PackingSize size;
  for_each_batch(path, [&](std::vector<int64_t>&& batch, int64_t) {
    ++size.batches;
    size.documents += static_cast<int64_t>(batch.size());
  });
  return size;
}

DocumentBatches read_batches_file(const std::string& path) {
  DocumentBatches out;
  out.source = path;
  for_each_batch(path, [&](std::vector<int64_t>&& batch, int64_t number) {
    out.batches.push_back(std::move(batch));
    out.lines.push_back(number);
  });
  THDCP_CHECK(!out.batches.empty(),
              quote_path(path) << ": no batches found: write one batch per line, its document lengths separated by spaces or commas");
  return out;
}

}  // namespace thdcp
