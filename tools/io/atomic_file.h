// Outputs that appear whole or not at all: written to a temporary on the target's own file
// system, then renamed into place, so an error, Ctrl-C or a crash never leaves a half-written
// output behind.
#pragma once

#include <cstddef>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace thdcp::tools {

// While an output is being staged, SIGINT and SIGTERM are held: their handler only notes the
// signal (async-signal-safe); writes check for it between chunks and throw, the temporaries
// are removed as the stack unwinds, and the last guard to go raises the signal again under its
// former disposition, so the process still ends as the signal asked (exit status 130 for
// Ctrl-C in a shell). A signal ignored (SIG_IGN) stays ignored. Guards nest; main thread only.
class SignalGuard {
 public:
  SignalGuard();
  ~SignalGuard();
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;
};

// Throws thdcp::Error naming the signal when SIGINT or SIGTERM arrived under a SignalGuard.
void throw_if_interrupted();

class AtomicFile {
 public:
  // Opens PATH.tmp for writing, beside the file itself when `path` is a symbolic link to one (so
  // the rename stays on that file's file system and the link is kept); throws thdcp::Error
  // naming the path when it cannot.
  explicit AtomicFile(const std::string& path);
  // Without commit() or release(), removes the temporary file and leaves `path` untouched.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends `size` bytes; throws thdcp::Error (e.g. disk full, or a signal under the guard)
  // naming the path.
  void write(const void* data, size_t size);
  // Flushes and closes the temporary file: every write error (a full disk) surfaces here at
  // the latest, before anything is renamed.
  void close();
  // close() if still open, then renames the temporary file to path().
  void commit();
  // close() if still open, then hands the temporary file over to the caller, who renames or
  // removes it: returns its path.
  std::string release();
  // Where the file goes: `path`, or the file it links to.
  const std::string& path() const { return path_; }

 private:
  SignalGuard signals_;  // first: released last, after the temporary is gone
  std::string path_;
  std::string temp_path_;
  std::FILE* file_ = nullptr;
  bool closed_ = false;  // written and closed, not yet renamed
};

// Writes `text` to `path` through an AtomicFile.
void write_text_file(const std::string& path, const std::string& text);

// Before any work: whether `path` can be written as a file. Its directory must exist and be
// writable; the path must not be a directory (nor end in '/'), an existing file must be a
// writable regular file, and a symbolic link must lead to one. Throws UsageError naming
// `flag` (exit 2), so a wrong path costs nothing.
void check_output_file(const std::string& flag, const std::string& path);
// The same for a directory that will receive the files `names` (a trailing '/' is allowed): an
// existing `dir` (or the directory a link leads to) must be a writable directory in which no
// name is a directory; otherwise its parent must exist and be writable (dir is created).
void check_output_dir(const std::string& flag, const std::string& dir, const std::vector<std::string>& names);

// Before any work: that no two outputs (flag, path) name the same path, or a path inside
// another output directory (symbolic links followed); throws UsageError naming both flags.
void check_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs);

// Outputs that appear all together or not at all. Each is staged on its target's file system:
// a file as PATH.tmp beside it, the files of an existing directory (a mount point, a link to
// another file system) in DIR/.thdcp-staging-PID/ inside it, a new directory as DIR.tmp-PID/
// beside it. commit() checks that every target is still what it was, sets aside the files it
// replaces, renames every staged output into place, and only then deletes what it set aside;
// when a rename fails it puts everything back, so no output is half committed. Until commit()
// (an error, a signal: see SignalGuard) the temporaries are removed and every target is left
// as it was.
class OutputSet {
 public:
  OutputSet() = default;
  ~OutputSet();
  OutputSet(const OutputSet&) = delete;
  OutputSet& operator=(const OutputSet&) = delete;

  void stage_file(const std::string& path, const std::string& text);
  // `write(tmp)` writes the directory's files into the directory `tmp`; at commit each moves
  // into `dir` (created if missing; other files in it are left alone).
  void stage_dir(const std::string& dir, const std::function<void(const std::string& tmp)>& write);
  void commit();

 private:
  struct Move {
    Move(std::string staged, std::string target, bool whole_directory = false)
        : from(std::move(staged)), to(std::move(target)), directory(whole_directory) {}
    std::string from, to;    // staged, final
    bool directory = false;  // a whole new directory
    std::string backup;      // the file `to` replaces, set aside during the commit
    bool backed_up = false, moved = false;
  };
  // Puts back what a failed commit moved; returns what could not be put back ("" if all).
  std::string undo();

  SignalGuard signals_;  // first: released last, after the temporaries are gone
  std::vector<Move> moves_;
  std::vector<std::string> temporaries_;  // staged files and directories, removed unless committed
};

// For tests: the rename OutputSet::commit uses (std::rename when null), to make one fail.
void set_commit_rename_for_tests(int (*rename)(const char* from, const char* to));

// Test-only hook, read by OutputSet::commit: THDCP_TEST_PAUSE_BEFORE_COMMIT=SECONDS (1-600)
// makes it print "thdcp: test hook: outputs staged" to stderr and wait, until a signal, until
// standard input has a line or ends, or SECONDS, before it commits, so a test can signal the
// process or change an output path while every output is staged
// (tests/cli/outputs_during_run.py). Not for use outside tests.

}  // namespace thdcp::tools
