// An exclusive advisory lock on a folder (flock on the folder itself) for the object's life: the
// kernel releases it when the descriptor closes, also when the process dies, so a killed run never
// leaves a stale lock behind. Where the folder cannot be opened or the filesystem has no flock
// (some network filesystems), no lock is held and the caller goes on unguarded.
#pragma once

#include <string>

namespace megaplan::exec {

class FolderLock {
 public:
  enum class Wait { kUntilFree, kNot };
  // kUntilFree waits while another descriptor holds the lock; kNot returns at once, busy() then
  // saying whether another held it. Locks of one process on two descriptors exclude each other too.
  FolderLock(const std::string& folder, Wait wait);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

  bool held() const { return fd_ >= 0; }
  bool busy() const { return busy_; }

 private:
  int fd_ = -1;
  bool busy_ = false;
};

}  // namespace megaplan::exec
