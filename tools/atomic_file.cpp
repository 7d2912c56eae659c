#include "atomic_file.h"

#include <cerrno>
#include <cstring>

#include "thdcp/core/error.h"

namespace thdcp::tools {

AtomicFile::AtomicFile(const std::string& path) : path_(path), temp_path_(path + ".tmp") {
  file_ = std::fopen(temp_path_.c_str(), "wb");
  THDCP_CHECK(file_ != nullptr, path << ": cannot create " << temp_path_ << " (" << std::strerror(errno)
                                     << "): check that the directory exists and is writable");
}

AtomicFile::~AtomicFile() {
  if (file_ != nullptr) {
    std::fclose(file_);
    std::remove(temp_path_.c_str());
  }
}

void AtomicFile::write(const void* data, size_t size) {
  THDCP_CHECK(file_ != nullptr, path_ << ": write after commit");
  if (size == 0) return;
  THDCP_CHECK(std::fwrite(data, 1, size, file_) == size,
              path_ << ": writing " << size << " bytes failed (" << std::strerror(errno) << "): is the disk full?");
}

void AtomicFile::commit() {
  THDCP_CHECK(file_ != nullptr, path_ << ": committed twice");
  const bool flushed = std::fflush(file_) == 0;
  const int flush_errno = errno;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!flushed || !closed) {
    std::remove(temp_path_.c_str());
    THDCP_FAIL(path_ << ": writing failed (" << std::strerror(flushed ? errno : flush_errno)
                     << "): is the disk full?");
  }
  if (std::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const int rename_errno = errno;
    std::remove(temp_path_.c_str());
    THDCP_FAIL(path_ << ": cannot rename " << temp_path_ << " to it (" << std::strerror(rename_errno) << ")");
  }
}

void write_text_file(const std::string& path, const std::string& text) {
  AtomicFile file(path);
  file.write(text.data(), text.size());
  file.commit();
}

}  // namespace thdcp::tools
