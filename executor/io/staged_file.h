// Files that appear whole or not at all: written under a temporary name beside their destination,
// synced, and renamed into place on commit(); dropped (unlinked) if never committed. Datasets,
// checkpoints and every report megaplan writes go through it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace megaplan::exec {

class StagedFile {
 public:
  // Throws SpecError(path, ...) when `path` exists and is not a regular file, or is a file this
  // process read as input (core/text_file.h), or when no temporary file can be created beside it.
  explicit StagedFile(std::string path);
  ~StagedFile();  // unlinks the temporary file unless committed
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;

  void write(const void* data, std::size_t size);
  // `size` bytes at byte `offset` of the file (extending it as needed), without moving write()'s
  // position: several threads may write disjoint ranges at once (large files built in parallel).
  void write_at(uint64_t offset, const void* data, std::size_t size);
  // fsync, close, and rename over the destination. Throws SpecError(path, ...) on failure.
  void commit();

 private:
  [[noreturn]] void fail(const char* step);
  std::string path_;
  std::string temporary_;
  int fd_ = -1;
  bool committed_ = false;
};

// One text or binary file, atomically.
void write_file_atomically(const std::string& path, const std::string& contents);

}  // namespace megaplan::exec
