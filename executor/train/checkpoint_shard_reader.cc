#include "executor/train/checkpoint_shard_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <set>
#include <string>

#include "core/fnv1a.h"
#include "executor/io/parallel_tasks.h"
#include "executor/io/xxh3.h"
#include "executor/train/checkpoint_format.h"

namespace megaplan::exec::checkpoint_format {

namespace {

// A data file read at any offset by several threads at once.
class DataFile {
 public:
  explicit DataFile(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    struct stat status {};
    if (fd_ < 0) refuse_load(path + ": cannot open: " + std::strerror(errno));
    if (::fstat(fd_, &status) != 0) {
      const std::string reason = std::strerror(errno);
      ::close(fd_);  // the destructor of an object never made does not run
      refuse_load(path + ": cannot stat: " + reason);
    }
    size_ = static_cast<uint64_t>(status.st_size);
  }
  ~DataFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  DataFile(const DataFile&) = delete;
  DataFile& operator=(const DataFile&) = delete;
  uint64_t size() const { return size_; }
  // Whether all `size` bytes at `offset` were read.
  bool read_at(uint64_t offset, void* data, uint64_t size) const {
    auto* bytes = static_cast<char*>(data);
    for (uint64_t done = 0; done < size;) {
      const ssize_t result = ::pread(fd_, bytes + done, size - done, static_cast<off_t>(offset + done));
      if (result < 0 && errno == EINTR) continue;
      if (result <= 0) return false;
      done += static_cast<uint64_t>(result);
    }
    return true;
  }

