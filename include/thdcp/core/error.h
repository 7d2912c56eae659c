// thdcp::Error and the check macros used at every API edge.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace thdcp {

// The one exception type of the library. Its message names the argument, the value
// and what the caller should change; the library never calls exit().
// What kind of failure an Error reports, for callers that map errors to codes (the C ABI's
// statuses): a bad argument (the default: every THDCP_CHECK), a part this build lacks, a
// CUDA call that failed (out of device memory apart), a communication failure (a peer that
// failed or disagreed, an aborted group, NCCL or MPI), or a broken invariant.
enum class ErrorKind { kInvalidArgument, kUnsupported, kCuda, kOutOfMemory, kCommunication, kInternal };

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, ErrorKind kind = ErrorKind::kInvalidArgument)
      : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// A user's value as it may appear in a message: in single quotes, at most `max_chars` bytes
// of it (then "... (N bytes)"), control characters (NUL, escape, newline, DEL, ...) and the
// quote and backslash escaped (\n, \t, \xNN, \', \\), a UTF-8 byte-order mark shown as
// \ufeff. A value from a file or a flag never reaches the terminal raw or at full length.
std::string quote_excerpt(const std::string& text, size_t max_chars = 40);
// The excerpt of a file path in a message: longer than a value's, still bounded.
//   quote_excerpt(path, kPathExcerptChars) + ": not an .npy file"
constexpr size_t kPathExcerptChars = 200;

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, const std::string& message,
                              ErrorKind kind = ErrorKind::kInvalidArgument);
}  // namespace detail

}  // namespace thdcp

// THDCP_CHECK(cond, stream-expression): throws thdcp::Error with the streamed message
// and the location when cond is false.
//   THDCP_CHECK(cp >= 1, "cp=" << cp << " must be >= 1");
#define THDCP_CHECK(cond, message)                                     \
  do {                                                                 \
    if (!(cond)) {                                                     \
      std::ostringstream thdcp_check_stream_;                          \
      thdcp_check_stream_ << message;                                  \
      ::thdcp::detail::throw_error(__FILE__, __LINE__,                 \
                                   thdcp_check_stream_.str());         \
    }                                                                  \
  } while (0)

#define THDCP_FAIL(message) THDCP_CHECK(false, message)

// THDCP_FAIL_AS(kind, stream-expression): throws a thdcp::Error of that ErrorKind.
//   THDCP_FAIL_AS(::thdcp::ErrorKind::kCommunication, who << ": a peer failed");
#define THDCP_FAIL_AS(kind, message)                                   \
  do {                                                                 \
    std::ostringstream thdcp_check_stream_;                            \
    thdcp_check_stream_ << message;                                    \
    ::thdcp::detail::throw_error(__FILE__, __LINE__,                   \
                                 thdcp_check_stream_.str(), (kind));   \
  } while (0)
