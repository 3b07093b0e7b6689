// Atomic file replacement: temp file in the same directory, fsync, rename.
#include "cli/atomic_write.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <cstdio>
#include <vector>

#include "core/error.h"

namespace megaplan::cli {

void write_file_atomically(const std::string& path, const std::string& contents) {
  std::string pattern = path + ".tmp.XXXXXX";
  std::vector<char> temporary(pattern.begin(), pattern.end());
  temporary.push_back('\0');
  const int fd = ::mkstemp(temporary.data());
  if (fd < 0) throw SpecError(path, std::string("cannot create a file beside it: ") + std::strerror(errno));

  const auto fail = [&](const char* step) {
    const int saved = errno;
    ::close(fd);
    ::unlink(temporary.data());
    throw SpecError(path, std::string(step) + " failed: " + std::strerror(saved));
  };
  std::size_t written = 0;
  while (written < contents.size()) {
    const ssize_t result = ::write(fd, contents.data() + written, contents.size() - written);
    if (result < 0) {
      if (errno == EINTR) continue;
      fail("write");
    }
    written += static_cast<std::size_t>(result);
  }
  if (::fchmod(fd, 0644) != 0) fail("chmod");
  if (::fsync(fd) != 0) fail("fsync");
  if (::close(fd) != 0) {
    const int saved = errno;
    ::unlink(temporary.data());
    throw SpecError(path, std::string("close failed: ") + std::strerror(saved));
  }
  if (std::rename(temporary.data(), path.c_str()) != 0) {
    const int saved = errno;
    ::unlink(temporary.data());
    throw SpecError(path, std::string("rename failed: ") + std::strerror(saved));
  }
}

}  // namespace megaplan::cli
