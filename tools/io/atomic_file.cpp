#include "io/atomic_file.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "io/args.h"
#include "thdcp/core/error.h"

namespace thdcp::tools {

namespace fs = std::filesystem;

namespace {

std::string quote_path(const std::string& path) { return quote_excerpt(path, kPathExcerptChars); }

// --- signals -------------------------------------------------------------------------------

volatile std::sig_atomic_t g_signal = 0;  // the signal noted under a guard, 0 if none
int g_guards = 0;

struct HeldSignal {
  int number;
  const char* name;
  struct sigaction previous;
  bool installed;
};
HeldSignal g_held[] = {{SIGINT, "SIGINT", {}, false}, {SIGTERM, "SIGTERM", {}, false}};

// Only notes the signal: async-signal-safe.
void note_signal(int number) { g_signal = number; }

// --- paths ---------------------------------------------------------------------------------

// "dir/" and "dir//" name "dir" ("/" stays itself).
std::string without_trailing_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// True when `path` names anything, a dangling symbolic link included.
bool lexists(const std::string& path) {
  std::error_code error;
  return fs::exists(fs::symlink_status(path, error));
}

bool is_dangling_link(const std::string& path) {
  std::error_code error;
  return fs::is_symlink(fs::symlink_status(path, error)) && !fs::exists(path, error);
}

std::string link_target(const std::string& path) {
  std::error_code error;
  const fs::path target = fs::read_symlink(path, error);
  return error ? std::string("?") : target.string();
}

bool writable(const fs::path& p) { return access(p.c_str(), W_OK) == 0; }

fs::path directory_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

// A link to a regular file: the file (its temporary goes beside it, on its file system).
std::string resolved_file(const std::string& path) {
  std::error_code error;
  if (!fs::is_symlink(fs::symlink_status(path, error))) return path;
  const fs::path target = fs::canonical(path, error);
  return !error && fs::is_regular_file(target, error) ? target.string() : path;
}

// --- the commit ----------------------------------------------------------------------------

int (*g_commit_rename)(const char*, const char*) = nullptr;

int commit_rename(const std::string& from, const std::string& to) {
  return (g_commit_rename != nullptr ? g_commit_rename : std::rename)(from.c_str(), to.c_str());
}

// THDCP_TEST_PAUSE_BEFORE_COMMIT (atomic_file.h): a test's window with every output staged,
// until a signal, a line or the end of standard input, or SECONDS.
void pause_for_tests() {
  const char* value = std::getenv("THDCP_TEST_PAUSE_BEFORE_COMMIT");
  if (value == nullptr) return;
  const int seconds = std::atoi(value);
  if (seconds < 1 || seconds > 600) return;
  std::fprintf(stderr, "thdcp: test hook: outputs staged, committing in %d s\n", seconds);
  std::fflush(stderr);
  for (int slice = 0; slice < seconds * 100 && g_signal == 0; ++slice) {
    pollfd input{STDIN_FILENO, POLLIN, 0};
    if (poll(&input, 1, 10) > 0) break;  // a line, or the end of the input: go on
  }
}

}  // namespace

SignalGuard::SignalGuard() {
  if (g_guards++ > 0) return;
  for (HeldSignal& held : g_held) {
    held.installed = false;
    struct sigaction current {};
    if (sigaction(held.number, nullptr, &current) != 0) continue;
    if (!(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_IGN) continue;  // stays ignored
    struct sigaction noting {};
    noting.sa_handler = note_signal;
    sigemptyset(&noting.sa_mask);
    noting.sa_flags = SA_RESTART;
    held.installed = sigaction(held.number, &noting, &held.previous) == 0;
  }
}

SignalGuard::~SignalGuard() {
  if (--g_guards > 0) return;
  for (HeldSignal& held : g_held) {
    if (held.installed) sigaction(held.number, &held.previous, nullptr);
    held.installed = false;
  }
  const int noted = g_signal;
  g_signal = 0;
  // Every temporary is gone by now: end as the signal asked.
  if (noted != 0) std::raise(noted);
}

void throw_if_interrupted() {
  const int noted = g_signal;
  if (noted == 0) return;
  const char* name = "a signal";
  for (const HeldSignal& held : g_held) {
    if (held.number == noted) name = held.name;
  }
  THDCP_FAIL("interrupted by " << name << " while the outputs were written: nothing was written");
}

AtomicFile::AtomicFile(const std::string& path) : path_(resolved_file(path)), temp_path_(path_ + ".tmp") {
  file_ = std::fopen(temp_path_.c_str(), "wb");
  THDCP_CHECK(file_ != nullptr, quote_path(path) << ": cannot create " << quote_path(temp_path_) << " ("
                                             << std::strerror(errno)
                                             << "): check that the directory exists and is writable");
}

AtomicFile::~AtomicFile() {
  if (file_ != nullptr) std::fclose(file_);
  if (file_ != nullptr || closed_) std::remove(temp_path_.c_str());
}

void AtomicFile::write(const void* data, size_t size) {
  THDCP_CHECK(file_ != nullptr, quote_path(path_) << ": write after close");
  // In chunks, so that a signal is heard within a second or so on any disk.
  constexpr size_t kChunk = size_t{64} << 20;
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    throw_if_interrupted();
    const size_t n = std::min(size, kChunk);
    THDCP_CHECK(std::fwrite(bytes, 1, n, file_) == n,
                quote_path(path_) << ": writing " << n << " bytes failed (" << std::strerror(errno) << "): is the disk full?");
    bytes += n;
    size -= n;
  }
}

void AtomicFile::close() {
  THDCP_CHECK(file_ != nullptr, quote_path(path_) << ": closed twice");
  const bool flushed = std::fflush(file_) == 0;
  const int flush_errno = errno;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!flushed || !closed) {
    std::remove(temp_path_.c_str());
    THDCP_FAIL(quote_path(path_) << ": writing failed (" << std::strerror(flushed ? errno : flush_errno)
                     << "): is the disk full?");
  }
  closed_ = true;
  throw_if_interrupted();
}

