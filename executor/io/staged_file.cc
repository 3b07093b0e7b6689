#include "executor/io/staged_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/text_file.h"

namespace megaplan::exec {

StagedFile::StagedFile(std::string path) : path_(std::move(path)) {
  // What a rename would replace: only a regular file that is not one of this command's inputs
  // (a device such as /dev/null, a directory, a symlink, a pipe, or the plan being read, stay).
  struct stat status {};
  if (::lstat(path_.c_str(), &status) == 0) {
    if (!S_ISREG(status.st_mode)) {
      throw SpecError(path_,
                      "exists and is not a regular file (a device, directory, link or pipe): megaplan replaces "
                      "only regular files");
    }
    if (is_input_file(path_)) throw SpecError(path_, "is an input of this command: an output must not replace it");
  }
  std::string pattern = path_ + ".tmp.XXXXXX";
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  fd_ = ::mkstemp(name.data());
  if (fd_ < 0) throw SpecError(path_, std::string("cannot create a file beside it: ") + std::strerror(errno));
  temporary_ = name.data();
}

StagedFile::~StagedFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temporary_.c_str());
}

void StagedFile::fail(const char* step) {
  const int saved = errno;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(temporary_.c_str());
  committed_ = true;  // nothing left to remove
  throw SpecError(path_, std::string(step) + " failed: " + std::strerror(saved));
}

void StagedFile::write(const void* data, std::size_t size) {
  const auto* bytes = static_cast<const char*>(data);
  std::size_t written = 0;
  while (written < size) {
    const ssize_t result = ::write(fd_, bytes + written, size - written);
    if (result < 0) {
      if (errno == EINTR) continue;
      fail("write");
    }
    written += static_cast<std::size_t>(result);
  }
}

void StagedFile::write_at(uint64_t offset, const void* data, std::size_t size) {
  const auto* bytes = static_cast<const char*>(data);
  std::size_t written = 0;
  while (written < size) {
    const ssize_t result = ::pwrite(fd_, bytes + written, size - written, static_cast<off_t>(offset + written));
    if (result < 0) {
      if (errno == EINTR) continue;
      // Not fail(): other threads may be writing to fd_; the destructor removes the file.
      throw SpecError(path_, std::string("write failed: ") + std::strerror(errno));
    }
    written += static_cast<std::size_t>(result);
  }
}

void StagedFile::commit() {
  if (::fchmod(fd_, 0644) != 0) fail("chmod");
  if (::fsync(fd_) != 0) fail("fsync");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("close");
  if (std::rename(temporary_.c_str(), path_.c_str()) != 0) fail("rename");
  committed_ = true;
}

void write_file_atomically(const std::string& path, const std::string& contents) {
  StagedFile file(path);
  file.write(contents.data(), contents.size());
  file.commit();
}

}  // namespace megaplan::exec