 private:
  int fd_;
  uint64_t size_ = 0;
};

[[noreturn]] void refuse_short_file(const SavedShard& shard, uint64_t file_size) {
  refuse_load(shard.data_file + ": ends before " + shard.name + " (" + std::to_string(shard.bytes()) +
              " bytes at offset " + std::to_string(shard.offset) + " of its " + std::to_string(file_size) + ")");
}

// The data files of `shards`, each opened once, and each shard's; a shard's bytes checked to lie
// in its file before any memory is taken for them.
struct OpenFiles {
  std::map<std::string, std::unique_ptr<DataFile>> by_path;
  std::vector<const DataFile*> of_shard;
  explicit OpenFiles(const std::vector<const SavedShard*>& shards) {
    for (const SavedShard* shard : shards) {
      std::unique_ptr<DataFile>& file = by_path[shard->data_file];
      if (!file) file = std::make_unique<DataFile>(shard->data_file);
      if (shard->offset > file->size() || shard->bytes() > file->size() - shard->offset) {
        refuse_short_file(*shard, file->size());
      }
      of_shard.push_back(file.get());
    }
  }
};

// Reads block `block` of its shard into `data`, refusing a file that ends before it.
void read_block(const OpenFiles& files, const SavedShard& shard, const Block& block, char* data) {
  const DataFile& file = *files.of_shard[block.item];
  if (!file.read_at(shard.offset + block.begin, data, block.size)) refuse_short_file(shard, file.size());
}

[[noreturn]] void refuse_checksum(const SavedShard& shard, uint64_t checksum) {
  refuse_load(shard.data_file + ": checksum of " + shard.name + " does not match its manifest (" +
              (shard.algorithm == kXxh3Checksum ? "XXH3-64 " : "FNV-1a 64 ") + hex(checksum) + " read, " +
              hex(shard.checksum) + " saved): the file is corrupted");
}

}  // namespace

void read_shards(const std::vector<const SavedShard*>& needed, int64_t threads, ShardBytes& read) {
  std::vector<const SavedShard*> wanted;
  for (const SavedShard* shard : needed) {
    if (read[shard].uses++ == 0) wanted.push_back(shard);
  }
  const OpenFiles files(wanted);
  std::vector<Block> blocks;
  std::vector<std::vector<uint64_t>> block_checksums(wanted.size());
  std::vector<float*> destination(wanted.size());
  for (std::size_t k = 0; k < wanted.size(); ++k) {
    const SavedShard& shard = *wanted[k];
    std::vector<float>& bytes = read[&shard].bytes;
    bytes.resize(shard.bytes() / sizeof(float));
    destination[k] = bytes.data();
    const bool blocked = shard.algorithm == kXxh3Checksum;
    const uint64_t block_bytes = blocked ? shard.block_bytes : kChecksumBlockBytes;
    if (blocked) block_checksums[k].resize(block_count(shard.bytes(), block_bytes));
    append_blocks(k, shard.bytes(), block_bytes, blocks);
  }
  run_tasks(blocks.size(), threads, [&](std::size_t b) {
    const Block& block = blocks[b];
    const SavedShard& shard = *wanted[block.item];
    char* data = reinterpret_cast<char*>(destination[block.item]) + block.begin;
    read_block(files, shard, block, data);
    if (shard.algorithm == kXxh3Checksum) block_checksums[block.item][block.index] = xxh3_64(data, block.size);
  });
  run_tasks(wanted.size(), threads, [&](std::size_t k) {
    const SavedShard& shard = *wanted[k];
    const uint64_t checksum = shard.algorithm == kXxh3Checksum ? combine_block_checksums(block_checksums[k])
                                                               : Fnv1a64().add(destination[k], shard.bytes()).value();
    if (checksum != shard.checksum) refuse_checksum(shard, checksum);
  });
}

void verify_unread_replicas(const std::map<std::string, std::vector<SavedShard>>& saved,
                            const std::vector<const SavedShard*>& read, int64_t threads,
                            const std::function<bool(const SavedShard&)>& mine) {
  const std::set<const SavedShard*> done(read.begin(), read.end());
  std::set<const SavedShard*> replicas;
  for (const SavedShard* shard : done) {
    for (const SavedShard& other : saved.at(shard->name)) {
      if (!done.count(&other) && same_part(other.cut, shard->cut) && mine(other)) replicas.insert(&other);
    }
  }
  ShardBytes checked;
  read_shards(std::vector<const SavedShard*>(replicas.begin(), replicas.end()), threads, checked);
}

bool streamable(const SavedShard& shard) {
  return shard.algorithm == kXxh3Checksum && shard.block_bytes <= kChecksumBlockBytes;
}

void stream_shards(const std::vector<const SavedShard*>& shards, int64_t threads, char* window, std::size_t slots,
                   const std::function<void(std::size_t, uint64_t, const char*, uint64_t)>& deliver,
                   const std::function<void()>& delivered) {
  const OpenFiles files(shards);
  std::vector<Block> blocks;
  std::vector<std::vector<uint64_t>> block_checksums(shards.size());
  for (std::size_t k = 0; k < shards.size(); ++k) {
    block_checksums[k].resize(block_count(shards[k]->bytes(), shards[k]->block_bytes));
    append_blocks(k, shards[k]->bytes(), shards[k]->block_bytes, blocks);
  }
  for (std::size_t first = 0; first < blocks.size(); first += slots) {
    const std::size_t count = std::min(slots, blocks.size() - first);
    run_tasks(count, threads, [&](std::size_t slot) {
      const Block& block = blocks[first + slot];
      const SavedShard& shard = *shards[block.item];
      char* data = window + slot * kChecksumBlockBytes;
      read_block(files, shard, block, data);
      block_checksums[block.item][block.index] = xxh3_64(data, block.size);
    });
    // The shards whose last block is in this window are checked before any block of it goes on.
    for (std::size_t slot = 0; slot < count; ++slot) {
      const Block& block = blocks[first + slot];
      if (block.index + 1 < block_checksums[block.item].size()) continue;
      const uint64_t checksum = combine_block_checksums(block_checksums[block.item]);
      if (checksum != shards[block.item]->checksum) refuse_checksum(*shards[block.item], checksum);
    }
    for (std::size_t slot = 0; slot < count; ++slot) {
      const Block& block = blocks[first + slot];
      deliver(block.item, block.begin, window + slot * kChecksumBlockBytes, block.size);
    }
    delivered();
  }
}

}  // namespace megaplan::exec::checkpoint_format