void AtomicFile::commit() {
  if (file_ != nullptr) close();
  THDCP_CHECK(closed_, quote_path(path_) << ": committed twice");
  closed_ = false;
  if (std::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const int rename_errno = errno;
    std::remove(temp_path_.c_str());
    THDCP_FAIL(quote_path(path_) << ": cannot rename " << quote_path(temp_path_) << " to it (" << std::strerror(rename_errno) << ")");
  }
}

std::string AtomicFile::release() {
  if (file_ != nullptr) close();
  THDCP_CHECK(closed_, quote_path(path_) << ": released twice");
  closed_ = false;
  return temp_path_;
}

void check_output_file(const std::string& flag, const std::string& path) {
  std::error_code error;
  const std::string at = "--" + flag + " " + quote_path(path);
  if (fs::is_directory(path, error)) throw UsageError(at + ": is a directory: give a file name");
  if (!path.empty() && path.back() == '/') throw UsageError(at + ": ends in '/', which names a directory: give a file name");
  if (is_dangling_link(path)) {
    throw UsageError(at + ": is a symbolic link to " + quote_path(link_target(path)) +
                     ", which does not exist: create it or give another path");
  }
  const fs::path dir = directory_of(path);
  if (!fs::is_directory(dir, error)) {
    throw UsageError(at + ": its directory " + quote_path(dir.string()) + " does not exist: create it first");
  }
  if (!writable(dir)) throw UsageError(at + ": its directory is not writable: choose another place");
  if (fs::exists(path, error)) {
    if (!fs::is_regular_file(path, error)) throw UsageError(at + ": exists and is not a regular file");
    if (!writable(path)) throw UsageError(at + ": exists and is not writable");
    const std::string target = resolved_file(path);
    if (target != path && !writable(directory_of(target))) {
      throw UsageError(at + ": links to " + quote_path(target) + ", whose directory is not writable: choose another place");
    }
  }
}

void check_output_dir(const std::string& flag, const std::string& given, const std::vector<std::string>& names) {
  std::error_code error;
  const std::string at = "--" + flag + " " + quote_path(given);
  const std::string dir = without_trailing_slashes(fs::path(given).lexically_normal().string());
  if (is_dangling_link(dir)) {
    throw UsageError(at + ": is a symbolic link to " + quote_path(link_target(dir)) +
                     ", which does not exist: create it or give another path");
  }
  if (fs::exists(dir, error)) {
    if (!fs::is_directory(dir, error)) throw UsageError(at + ": exists and is not a directory");
    if (!writable(dir)) throw UsageError(at + ": the directory is not writable");
    for (const std::string& name : names) {
      const fs::path file = fs::path(dir) / name;
      if (fs::is_directory(file, error)) {
        throw UsageError(at + ": " + quote_path(file.string()) +
                         " is a directory, where the output file of that name goes: move it");
      }
    }
    return;
  }
  const fs::path parent = directory_of(dir);
  if (!fs::is_directory(parent, error)) {
    throw UsageError(at + ": its parent " + quote_path(parent.string()) + " does not exist: create it first");
  }
  if (!writable(parent)) throw UsageError(at + ": cannot be created, its parent is not writable");
}

void check_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs) {
  // Where each output really goes: links followed as far as the path exists.
  const auto resolved = [](const std::string& path) {
    std::error_code error;
    fs::path p = fs::weakly_canonical(fs::absolute(path), error);
    if (error) p = fs::absolute(path).lexically_normal();
    return fs::path(without_trailing_slashes(p.string()));
  };
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (size_t j = i + 1; j < outputs.size(); ++j) {
      const fs::path a = resolved(outputs[i].second);
      const fs::path b = resolved(outputs[j].second);
      const auto inside = [](const fs::path& inner, const fs::path& outer) {
        const std::string rel = inner.lexically_relative(outer).string();
        return !rel.empty() && rel != "." && rel.rfind("..", 0) != 0;
      };
      if (a == b || inside(a, b) || inside(b, a)) {
        throw UsageError("--" + outputs[i].first + " " + quote_path(outputs[i].second) + " and --" +
                         outputs[j].first + " " + quote_path(outputs[j].second) +
                         " overlap: give each output its own path");
      }
    }
  }
}

