// Files that appear whole or not at all: written to PATH.tmp and renamed over PATH on
// commit(), so an error (or a crash) never leaves a half-written output behind.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>

namespace thdcp::tools {

class AtomicFile {
 public:
  // Opens `path`.tmp for writing; throws thdcp::Error naming the path when it cannot.
  explicit AtomicFile(const std::string& path);
  // Without commit(), removes the temporary file and leaves `path` untouched.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends `size` bytes; throws thdcp::Error (e.g. disk full) naming the path.
  void write(const void* data, size_t size);
  // Flushes, closes and renames the temporary file to `path`.
  void commit();

 private:
  std::string path_;
  std::string temp_path_;
  std::FILE* file_ = nullptr;
};

// Writes `text` to `path` through an AtomicFile.
void write_text_file(const std::string& path, const std::string& text);

}  // namespace thdcp::tools
