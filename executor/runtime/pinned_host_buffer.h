// Host memory page-locked by a backend for as long as it is held: checkpoints' images and the
// windows their saves and loads stream through, whose copies to and from the device then run at
// the bus's speed without a staging copy by the driver.
#pragma once

#include <cstddef>
#include <memory>

#include "executor/runtime/backend.h"

namespace megaplan::exec {

class PinnedHostBuffer {
 public:
  explicit PinnedHostBuffer(Backend& backend) : backend_(backend) {}
  ~PinnedHostBuffer();  // unpins, then frees
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;

  // At least `bytes` of page-locked memory, uninitialised: the memory held when it is large enough
  // (its contents kept), else a new allocation (the old one unpinned and freed first).
  char* reserve(std::size_t bytes);
  char* data() const { return memory_.get(); }
  std::size_t bytes() const { return bytes_; }  // held; 0 before the first reserve

 private:
  void release();
  Backend& backend_;
  std::unique_ptr<char[]> memory_;
  std::size_t bytes_ = 0;
};

}  // namespace megaplan::exec