OutputSet::~OutputSet() {
  std::error_code ignored;
  for (const std::string& temporary : temporaries_) fs::remove_all(temporary, ignored);
  // signals_ goes last, and raises a signal that arrived meanwhile
}

void OutputSet::stage_file(const std::string& path, const std::string& text) {
  throw_if_interrupted();
  AtomicFile file(path);
  file.write(text.data(), text.size());
  file.close();  // a write error surfaces now, before anything is renamed
  temporaries_.reserve(temporaries_.size() + 1);
  moves_.reserve(moves_.size() + 1);
  const std::string staged = file.release();
  temporaries_.push_back(staged);
  moves_.emplace_back(staged, file.path());
}

void OutputSet::stage_dir(const std::string& given, const std::function<void(const std::string& tmp)>& write) {
  throw_if_interrupted();
  const std::string dir = without_trailing_slashes(fs::path(given).lexically_normal().string());
  const std::string pid = std::to_string(getpid());
  std::error_code error;
  // Inside an existing directory (through a link, or a mount point: its own file system), or
  // beside a new one (on the file system it will be created on): renames never cross.
  const bool existing = fs::is_directory(dir, error);
  const std::string tmp = existing ? (fs::path(dir) / (".thdcp-staging-" + pid)).string() : dir + ".tmp-" + pid;
  fs::remove_all(tmp, error);
  temporaries_.push_back(tmp);
  THDCP_CHECK(fs::create_directory(tmp, error) && !error,
              quote_path(tmp) << ": cannot create the temporary output directory (" << error.message() << ")");
  write(tmp);
  throw_if_interrupted();
  if (!existing) {
    moves_.emplace_back(tmp, dir, true);
    return;
  }
  for (const fs::directory_entry& entry : fs::directory_iterator(tmp)) {
    moves_.emplace_back(entry.path().string(), (fs::path(dir) / entry.path().filename()).string());
  }
}

std::string OutputSet::undo() {
  std::string left;
  for (auto m = moves_.rbegin(); m != moves_.rend(); ++m) {
    if (m->moved) {
      if (std::rename(m->to.c_str(), m->from.c_str()) == 0) {
        m->moved = false;
      } else if (!m->backed_up) {
        left += " " + quote_path(m->to);
      }
    }
    if (m->backed_up) {
      // Over the new file if it could not be moved back: the old one is what must be there.
      if (std::rename(m->backup.c_str(), m->to.c_str()) == 0) {
        m->backed_up = false;
      } else {
        left += " " + quote_path(m->to) + " (its former file is " + quote_path(m->backup) + ")";
      }
    }
  }
  return left;
}

void OutputSet::commit() {
  pause_for_tests();
  throw_if_interrupted();
  // Before anything is renamed: every staged output still there, every target still what the
  // checks before the run found (or nothing).
  std::error_code error;
  for (const Move& m : moves_) {
    THDCP_CHECK(lexists(m.from), quote_path(m.from) << ": the staged output was removed during the run: nothing was written");
    if (!lexists(m.to)) continue;
    THDCP_CHECK(!m.directory, quote_path(m.to) << ": appeared during the run (thdcp was to create it): nothing was written");
    THDCP_CHECK(fs::is_regular_file(m.to, error),
                quote_path(m.to) << ": changed during the run into something that is not a regular file: nothing was written");
  }
  // From here on a signal waits for the commit: it takes a few renames.
  const std::string pid = std::to_string(getpid());
  std::string failure;
  for (Move& m : moves_) {
    if (m.directory || !lexists(m.to)) continue;
    m.backup = m.to + ".thdcp-old-" + pid;
    if (commit_rename(m.to, m.backup) != 0) {
      failure = quote_path(m.to) + ": cannot set it aside as " + quote_path(m.backup) + " (" + std::strerror(errno) + ")";
      break;
    }
    m.backed_up = true;
  }
  for (Move& m : moves_) {
    if (!failure.empty()) break;
    if (commit_rename(m.from, m.to) != 0) {
      failure = quote_path(m.to) + ": cannot rename " + quote_path(m.from) + " to it (" + std::strerror(errno) + ")";
      break;
    }
    m.moved = true;
  }
  if (!failure.empty()) {
    const std::string left = undo();
    THDCP_FAIL(failure << (left.empty() ? ": no output was written, every target is as it was"
                                        : ": no output was written, but these could not be put back:" + left));
  }
  for (const Move& m : moves_) {
    if (m.backed_up) std::remove(m.backup.c_str());
  }
  moves_.clear();
  for (const std::string& temporary : temporaries_) fs::remove_all(temporary, error);  // staging dirs, now empty
  temporaries_.clear();
}

void set_commit_rename_for_tests(int (*rename)(const char* from, const char* to)) { g_commit_rename = rename; }

void write_text_file(const std::string& path, const std::string& text) {
  AtomicFile file(path);
  file.write(text.data(), text.size());
  file.commit();
}

}  // namespace thdcp::tools
