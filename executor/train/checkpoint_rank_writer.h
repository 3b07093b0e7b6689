// Writes a rank directory of a checkpoint (model.bin, then manifest.json) block by block: threads
// checksum each block of kChecksumBlockBytes and write it at its offset, so that one large tensor
// spreads over every thread. The caller says where each block's bytes lie: in a whole image of
// model.bin (--async-save) or in a small window a synchronous save streams the device through.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "executor/io/staged_file.h"
#include "executor/train/checkpoint_manifest.h"

namespace megaplan::exec::checkpoint_format {

class RankFileWriter {
 public:
  // Creates the directory `path` and a staged model.bin in it, laid out as `layout` (kept by
  // reference until commit()). Throws SpecError("--save", ...).
  RankFileWriter(const std::string& path, const RankLayout& layout, int64_t threads);
  // Block `index` of tensor `tensor` (bytes from index x kChecksumBlockBytes, the last block
  // shorter) lies at `bytes` until the next flush() returns.
  void add(std::size_t tensor, std::size_t index, const char* bytes);
  // Checksums and writes the blocks added since the last flush, on the threads.
  void flush();
  // Flushes, syncs model.bin into place, writes the manifest and syncs the directory.
  // REQUIRES: every block of every tensor added.
  void commit();

  // The size of block `index` of tensor `tensor`.
  uint64_t block_size(std::size_t tensor, std::size_t index) const;
  std::size_t blocks(std::size_t tensor) const { return block_checksums_[tensor].size(); }

 private:
  struct Queued {
    std::size_t tensor, index;
    const char* bytes;
  };
  std::string path_;
  const RankLayout& layout_;
  int64_t threads_;
  StagedFile data_;
  std::vector<std::vector<uint64_t>> block_checksums_;  // by tensor and block
  std::vector<Queued> queued_;
};

// The rank directory `path` written from `image`, model.bin's whole bytes laid out as `layout`.
void write_rank_image(const std::string& path, const RankLayout& layout, const char* image, int64_t threads);

}  // namespace megaplan::exec::checkpoint_format
