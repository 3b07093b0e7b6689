#include "executor/runtime/pinned_host_buffer.h"

namespace megaplan::exec {

PinnedHostBuffer::~PinnedHostBuffer() {
  try {
    release();
  } catch (...) {
    // The memory is freed next whatever the device says; a failed unlock leaves nothing to undo.
  }
}

char* PinnedHostBuffer::reserve(std::size_t bytes) {
  if (bytes <= bytes_) return memory_.get();
  release();
  // Default-initialised: pages are touched by the first copy into them, not twice.
  std::unique_ptr<char[]> memory(new char[bytes]);
  backend_.pin_host(memory.get(), bytes);
  memory_ = std::move(memory);
  bytes_ = bytes;
  return memory_.get();
}

void PinnedHostBuffer::release() {
  if (!memory_) return;
  char* memory = memory_.get();
  bytes_ = 0;
  std::unique_ptr<char[]> freed = std::move(memory_);  // freed after the unlock, even when it throws
  backend_.unpin_host(memory);
}

}  // namespace megaplan::exec
