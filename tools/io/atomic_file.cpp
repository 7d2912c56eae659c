#include "io/atomic_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "io/args.h"
#include "thdcp/core/error.h"

namespace thdcp::tools {

namespace {

std::string quote_path(const std::string& path) { return quote_excerpt(path, kPathExcerptChars); }

}  // namespace

AtomicFile::AtomicFile(const std::string& path) : path_(path), temp_path_(path + ".tmp") {
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
  if (size == 0) return;
  THDCP_CHECK(std::fwrite(data, 1, size, file_) == size,
              quote_path(path_) << ": writing " << size << " bytes failed (" << std::strerror(errno) << "): is the disk full?");
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

namespace {

namespace fs = std::filesystem;

bool writable(const fs::path& p) { return access(p.c_str(), W_OK) == 0; }

fs::path directory_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

}  // namespace

void check_output_file(const std::string& flag, const std::string& path) {
  std::error_code error;
  const std::string at = "--" + flag + " " + quote_path(path);
  if (fs::is_directory(path, error)) throw UsageError(at + ": is a directory: give a file name");
  const fs::path dir = directory_of(path);
  if (!fs::is_directory(dir, error)) {
    throw UsageError(at + ": its directory " + quote_path(dir.string()) + " does not exist: create it first");
  }
  if (!writable(dir)) throw UsageError(at + ": its directory is not writable: choose another place");
  if (fs::exists(path, error)) {
    if (!fs::is_regular_file(path, error)) throw UsageError(at + ": exists and is not a regular file");
    if (!writable(path)) throw UsageError(at + ": exists and is not writable");
  }
}

void check_output_dir(const std::string& flag, const std::string& dir, const std::vector<std::string>& names) {
  std::error_code error;
  const std::string at = "--" + flag + " " + quote_path(dir);
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
  const fs::path parent = directory_of(fs::path(dir).lexically_normal().string());
  if (!fs::is_directory(parent, error)) {
    throw UsageError(at + ": its parent " + quote_path(parent.string()) + " does not exist: create it first");
  }
  if (!writable(parent)) throw UsageError(at + ": cannot be created, its parent is not writable");
}

void check_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (size_t j = i + 1; j < outputs.size(); ++j) {
      const fs::path a = fs::absolute(outputs[i].second).lexically_normal();
      const fs::path b = fs::absolute(outputs[j].second).lexically_normal();
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
  for (const auto& d : dirs_) fs::remove_all(d.second, ignored);
  // files_: each AtomicFile removes its temporary unless committed
}

void OutputSet::stage_file(const std::string& path, const std::string& text) {
  files_.push_back(std::make_unique<AtomicFile>(path));
  files_.back()->write(text.data(), text.size());
  files_.back()->close();  // a write error surfaces now, before anything is renamed
}

void OutputSet::stage_dir(const std::string& dir, const std::function<void(const std::string& tmp)>& write) {
  const std::string tmp = fs::path(dir).lexically_normal().string() + ".tmp-" + std::to_string(getpid());
  std::error_code error;
  fs::remove_all(tmp, error);
  THDCP_CHECK(fs::create_directory(tmp, error) && !error,
              quote_path(tmp) << ": cannot create the temporary output directory (" << error.message() << ")");
  dirs_.emplace_back(dir, tmp);
  write(tmp);
}

void OutputSet::commit() {
  std::error_code error;
  for (const auto& [dir, tmp] : dirs_) {
    fs::create_directories(dir, error);
    THDCP_CHECK(!error, quote_path(dir) << ": cannot create the directory (" << error.message() << ")");
    for (const fs::directory_entry& entry : fs::directory_iterator(tmp)) {
      fs::rename(entry.path(), fs::path(dir) / entry.path().filename(), error);
      THDCP_CHECK(!error, quote_path(dir) << ": cannot move " << quote_path(entry.path().filename().string()) << " into it ("
                                                  << error.message() << ")");
    }
  }
  for (auto& f : files_) f->commit();
  files_.clear();
  for (const auto& d : dirs_) fs::remove_all(d.second, error);
  dirs_.clear();
}

void write_text_file(const std::string& path, const std::string& text) {
  AtomicFile file(path);
  file.write(text.data(), text.size());
  file.commit();
}

}  // namespace thdcp::tools
