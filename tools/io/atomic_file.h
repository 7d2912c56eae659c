// Files that appear whole or not at all: written to PATH.tmp and renamed over PATH on
// commit(), so an error (or a crash) never leaves a half-written output behind.
#pragma once

#include <cstddef>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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
  // Flushes and closes the temporary file: every write error (a full disk) surfaces here at
  // the latest, before anything is renamed.
  void close();
  // close() if still open, then renames the temporary file to `path`.
  void commit();

 private:
  std::string path_;
  std::string temp_path_;
  std::FILE* file_ = nullptr;
  bool closed_ = false;  // written and closed, not yet renamed
};

// Writes `text` to `path` through an AtomicFile.
void write_text_file(const std::string& path, const std::string& text);

// Before any work: whether `path` can be written as a file. Its directory must exist and be
// writable; the path must not be a directory, and an existing file must be a writable
// regular file. Throws UsageError naming `flag` (exit 2), so a wrong path costs nothing.
void check_output_file(const std::string& flag, const std::string& path);
// The same for a directory that will receive the files `names`: an existing `dir` must be a
// writable directory in which no name is a directory; otherwise its parent must exist and be
// writable (dir is created).
void check_output_dir(const std::string& flag, const std::string& dir, const std::vector<std::string>& names);

// Before any work: that no two outputs (flag, path) name the same path, or a path inside
// another output directory; throws UsageError naming both flags.
void check_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs);

// Outputs that appear all together or not at all. Each is written to a temporary sibling
// first (PATH.tmp for a file, DIR.tmp-PID/ for a directory's files); commit() renames them
// into place once every one was written. An error before commit() (a full disk, a failed
// write) removes the temporaries and leaves every target as it was.
class OutputSet {
 public:
  OutputSet() = default;
  ~OutputSet();
  OutputSet(const OutputSet&) = delete;
  OutputSet& operator=(const OutputSet&) = delete;

  void stage_file(const std::string& path, const std::string& text);
  // `write(tmp)` writes the directory's files into `tmp`; at commit each moves into `dir`
  // (created if missing; other files in it are left alone).
  void stage_dir(const std::string& dir, const std::function<void(const std::string& tmp)>& write);
  void commit();

 private:
  std::vector<std::unique_ptr<AtomicFile>> files_;
  std::vector<std::pair<std::string, std::string>> dirs_;  // (target, temporary)
};

}  // namespace thdcp::tools
