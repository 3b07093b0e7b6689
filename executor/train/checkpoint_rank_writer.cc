#include "executor/train/checkpoint_rank_writer.h"

#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "executor/io/parallel_tasks.h"
#include "executor/io/xxh3.h"
#include "executor/train/checkpoint_format.h"

namespace megaplan::exec::checkpoint_format {

namespace {

// The directory, created before its model.bin's temporary file is.
const std::string& created_directory(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::create_directory(path, error)) {
    throw SpecError("--save", path + ": cannot create: " + (error ? error.message() : std::string("exists")));
  }
  return path;
}

}  // namespace

RankFileWriter::RankFileWriter(const std::string& path, const RankLayout& layout, int64_t threads)
    : path_(path), layout_(layout), threads_(threads), data_(created_directory(path) + "/model.bin") {
  for (const TensorEntry& entry : layout_.entries) {
    block_checksums_.emplace_back(block_count(entry.bytes(), kChecksumBlockBytes));
  }
}

uint64_t RankFileWriter::block_size(std::size_t tensor, std::size_t index) const {
  const uint64_t begin = index * kChecksumBlockBytes;
  return std::min(kChecksumBlockBytes, layout_.entries[tensor].bytes() - begin);
}

void RankFileWriter::add(std::size_t tensor, std::size_t index, const char* bytes) {
  queued_.push_back({tensor, index, bytes});
}

void RankFileWriter::flush() {
  run_tasks(queued_.size(), threads_, [&](std::size_t q) {
    const Queued& block = queued_[q];
    const uint64_t size = block_size(block.tensor, block.index);
    block_checksums_[block.tensor][block.index] = xxh3_64(block.bytes, size);
    data_.write_at(layout_.offsets[block.tensor] + block.index * kChecksumBlockBytes, block.bytes, size);
  });
  queued_.clear();
}

void RankFileWriter::commit() {
  flush();
  data_.commit();
  write_file_atomically(path_ + "/manifest.json", rank_manifest(layout_, block_checksums_).dump(1) + "\n");
  sync_directory(path_);
}

void write_rank_image(const std::string& path, const RankLayout& layout, const char* image, int64_t threads) {
  RankFileWriter writer(path, layout, threads);
  for (std::size_t t = 0; t < layout.entries.size(); ++t) {
    for (std::size_t b = 0; b < writer.blocks(t); ++b) {
      writer.add(t, b, image + layout.offsets[t] + b * kChecksumBlockBytes);
    }
  }
  writer.commit();
}

}  // namespace megaplan::exec::checkpoint_format
