#include "thdcp/core/error.h"

namespace thdcp::detail {

void throw_error(const char* file, int line, const std::string& message) {
  // The location goes last: the user reads what to change first.
  std::ostringstream out;
  const char* base = file;
  for (const char* p = file; *p; ++p) {
    if (*p == '/') base = p + 1;
  }
  out << message << " [" << base << ":" << line << "]";
  throw Error(out.str());
}

}  // namespace thdcp::detail
