// A cache file of integer arrays: the sample indexes a dataset's samples are read through, built
// once and memory-mapped read-only by later runs and by every rank (executor/data/index_cache.h
// decides where and when).
//
// Layout (little-endian):
//   bytes 0-7    magic "MPINDEX1"
//   bytes 8-15   uint64 header size H: where the arrays start, a multiple of 4096
//   bytes 16-23  uint64 FNV-1a of the header text
//   bytes 24-31  uint64 header text length L
//   bytes 32-    the header text, L bytes of JSON, zero-padded to H:
//                {"description": what was asked (hashed into the file's name),
//                 "inputs": [{"path", "bytes", "mtime_ns"}] (the files it was built from),
//                 "facts": what the builder derived (epochs, counts),
//                 "sections": [{"name", "width", "count", "offset"}], "file_bytes": the file's size}
//   sections     `count` unsigned integers of `width` bytes (2, 4 or 8: the narrowest that holds the
//                section's largest value), each section starting at a multiple of 4096.
// A file is written under a temporary name and renamed into place (executor/io/staged_file.h), so
// it is whole or absent; a file of another size than its header says, or whose header fails its
// checksum, was damaged afterwards and is refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "executor/io/mapped_file.h"
#include "executor/io/staged_file.h"

namespace megaplan::exec {

// The narrowest width (2, 4 or 8 bytes) that holds every value up to `largest`.
int index_width(uint64_t largest);

// One section of a mapped file: element i, widened to 64 bits.
class PackedArray {
 public:
  PackedArray() = default;
  PackedArray(const unsigned char* data, int width, uint64_t count) : data_(data), width_(width), count_(count) {}
  uint64_t size() const { return count_; }
  int width() const { return width_; }
  // REQUIRES: i < size().
  uint64_t operator[](uint64_t i) const {
    switch (width_) {
      case 2: return load<uint16_t>(i);
      case 4: return load<uint32_t>(i);
      default: return load<uint64_t>(i);
    }
  }

 private:
  template <typename T>
  uint64_t load(uint64_t i) const {
    T value;
    std::memcpy(&value, data_ + i * sizeof(T), sizeof(T));
    return value;
  }
  const unsigned char* data_ = nullptr;
  int width_ = 8;
  uint64_t count_ = 0;
};

struct IndexSection {
  std::string name;
  int width = 8;  // index_width() of the section's largest value
  uint64_t count = 0;
};

class IndexFileWriter {
 public:
  // Stages `path` and writes its header: `header` (the description and inputs, from the cache,
  // and the builder's facts) with the sections' layout added. Throws StagedFile's SpecError.
  IndexFileWriter(const std::string& path, nlohmann::json header, const std::vector<IndexSection>& sections);

  // Elements [first, first + count) of section `section`, narrowed to its width. Threads may write
  // disjoint ranges at once. REQUIRES: they lie within the section and every value fits its width.
  template <typename T>
  void write(std::size_t section, uint64_t first, const T* values, uint64_t count);
  // Syncs the file and renames it into place. REQUIRES: every element of every section written.
  void commit() { file_.commit(); }

 private:
  void write_bytes(std::size_t section, uint64_t first, const void* data, uint64_t count);

  StagedFile file_;
  std::vector<IndexSection> sections_;
  std::vector<uint64_t> offsets_;
};

// A whole index file, mapped read-only.
class MappedIndexFile {
 public:
  // Maps `path` and checks its framing. Throws SpecError(field, "PATH: RULE; ...") for a file too
  // short for its header, a wrong magic, a header failing its checksum or not JSON of the layout
  // above, or a size other than the header's file_bytes: a damaged cache, deleted to rebuild.
  MappedIndexFile(const std::string& path, const std::string& field);

  const std::string& path() const { return path_; }
  const nlohmann::json& header() const { return header_; }
  const nlohmann::json& facts() const { return header_.at("facts"); }
  // The named section. Throws SpecError(field, ...) when the header has none of that name.
  PackedArray section(const std::string& name) const;
  // Throws SpecError(field, "PATH: RULE: the cached index is damaged; ..."): for readers that find
  // an entry out of range.
  [[noreturn]] void damaged(const std::string& rule) const;

 private:
  std::string path_;
  std::string field_;
  MappedFile file_;
  nlohmann::json header_;
};

template <typename T>
void IndexFileWriter::write(std::size_t section, uint64_t first, const T* values, uint64_t count) {
  const auto width = static_cast<std::size_t>(sections_[section].width);
  if (width == sizeof(T)) {
    write_bytes(section, first, values, count);
    return;
  }
  constexpr uint64_t kPiece = 1 << 14;  // elements narrowed at a time, on the stack
  unsigned char narrowed[kPiece * sizeof(uint64_t)];
  for (uint64_t done = 0; done < count; done += kPiece) {
    const uint64_t piece = count - done < kPiece ? count - done : kPiece;
    for (uint64_t i = 0; i < piece; ++i) {
      const uint64_t value = static_cast<uint64_t>(values[done + i]);
      if (width == 2) {
        const auto narrow = static_cast<uint16_t>(value);
        std::memcpy(narrowed + i * 2, &narrow, 2);
      } else if (width == 4) {
        const auto narrow = static_cast<uint32_t>(value);
        std::memcpy(narrowed + i * 4, &narrow, 4);
      } else {
        std::memcpy(narrowed + i * 8, &value, 8);
      }
    }
    write_bytes(section, first + done, narrowed, piece);
  }
}

}  // namespace megaplan::exec
