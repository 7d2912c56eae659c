// What the fuzz targets share: scratch files, the check of a documented promise, tracing.
//
// Files for the readers a fuzz target drives: they take paths, so each input is written to a
// file of one directory per process, reused across iterations (under /dev/shm when there is
// one: memory, no disk). The directory is removed when the process exits normally; a crash
// leaves it (thdcp-fuzz-XXXXXX) for the report to be reproduced.
//
// FUZZ_CHECK ends a run with a message when a call breaks a promise it documents.
// THDCP_FUZZ_TRACE=1 prints what each input does (calls, statuses, the errors caught), to see
// what a seed or a finding exercises.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

// A finding that no sanitizer sees (a documented promise broken): printed, then abort(), which
// libFuzzer reports as a crash with the input saved.
#define FUZZ_CHECK(cond, what)                                                                    \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      std::fprintf(stderr, "FUZZ_CHECK failed: %s (%s) at %s:%d\n", #cond, std::string(what).c_str(), \
                   __FILE__, __LINE__);                                                           \
      std::abort();                                                                               \
    }                                                                                             \
  } while (0)

namespace thdcp::fuzz {

inline bool tracing() {
  static const bool on = std::getenv("THDCP_FUZZ_TRACE") != nullptr;
  return on;
}

// Prints one line when tracing.
inline void trace(const std::string& what) {
  if (tracing()) std::fprintf(stderr, "%s\n", what.c_str());
}

class ScratchFiles {
 public:
  // The process's directory, made on first use.
  static ScratchFiles& get() {
    static ScratchFiles* const files = new ScratchFiles();  // lives to exit (atexit removes it)
    return *files;
  }

  const std::string& dir() const { return dir_; }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // Replaces file `name` with `size` bytes of `data`; returns its path.
  std::string write(const std::string& name, const void* data, size_t size) const {
    const std::string file = path(name);
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    FUZZ_CHECK(fd >= 0, "cannot create " + file);
    const char* bytes = static_cast<const char*>(data);
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::write(fd, bytes + done, size - done);
      if (n < 0 && errno == EINTR) continue;
      FUZZ_CHECK(n > 0, "cannot write " + file);
      done += static_cast<size_t>(n);
    }
    ::close(fd);
    return file;
  }

  // Removes file `name` if it exists.
  void remove(const std::string& name) const { ::unlink(path(name).c_str()); }

 private:
  ScratchFiles() {
    const char* base = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : std::getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/thdcp-fuzz-XXXXXX";
    FUZZ_CHECK(::mkdtemp(pattern.data()) != nullptr, "cannot make a directory like " + pattern);
    dir_ = pattern;
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(get().dir_, ignored);
    });
  }

  std::string dir_;
};

}  // namespace thdcp::fuzz
