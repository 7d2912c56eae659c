#include "thdcp/core/error.h"

#include "thdcp/core/cuda_check.h"

#include <cstdio>

namespace thdcp {

std::string quote_excerpt(const std::string& text, size_t max_chars) {
  std::string out = "'";
  size_t i = 0;
  const size_t shown = text.size() < max_chars ? text.size() : max_chars;
  while (i < shown) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == 0xef && i + 2 < text.size() && static_cast<unsigned char>(text[i + 1]) == 0xbb &&
        static_cast<unsigned char>(text[i + 2]) == 0xbf) {
      out += "\\ufeff";
      i += 3;
      continue;
    }
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\'' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
    ++i;
  }
  out += "'";
  if (i < text.size()) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

}  // namespace thdcp

namespace thdcp::detail {

void throw_error(const char* file, int line, const std::string& message, ErrorKind kind) {
  // The location goes last: the user reads what to change first.
  std::ostringstream out;
  const char* base = file;
  for (const char* p = file; *p; ++p) {
    if (*p == '/') base = p + 1;
  }
  out << message << " [" << base << ":" << line << "]";
  throw Error(out.str(), kind);
}

void throw_cuda_error(const char* file, int line, const char* call, const char* error_name, const char* error_text,
                      bool out_of_memory) {
  std::ostringstream message;
  message << call << " failed: " << error_name << " (" << error_text << ")";
  throw_error(file, line, message.str(), out_of_memory ? ErrorKind::kOutOfMemory : ErrorKind::kCuda);
}

}  // namespace thdcp::detail
