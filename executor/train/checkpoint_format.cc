#include "executor/train/checkpoint_format.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "core/fnv1a.h"
#include "core/text_file.h"
#include "executor/io/xxh3.h"

namespace megaplan::exec::checkpoint_format {

std::size_t window_slots(std::size_t blocks, int64_t threads) {
  return std::max<std::size_t>(1, std::min(blocks, kWindowBlocksPerThread * static_cast<std::size_t>(threads)));
}

std::string iteration_directory(int64_t iteration) {
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07lld", static_cast<long long>(iteration));
  return name;
}

std::string rank_directory(int64_t tensor_parallel_rank, int64_t pipeline_rank, int64_t pipeline_parallel_size,
                           int64_t expert_parallel_rank, int64_t expert_parallel_size) {
  char name[64];
  if (pipeline_parallel_size == 1) {
    std::snprintf(name, sizeof name, "mp_rank_%02lld", static_cast<long long>(tensor_parallel_rank));
  } else {
    std::snprintf(name, sizeof name, "mp_rank_%02lld_%03lld", static_cast<long long>(tensor_parallel_rank),
                  static_cast<long long>(pipeline_rank));
  }
  std::string directory = name;
  if (expert_parallel_size > 1) {
    std::snprintf(name, sizeof name, "_%03lld", static_cast<long long>(expert_parallel_rank));
    directory += name;
  }
  return directory;
}

void sync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

std::string hex(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

bool known_format(const nlohmann::json& format) {
  return format == kFormat || format == kUnboundFormat || format == kFnvFormat;
}

std::string json_checksum(nlohmann::json object) {
  object.erase("fnv1a64");
  const std::string text = object.dump();
  Fnv1a64 hash;
  hash.add(text.data(), text.size());
  return hex(hash.value());
}

void verify_json_checksum(const nlohmann::json& object, const std::string& path) {
  if (!object.contains("fnv1a64") || object["fnv1a64"] == json_checksum(object)) return;
  throw SpecError("--load", path + ": its checksum does not match its contents (FNV-1a 64 " + json_checksum(object) +
                                " computed): the file is corrupted");
}

void refuse_load(const std::string& rule) { throw SpecError("--load", rule); }

bool checkpoint_path_exists(const std::string& path) {
  std::error_code error;
  const bool exists = std::filesystem::exists(path, error);
  if (error) refuse_load(path + ": " + error.message());
  return exists;
}

std::string read_checkpoint_json_text(const std::string& path) {
  try {
    return read_file_contents(path, kMaxJsonFileBytes);
  } catch (const SpecError& failure) {
    refuse_load(failure.what());
  }
}

void append_blocks(std::size_t item, uint64_t bytes, uint64_t block_bytes, std::vector<Block>& blocks) {
  for (uint64_t begin = 0, index = 0; begin < bytes; begin += block_bytes, ++index) {
    blocks.push_back({item, static_cast<std::size_t>(index), begin, std::min(block_bytes, bytes - begin)});
  }
}

std::size_t block_count(uint64_t bytes, uint64_t block_bytes) {
  return static_cast<std::size_t>((bytes + block_bytes - 1) / block_bytes);
}

uint64_t combine_block_checksums(const std::vector<uint64_t>& blocks) {
  return xxh3_64(blocks.data(), blocks.size() * sizeof(uint64_t));
}

}  // namespace megaplan::exec::checkpoint_format
