#include "executor/io/folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>

namespace megaplan::exec {

FolderLock::FolderLock(const std::string& folder, Wait wait)
    : fd_(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
  if (fd_ < 0) return;
  const int operation = wait == Wait::kUntilFree ? LOCK_EX : LOCK_EX | LOCK_NB;
  while (::flock(fd_, operation) != 0) {
    if (errno == EINTR) continue;
    busy_ = errno == EWOULDBLOCK;
    ::close(fd_);
    fd_ = -1;
    return;
  }
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace megaplan::exec
