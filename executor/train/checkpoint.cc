#include "executor/train/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc 2.28)
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>
#include <utility>

#include "core/error.h"
#include "core/fnv1a.h"
#include "core/json_io.h"
#include "core/text_file.h"
#include "core/units.h"
#include "executor/io/parallel_tasks.h"
#include "executor/io/staged_file.h"
#include "executor/io/xxh3.h"

namespace megaplan::exec {

namespace {

// Format 3 checksums tensors with XXH3-64 over blocks; format 2 (read, no longer written) with
// FNV-1a 64 over the whole tensor. Both are read.
constexpr const char* kFormat = "megaplan-checkpoint/3";
constexpr const char* kFnvFormat = "megaplan-checkpoint/2";
// A tensor's checksum blocks: each block's XXH3-64 is computed apart (by any thread), the tensor's
// checksum is the XXH3-64 of their list. Large enough for a write or read of one block to run at
// the disk's speed, small enough that the largest tensor (the word embedding, gigabytes) spreads
// over every thread.
constexpr uint64_t kChecksumBlockBytes = uint64_t{4} << 20;
// The manifest's names of the two checksums (the key of each tensor's checksum).
constexpr const char* kXxh3Checksum = "xxh3_64";
constexpr const char* kFnvChecksum = "fnv1a64";
constexpr std::size_t kArraysPerTensor = 3;  // value, first moment, second moment
// More elements than any shard holds (16 TiB of fp32): a manifest's shape beyond it is damage, and
// products below it cannot overflow.
constexpr int64_t kMaxTensorElements = int64_t{1} << 42;
// latest_checkpointed_iteration.txt's iteration: a trillion iterations is beyond any run.
constexpr std::size_t kMaxIterationDigits = 12;

std::string iteration_directory(int64_t iteration) {
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07lld", static_cast<long long>(iteration));
  return name;
}

// Megatron's mp_rank_TT (pp = 1) or mp_rank_TT_PPP.
std::string rank_directory(int64_t tensor_parallel_rank, int64_t pipeline_rank, int64_t pipeline_parallel_size) {
  char name[64];
  if (pipeline_parallel_size == 1) {
    std::snprintf(name, sizeof name, "mp_rank_%02lld", static_cast<long long>(tensor_parallel_rank));
  } else {
    std::snprintf(name, sizeof name, "mp_rank_%02lld_%03lld", static_cast<long long>(tensor_parallel_rank),
                  static_cast<long long>(pipeline_rank));
  }
  return name;
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

// A checkpoint JSON file's own checksum (state.json's, a manifest's): FNV-1a 64 over the compact
// JSON of its other fields, so that any changed value or key — a flipped digit of
// consumed_samples, of a shard's index — is one clear error, not trained on. Absent in files saved
// before it.
std::string json_checksum(nlohmann::json object) {
  object.erase("fnv1a64");
  const std::string text = object.dump();
  Fnv1a64 hash;
  hash.add(text.data(), text.size());
  return hex(hash.value());
}

// Throws SpecError("--load") when `object` carries a checksum its contents do not match.
void verify_json_checksum(const nlohmann::json& object, const std::string& path) {
  if (!object.contains("fnv1a64") || object["fnv1a64"] == json_checksum(object)) return;
  throw SpecError("--load", path + ": its checksum does not match its contents (FNV-1a 64 " + json_checksum(object) +
                                " computed): the file is corrupted");
}

// One saved shard of a tensor, as its manifest describes it.
struct SavedShard {
  std::string name;
  std::string manifest;   // DIR/iter_.../mp_rank_.../manifest.json
  std::string data_file;  // DIR/iter_.../mp_rank_.../model.bin
  std::vector<int64_t> shape, global_shape;
  TensorCut cut;
  uint64_t offset = 0;  // bytes into data_file
  uint64_t checksum = 0;
  std::string algorithm;     // kXxh3Checksum or kFnvChecksum
  uint64_t block_bytes = 0;  // kXxh3Checksum's block size
  uint64_t bytes() const { return kArraysPerTensor * elements(shape) * sizeof(float); }
};

bool known_format(const nlohmann::json& format) { return format == kFormat || format == kFnvFormat; }

[[noreturn]] void refuse_load(const std::string& rule) { throw SpecError("--load", rule); }

// Reads a rank directory's manifest into `saved` (by tensor name, in directory order).
void read_manifest(const std::string& rank_path, std::map<std::string, std::vector<SavedShard>>& saved) {
  const std::string path = rank_path + "/manifest.json";
  if (!std::filesystem::exists(path)) refuse_load(path + ": missing (the checkpoint is incomplete)");
  const std::optional<nlohmann::json> manifest = try_parse_json(read_file_contents(path));
  if (!manifest || !manifest->is_object() || !known_format(manifest->value("format", "")) ||
      !manifest->contains("tensors") || !(*manifest)["tensors"].is_array()) {
    refuse_load(path + ": not a " + std::string(kFormat) + " manifest");
  }
  verify_json_checksum(*manifest, path);
  // Format 2 names no algorithm: FNV-1a 64 over each tensor.
  JsonFieldReader manifest_fields(*manifest, path);
  std::string algorithm = kFnvChecksum;
  uint64_t block_bytes = 0;
  if ((*manifest)["format"] == kFormat) {
    manifest_fields.require("tensor_checksum", algorithm);
    if (algorithm != kXxh3Checksum && algorithm != kFnvChecksum) {
      refuse_load(manifest_fields.field("tensor_checksum") + ": must be \"" + kXxh3Checksum + "\" or \"" +
                  kFnvChecksum + "\", got \"" + algorithm.substr(0, 40) + "\"");
    }
    if (algorithm == kXxh3Checksum) {
      manifest_fields.require("checksum_block_bytes", block_bytes);
      if (block_bytes == 0 || block_bytes > kMaxTensorElements) {
        refuse_load(manifest_fields.field("checksum_block_bytes") + ": must be a positive size up to " +
                    std::to_string(kMaxTensorElements) + " bytes, got " + std::to_string(block_bytes));
      }
    }
  }
  std::string data_file = "model.bin";
  if (const auto found = manifest->find("data_file"); found != manifest->end()) {
    if (!found->is_string() || found->get<std::string>().find('/') != std::string::npos) {
      refuse_load(path + ": data_file must name a file in its directory");
    }
    data_file = found->get<std::string>();
  }
  int64_t entry_index = 0;
  for (const nlohmann::json& entry : (*manifest)["tensors"]) {
    SavedShard shard;
    shard.manifest = path;
    shard.data_file = rank_path + "/" + data_file;
    // Each field checked for its type and range: a damaged manifest is one line naming the field.
    JsonFieldReader fields(entry, path + ": tensors[" + std::to_string(entry_index++) + "]");
    std::string name, dtype, checksum;
    fields.require("name", name);
    fields.require("dtype", dtype);
    if (dtype != "float32") refuse_load(path + ": " + name + " is " + dtype + ", not float32");
    fields.require("shape", shard.shape);
    fields.require("global_shape", shard.global_shape);
    for (const std::vector<int64_t>* shape : {&shard.shape, &shard.global_shape}) {
      int64_t product = 1;
      for (const int64_t extent : *shape) {
        if (extent <= 0 || __builtin_mul_overflow(product, extent, &product) || product > kMaxTensorElements) {
          refuse_load(path + ": " + name + " has the shape " + shape_text(*shape) + ", not a tensor's");
        }
      }
    }
    const nlohmann::json* shard_object = fields.read_object("shard");
    if (!shard_object) refuse_load(fields.field("shard") + ": required field is missing");
    JsonFieldReader cut_fields(*shard_object, fields.field("shard"));
    shard.cut.dim = -1;  // null: not split
    cut_fields.read("dim", shard.cut.dim);
    cut_fields.require("index", shard.cut.index);
    cut_fields.require("count", shard.cut.count);
    cut_fields.read("chunks", shard.cut.chunks);  // absent before SwiGLU: one block
    fields.require("offset", shard.offset);
    fields.require(algorithm, checksum);
    if (checksum.size() != 16 || checksum.find_first_not_of("0123456789abcdef") != std::string::npos) {
      refuse_load(fields.field(algorithm) + ": must be 16 hexadecimal digits, got \"" + checksum + "\"");
    }
    shard.checksum = std::stoull(checksum, nullptr, 16);
    shard.algorithm = algorithm;
    shard.block_bytes = block_bytes;
    const TensorCut& cut = shard.cut;
    if (!cut_fits(shard.global_shape, cut) || shard.shape != part_shape(shard.global_shape, cut)) {
      refuse_load(path + ": " + name + " has shape " + shape_text(shard.shape) + ", which is not part " +
                  std::to_string(cut.index) + " of " + std::to_string(cut.count) + " along dimension " +
                  std::to_string(cut.dim) + " of its global shape " + shape_text(shard.global_shape));
    }
    shard.name = name;
    saved[name].push_back(std::move(shard));
  }
}

// A tensor's bytes cut into checksum blocks (format 3's, or the reads' of format 2): `item` is the
// tensor's place in the caller's list, `index` the block's in the tensor.
struct Block {
  std::size_t item = 0, index = 0;
  uint64_t begin = 0, size = 0;  // bytes into the tensor
};

void append_blocks(std::size_t item, uint64_t bytes, uint64_t block_bytes, std::vector<Block>& blocks) {
  for (uint64_t begin = 0, index = 0; begin < bytes; begin += block_bytes, ++index) {
    blocks.push_back({item, static_cast<std::size_t>(index), begin, std::min(block_bytes, bytes - begin)});
  }
}

std::size_t block_count(uint64_t bytes, uint64_t block_bytes) {
  return static_cast<std::size_t>((bytes + block_bytes - 1) / block_bytes);
}

// Format 3's checksum of a tensor: XXH3-64 over its blocks' XXH3-64s (as little-endian words).
uint64_t combine_block_checksums(const std::vector<uint64_t>& blocks) {
  return xxh3_64(blocks.data(), blocks.size() * sizeof(uint64_t));
}

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

// A shard's bytes (value, first and second moment, as model.bin holds them), read, and how many
// tensors still take them (freed after the last).
struct ReadShard {
  std::vector<float> bytes;
  int64_t uses = 0;
};
using ShardBytes = std::map<const SavedShard*, ReadShard>;

[[noreturn]] void refuse_short_file(const SavedShard& shard, uint64_t file_size) {
  refuse_load(shard.data_file + ": ends before " + shard.name + " (" + std::to_string(shard.bytes()) +
              " bytes at offset " + std::to_string(shard.offset) + " of its " + std::to_string(file_size) + ")");
}

// Reads the `needed` shards (each once, however often named) into `read` on `threads` threads,
// block by block, each shard's checksum verified.
void read_shards(const std::vector<const SavedShard*>& needed, int64_t threads, ShardBytes& read) {
  std::vector<const SavedShard*> wanted;
  for (const SavedShard* shard : needed) {
    if (read[shard].uses++ == 0) wanted.push_back(shard);
  }
  std::map<std::string, std::unique_ptr<DataFile>> files;
  std::vector<const DataFile*> file_of(wanted.size());
  std::vector<Block> blocks;
  std::vector<std::vector<uint64_t>> block_checksums(wanted.size());
  std::vector<float*> destination(wanted.size());
  for (std::size_t k = 0; k < wanted.size(); ++k) {
    const SavedShard& shard = *wanted[k];
    std::unique_ptr<DataFile>& file = files[shard.data_file];
    if (!file) file = std::make_unique<DataFile>(shard.data_file);
    file_of[k] = file.get();
    // The file holds what the manifest says before that much memory is taken for it.
    if (shard.offset > file->size() || shard.bytes() > file->size() - shard.offset) {
      refuse_short_file(shard, file->size());
    }
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
    if (!file_of[block.item]->read_at(shard.offset + block.begin, data, block.size)) {
      refuse_short_file(shard, file_of[block.item]->size());
    }
    if (shard.algorithm == kXxh3Checksum) block_checksums[block.item][block.index] = xxh3_64(data, block.size);
  });
  run_tasks(wanted.size(), threads, [&](std::size_t k) {
    const SavedShard& shard = *wanted[k];
    const bool blocked = shard.algorithm == kXxh3Checksum;
    uint64_t checksum = 0;
    if (blocked) {
      checksum = combine_block_checksums(block_checksums[k]);
    } else {
      checksum = Fnv1a64().add(destination[k], shard.bytes()).value();
    }
    if (checksum != shard.checksum) {
      refuse_load(shard.data_file + ": checksum of " + shard.name + " does not match its manifest (" +
                  (blocked ? "XXH3-64 " : "FNV-1a 64 ") + hex(checksum) + " read, " + hex(shard.checksum) +
                  " saved): the file is corrupted");
    }
  });
}

// The saved shards that make up `name`: the parts of the first shard's cut (replicated tensors were
// saved by every tensor-parallel rank and any one copy serves).
std::vector<const SavedShard*> saved_parts(const std::string& name, const std::vector<SavedShard>& shards) {
  const TensorCut saved_cut = shards.front().cut;
  std::vector<const SavedShard*> parts(static_cast<std::size_t>(saved_cut.count), nullptr);
  for (const SavedShard& shard : shards) {
    if (shard.cut.count == saved_cut.count && shard.cut.dim == saved_cut.dim && shard.cut.chunks == saved_cut.chunks &&
        !parts[static_cast<std::size_t>(shard.cut.index)]) {
      parts[static_cast<std::size_t>(shard.cut.index)] = &shard;
    }
  }
  for (std::size_t p = 0; p < parts.size(); ++p) {
    if (!parts[p]) {
      refuse_load("the checkpoint holds no part " + std::to_string(p) + " of " + std::to_string(parts.size()) + " of " +
                  name + " (a rank directory is missing)");
    }
  }
  return parts;
}

// The three arrays (value, first and second moment) of `name`'s part `wanted`, from its saved
// parts' bytes in `read` (read_shards'), each freed by its last use.
std::vector<std::vector<float>> assemble_tensor(const std::string& name, const std::vector<SavedShard>& shards,
                                                const TensorCut& wanted, ShardBytes& read) {
  std::vector<std::vector<std::vector<float>>> arrays(kArraysPerTensor);  // [array][part]
  for (const SavedShard* shard : saved_parts(name, shards)) {
    const auto found = read.find(shard);
    if (found == read.end()) throw std::logic_error("checkpoint: " + name + "'s part was not read");
    const std::vector<float>& bytes = found->second.bytes;
    const std::size_t count = elements(shard->shape);
    for (std::size_t a = 0; a < kArraysPerTensor; ++a) {
      arrays[a].emplace_back(bytes.begin() + static_cast<std::ptrdiff_t>(a * count),
                             bytes.begin() + static_cast<std::ptrdiff_t>((a + 1) * count));
    }
    if (--found->second.uses == 0) read.erase(found);
  }
  std::vector<std::vector<float>> result;
  for (const auto& array_parts : arrays) {
    result.push_back(reshard(array_parts, shards.front().cut, shards.front().global_shape, wanted));
  }
  return result;
}

}  // namespace

// A named namespace, not an anonymous one: CheckpointSaver (of external linkage) keeps an image.
namespace checkpoint_image {

// What a rank directory's manifest says of a tensor besides its bytes.
struct TensorEntry {
  std::string name;
  std::vector<int64_t> shape, global_shape;
  TensorCut cut;
};

// A rank directory's model.bin as it lies on disk, in host memory (per tensor at its offset: value,
// first and second moment): what a save snapshots on the training thread and writes after.
struct RankImage {
  std::vector<TensorEntry> entries;
  std::vector<uint64_t> offsets;  // bytes into model.bin, per entry
  std::vector<float> bytes;
  int64_t tensor_parallel_rank = 0, pipeline_rank = 0;
  std::vector<int64_t> stages;

  // Lays out `laid_out` one tensor after the other, sizing `bytes` (its capacity kept for the next save).
  void lay_out(std::vector<TensorEntry> laid_out) {
    entries = std::move(laid_out);
    offsets.clear();
    uint64_t offset = 0;
    for (const TensorEntry& entry : entries) {
      offsets.push_back(offset);
      offset += tensor_bytes(entry);
    }
    bytes.resize(offset / sizeof(float));
  }
  static uint64_t tensor_bytes(const TensorEntry& entry) {
    return kArraysPerTensor * elements(entry.shape) * sizeof(float);
  }
  float* tensor(std::size_t i) { return bytes.data() + offsets[i] / sizeof(float); }
  const char* tensor_bytes_at(std::size_t i) const { return reinterpret_cast<const char*>(bytes.data()) + offsets[i]; }
};

}  // namespace checkpoint_image

namespace {

using checkpoint_image::RankImage;
using checkpoint_image::TensorEntry;

// Writes a rank directory from its image on `threads` threads, each taking a block at a time
// (checksummed, then written at its offset), then the manifest.
void write_rank_files(const std::string& path, const RankImage& image, int64_t threads) {
  std::error_code error;
  if (!std::filesystem::create_directory(path, error)) {
    throw SpecError("--save", path + ": cannot create: " + (error ? error.message() : std::string("exists")));
  }
  StagedFile data(path + "/model.bin");
  std::vector<Block> blocks;
  std::vector<std::vector<uint64_t>> block_checksums(image.entries.size());
  for (std::size_t i = 0; i < image.entries.size(); ++i) {
    const uint64_t bytes = RankImage::tensor_bytes(image.entries[i]);
    block_checksums[i].resize(block_count(bytes, kChecksumBlockBytes));
    append_blocks(i, bytes, kChecksumBlockBytes, blocks);
  }
  run_tasks(blocks.size(), threads, [&](std::size_t b) {
    const Block& block = blocks[b];
    const char* bytes = image.tensor_bytes_at(block.item) + block.begin;
    block_checksums[block.item][block.index] = xxh3_64(bytes, block.size);
    data.write_at(image.offsets[block.item] + block.begin, bytes, block.size);
  });
  data.commit();
  nlohmann::json tensors = nlohmann::json::array();
  for (std::size_t i = 0; i < image.entries.size(); ++i) {
    const TensorEntry& entry = image.entries[i];
    const TensorCut& cut = entry.cut;
    tensors.push_back({{"name", entry.name},
                       {"dtype", "float32"},
                       {"shape", entry.shape},
                       {"global_shape", entry.global_shape},
                       {"shard",
                        {{"dim", cut.dim < 0 ? nlohmann::json(nullptr) : nlohmann::json(cut.dim)},
                         {"index", cut.index},
                         {"count", cut.count},
                         {"chunks", cut.chunks}}},
                       {"offset", image.offsets[i]},
                       {kXxh3Checksum, hex(combine_block_checksums(block_checksums[i]))}});
  }
  nlohmann::json manifest = {
      {"format", kFormat},
      {"data_file", "model.bin"},
      {"layout",
       "per tensor at its offset: value, exp_avg, exp_avg_sq, each shape's elements of float32 (little endian)"},
      {"checksum",
       "xxh3_64: XXH3-64 over the XXH3-64s (little-endian words) of the tensor's bytes' blocks of "
       "checksum_block_bytes (the last one shorter)"},
      {"tensor_checksum", kXxh3Checksum},
      {"checksum_block_bytes", kChecksumBlockBytes},
      {"tensor_parallel_rank", image.tensor_parallel_rank},
      {"pipeline_rank", image.pipeline_rank},
      {"stages", image.stages},
      {"tensors", tensors}};
  manifest["fnv1a64"] = json_checksum(manifest);
  write_file_atomically(path + "/manifest.json", manifest.dump(1) + "\n");
  sync_directory(path);
}

TensorEntry entry_of(const ParameterSpec& spec) {
  const TensorCut cut = tensor_cut(spec);
  return {spec.name, spec.shape, spec.global_shape, cut};
}

// The rank's parameters, in chunk and registration order (the optimizer's).
std::vector<const Parameter*> rank_parameters(const CheckpointRank& rank) {
  std::vector<const Parameter*> parameters;
  for (const StageChunk* chunk : rank.chunks) {
    for (const Parameter& parameter : chunk->parameters()) parameters.push_back(&parameter);
  }
  return parameters;
}

// `image` laid out for the rank's parameters.
void lay_out_rank(const CheckpointRank& rank, const std::vector<const Parameter*>& parameters, RankImage& image) {
  std::vector<TensorEntry> entries;
  for (const Parameter* parameter : parameters) entries.push_back(entry_of(*parameter));
  image.lay_out(std::move(entries));
  image.stages.clear();
  for (const StageChunk* chunk : rank.chunks) image.stages.push_back(chunk->stage());
  image.tensor_parallel_rank = rank.groups.tensor_parallel_rank;
  image.pipeline_rank = rank.groups.pipeline_rank;
}

// The rank's tensors downloaded into its laid-out image: values from the parameters, moments
// from the optimizer (with the distributed optimizer, a collective over the data-parallel group).
void copy_rank(const CheckpointRank& rank, const std::vector<const Parameter*>& parameters, RankImage& image) {
  std::map<const Parameter*, std::size_t> index;
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    index[parameters[i]] = i;
    rank.backend.download(image.tensor(i), parameters[i]->value, parameters[i]->size);
  }
  rank.optimizer.export_state([&](const Parameter& parameter) -> Optimizer::MomentDestination {
    float* tensor = image.tensor(index.at(&parameter));
    return {tensor + parameter.size, tensor + 2 * parameter.size};
  });
}

// The tokenizer as state.json holds it: train's flag names with underscores, files as absolute
// paths (convert runs from anywhere), the flags not given left out.
nlohmann::json tokenizer_json(const TokenizerOptions& tokenizer) {
  nlohmann::json json = {{"kind", tokenizer.kind}};
  const std::pair<const char*, const std::string*> files[] = {{"vocab_file", &tokenizer.vocab_file},
                                                              {"merge_file", &tokenizer.merge_file},
                                                              {"tokenizer_file", &tokenizer.tokenizer_file},
                                                              {"tokenizer_model", &tokenizer.tokenizer_model}};
  for (const auto& [key, path] : files) {
    if (path->empty()) continue;
    std::error_code error;
    const std::filesystem::path absolute = std::filesystem::absolute(*path, error);
    json[key] = error ? *path : absolute.lexically_normal().string();
  }
  return json;
}

TokenizerOptions tokenizer_from_json(const nlohmann::json& json, const std::string& source) {
  JsonFieldReader fields(json, source);
  TokenizerOptions tokenizer;
  fields.require("kind", tokenizer.kind);
  fields.read("vocab_file", tokenizer.vocab_file);
  fields.read("merge_file", tokenizer.merge_file);
  fields.read("tokenizer_file", tokenizer.tokenizer_file);
  fields.read("tokenizer_model", tokenizer.tokenizer_model);
  fields.reject_unknown_keys();
  return tokenizer;  // whether its files still read is the reader's concern (convert says so)
}

// The word embedding and the output layer: their rows are the padded vocabulary, which changes
// with tp (checkpoint.h says how a load under another padding reads them).
bool vocabulary_tensor(const std::string& name) { return name == kWordEmbeddings || name == kOutputWeight; }

// Whether a vocabulary tensor saved with `saved` global shape holds the `vocabulary` rows of one of
// `wanted` shape under another padding: the same columns, and at least the real rows.
bool other_padding(const std::vector<int64_t>& saved, const std::vector<int64_t>& wanted, int64_t vocabulary) {
  return saved.size() == 2 && wanted.size() == 2 && saved[1] == wanted[1] && saved[0] >= vocabulary &&
         wanted[0] >= vocabulary;
}

// Row-major arrays of `columns` columns given `rows` rows: the first rows kept, zero rows added.
void set_rows(std::vector<std::vector<float>>& arrays, int64_t rows, int64_t columns) {
  for (std::vector<float>& array : arrays) array.resize(static_cast<std::size_t>(rows * columns), 0.0f);
}

// state.json of a checkpoint: the training state, the model and the saving plan, its rank directories.
nlohmann::json checkpoint_meta(const TrainingState& state, const ModelSpec& model, const ParallelPlan& plan) {
  nlohmann::json directories = nlohmann::json::array();
  for (int64_t p = 0; p < plan.pipeline_parallel_size; ++p) {
    for (int64_t t = 0; t < plan.tensor_parallel_size; ++t) {
      directories.push_back(rank_directory(t, p, plan.pipeline_parallel_size));
    }
  }
  nlohmann::json meta = {{"format", kFormat},
                         {"iteration", state.iteration},
                         {"consumed_samples", state.consumed_samples},
                         {"seed", state.seed},
                         {"model", model.name},
                         {"model_spec", model_spec_to_json(model)},
                         {"plan", parallel_plan_to_json(plan)},
                         {"directories", directories}};
  if (state.tokenizer) meta["tokenizer"] = tokenizer_json(*state.tokenizer);
  if (state.skipped_iterations > 0) {
    meta["skipped_iterations"] = state.skipped_iterations;
    meta["skipped_samples"] = state.skipped_samples;
  }
  if (state.loss_scaler) {
    meta["loss_scaler"] = {{"scale", state.loss_scaler->scale},
                           {"growth_tracker", state.loss_scaler->growth_tracker},
                           {"hysteresis_tracker", state.loss_scaler->hysteresis_tracker}};
  }
  meta["fnv1a64"] = json_checksum(meta);
  return meta;
}

// Moves a complete staging directory into place as `iteration` and makes it the newest.
void publish(const std::string& directory, const std::string& staging, int64_t iteration) {
  namespace fs = std::filesystem;
  std::error_code error;
  const std::string final_path = directory + "/" + iteration_directory(iteration);
  sync_directory(staging);
  if (fs::exists(final_path)) {
    // A save at an iteration saved before (a resumed run, or `latest` itself): the two directories
    // swap in one step, so the iteration `latest` names is complete at every instant; the old one,
    // now under the staging name, goes after.
    if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) != 0) {
      throw SpecError("--save", final_path + ": cannot swap the new save into place: " + std::strerror(errno));
    }
    sync_directory(directory);
    fs::remove_all(staging, error);
  } else {
    fs::rename(staging, final_path, error);
    if (error) throw SpecError("--save", final_path + ": cannot rename into place: " + error.message());
    sync_directory(directory);
  }
  write_file_atomically(directory + "/latest_checkpointed_iteration.txt", std::to_string(iteration) + "\n");
}

// What interrupted saves leave in DIR: iter_XXXXXXX.tmp directories and the temporaries of
// latest_checkpointed_iteration.txt (StagedFile's NAME.tmp.XXXXXX). Only one save writes to a
// directory at a time, so every one of them is stale when a save starts.
void remove_stale_temporaries(const std::string& directory) {
  namespace fs = std::filesystem;
  std::error_code error;
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename().string();
    const bool staging = name.rfind("iter_", 0) == 0 && name.size() > 4 && name.ends_with(".tmp");
    const bool latest = name.rfind("latest_checkpointed_iteration.txt.tmp.", 0) == 0;
    if (staging || latest) stale.push_back(entry.path());
  }
  for (const fs::path& path : stale) fs::remove_all(path, error);
}

// Creates DIR (and parents) and an empty staging directory for `iteration` in it.
std::string create_staging(const std::string& directory, int64_t iteration) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::create_directories(directory, error);
  if (error) throw SpecError("--save", directory + ": cannot create: " + error.message());
  remove_stale_temporaries(directory);
  const std::string staging = directory + "/" + iteration_directory(iteration) + ".tmp";
  if (!fs::create_directory(staging, error)) {
    throw SpecError("--save", staging + ": cannot create: " + (error ? error.message() : std::string("exists")));
  }
  return staging;
}

}  // namespace

// What a save in progress left to do once its files are written: the barrier and the rename.
struct CheckpointSaver::Writing {
  std::string directory, staging;
  int64_t iteration = 0;
  Times times;
  std::thread writer;          // the --async-save writer, while it runs
  std::exception_ptr failure;  // what stopped the writing (set by the writer, read once joined)
};

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Writes the image and notes how long it took in `writing`, or the failure.
void write_image(const std::string& path, const RankImage& image, int64_t threads, CheckpointSaver::Times& times,
                 std::exception_ptr& failure) {
  const auto start = std::chrono::steady_clock::now();
  try {
    write_rank_files(path, image, threads);
  } catch (...) {
    failure = std::current_exception();
  }
  times.write_seconds = seconds_since(start);
}

}  // namespace

// The image of this rank's directory and the host memory its backend page-locked for it (the
// image's bytes), both kept from one save to the next.
struct CheckpointSaver::Snapshot {
  RankImage image;
  const void* pinned = nullptr;  // image.bytes' memory, while the backend has it page-locked
};

CheckpointSaver::CheckpointSaver(bool async, Backend& backend)
    : async_(async), backend_(backend), snapshot_(std::make_unique<Snapshot>()) {}

CheckpointSaver::~CheckpointSaver() {
  // A save still being written is left unpublished: its staging directory is never read.
  if (writing_ && writing_->writer.joinable()) writing_->writer.join();
  try {
    if (snapshot_->pinned) backend_.unpin_host(const_cast<void*>(snapshot_->pinned));
  } catch (...) {
    // The memory is freed next whatever the device says; a failed unlock leaves nothing to undo.
  }
}

namespace {

// Removes the staging directory of a failed save (on the leader) and rethrows the failure under --save.
[[noreturn]] void fail_save(const std::string& staging, bool leader) {
  std::error_code error;
  if (leader) std::filesystem::remove_all(staging, error);
  try {
    throw;
  } catch (const SpecError& failure) {
    if (failure.field() == "--save") throw;
    throw SpecError("--save", failure.what());  // a staged file's failure names the file: keep it, under --save
  }
}

}  // namespace

void CheckpointSaver::save(const std::string& directory, const TrainingState& state, const CheckpointRank& rank) {
  (void)finish(rank);
  const ParallelGroups& groups = rank.groups;
  const bool leader = groups.global_rank == 0;         // prepares, renames, writes "latest"
  const bool writer = groups.data_parallel_rank == 0;  // writes its mp_rank directory
  auto writing = std::make_unique<Writing>();
  writing->directory = directory;
  writing->staging = directory + "/" + iteration_directory(state.iteration) + ".tmp";
  writing->iteration = state.iteration;
  const std::string path =
      writing->staging + "/" +
      rank_directory(groups.tensor_parallel_rank, groups.pipeline_rank, rank.plan.pipeline_parallel_size);
  const auto start = std::chrono::steady_clock::now();
  try {
    if (leader) (void)create_staging(directory, state.iteration);
    if (groups.world) groups.world->barrier();  // the staging directory exists
    if (writer) {
      const std::vector<const Parameter*> parameters = rank_parameters(rank);
      std::size_t floats = 0;
      for (const Parameter* parameter : parameters) floats += kArraysPerTensor * parameter->size;
      pin_snapshot(floats);  // before the copies, which then run at the bus's speed
      lay_out_rank(rank, parameters, snapshot_->image);
      copy_rank(rank, parameters, snapshot_->image);
    } else if (rank.plan.use_distributed_optimizer) {
      // Every data-parallel rank takes part in gathering the moments; the writers keep them.
      (void)rank.optimizer.export_state();
    }
    if (leader) {
      write_file_atomically(writing->staging + "/state.json",
                            checkpoint_meta(state, rank.model, rank.plan).dump(2) + "\n");
    }
  } catch (...) {
    fail_save(writing->staging, leader);
  }
  const int64_t threads = rank.threads;
  const RankImage& image = snapshot_->image;
  Writing& started = *writing;
  started.times.snapshot_seconds = last_snapshot_seconds_ = seconds_since(start);
  started.times.bytes = writer ? image.bytes.size() * sizeof(float) : 0;
  writing_ = std::move(writing);
  if (writer && async_) {
    try {
      started.writer = std::thread(
          [&started, &image, path, threads] { write_image(path, image, threads, started.times, started.failure); });
    } catch (...) {
      started.failure = std::current_exception();  // no thread: finish() fails the save
    }
  } else if (writer) {
    write_image(path, image, threads, started.times, started.failure);
  }
  if (!async_) (void)finish(rank);
}

std::optional<int64_t> CheckpointSaver::finish(const CheckpointRank& rank) {
  if (!writing_) return std::nullopt;
  if (writing_->writer.joinable()) writing_->writer.join();
  const std::unique_ptr<Writing> writing = std::move(writing_);
  const ParallelGroups& groups = rank.groups;
  const bool leader = groups.global_rank == 0;
  try {
    if (writing->failure) std::rethrow_exception(writing->failure);
    if (groups.world) groups.world->barrier();  // every writer's files are synced
    if (leader) publish(writing->directory, writing->staging, writing->iteration);
    if (groups.world) groups.world->barrier();  // the checkpoint is in place for every rank
  } catch (...) {
    fail_save(writing->staging, leader);
  }
  last_save_ = writing->times;
  return writing->iteration;
}

void CheckpointSaver::pin_snapshot(std::size_t floats) {
  std::vector<float>& bytes = snapshot_->image.bytes;
  if (snapshot_->pinned && floats <= bytes.capacity()) return;                       // locked, and laid out in place
  if (snapshot_->pinned) backend_.unpin_host(const_cast<void*>(snapshot_->pinned));  // before it is freed
  snapshot_->pinned = nullptr;
  bytes.reserve(floats);
  if (bytes.capacity() == 0) return;
  backend_.pin_host(bytes.data(), bytes.capacity() * sizeof(float));
  snapshot_->pinned = bytes.data();
}

void save_checkpoint(const std::string& directory, const TrainingState& state, const CheckpointRank& rank) {
  CheckpointSaver(false, rank.backend).save(directory, state, rank);
}

namespace {

// The newest checkpoint under a directory: its state.json, training state and every saved shard.
struct Newest {
  std::string path;  // DIR/iter_...
  nlohmann::json meta;
  TrainingState state;
  std::map<std::string, std::vector<SavedShard>> saved;  // by tensor name
};

// The iteration latest_checkpointed_iteration.txt names: decimal digits and a newline, as saved.
int64_t read_latest(const std::string& latest) {
  std::string text = read_file_contents(latest);
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (text.empty() || text.size() > kMaxIterationDigits || text.find_first_not_of("0123456789") != std::string::npos) {
    refuse_load(latest + " must hold an iteration number (up to " + std::to_string(kMaxIterationDigits) +
                " digits), and holds " +
                nlohmann::json(text.substr(0, 20)).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace));
  }
  return std::stoll(text);
}

// The newest complete iteration directory in `directory` (iter_ and digits; a .tmp staging
// directory is not one), or nullopt: a save renames its directory into place only once every
// file in it is synced, so each such directory is whole even when `latest` was never written.
std::optional<int64_t> newest_iteration_directory(const std::string& directory) {
  std::optional<int64_t> newest;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename().string();
    const std::string digits = name.size() > 5 ? name.substr(5) : "";
    if (name.rfind("iter_", 0) != 0 || digits.empty() || digits.size() > kMaxIterationDigits ||
        digits.find_first_not_of("0123456789") != std::string::npos || !entry.is_directory(error)) {
      continue;
    }
    newest = std::max<int64_t>(newest.value_or(0), std::stoll(digits));
  }
  return newest;
}

std::optional<Newest> find_newest(const std::string& directory) {
  const std::string latest = directory + "/latest_checkpointed_iteration.txt";
  int64_t iteration = 0;
  if (std::filesystem::exists(latest)) {
    iteration = read_latest(latest);
  } else if (const std::optional<int64_t> found = newest_iteration_directory(directory)) {
    iteration = *found;  // a save killed between its rename and `latest`
  } else {
    return std::nullopt;
  }
  Newest newest;
  newest.path = directory + "/" + iteration_directory(iteration);
  const std::string& path = newest.path;
  if (!std::filesystem::is_directory(path)) {
    refuse_load(latest + " names iteration " + std::to_string(iteration) + " but " + path + " does not exist");
  }
  const std::string state_path = path + "/state.json";
  newest.meta = try_parse_json(read_file_contents(state_path)).value_or(nlohmann::json());
  const nlohmann::json& meta = newest.meta;
  if (!meta.is_object() || !known_format(meta.value("format", "")) || !meta.contains("directories") ||
      !meta["directories"].is_array()) {
    const bool named = meta.is_object() && meta.contains("format");
    refuse_load(
        state_path + " is not a " + std::string(kFormat) + " checkpoint" +
        (named ? " (its format is " +
                     meta["format"].dump(-1, ' ', true, nlohmann::json::error_handler_t::replace).substr(0, 40) + ")"
               : ""));
  }
  verify_json_checksum(meta, state_path);
  TrainingState& state = newest.state;
  JsonFieldReader fields(meta, state_path);
  fields.require("iteration", state.iteration);
  fields.require("consumed_samples", state.consumed_samples);
  fields.require("seed", state.seed);
  if (state.consumed_samples < 0) {
    refuse_load(fields.field("consumed_samples") + ": must be non-negative, got " +
                std::to_string(state.consumed_samples));
  }
  if (const nlohmann::json* tokenizer = fields.read_object("tokenizer")) {
    state.tokenizer = tokenizer_from_json(*tokenizer, fields.field("tokenizer"));
  }
  fields.read("skipped_iterations", state.skipped_iterations);
  fields.read("skipped_samples", state.skipped_samples);
  if (state.skipped_iterations < 0 || state.skipped_iterations > state.iteration || state.skipped_samples < 0 ||
      state.skipped_samples > state.consumed_samples) {
    refuse_load(fields.field("skipped_iterations") + ": must lie between 0 and the iterations (and samples) done");
  }
  if (const nlohmann::json* scaler = fields.read_object("loss_scaler")) {
    JsonFieldReader scaler_fields(*scaler, fields.field("loss_scaler"));
    LossScalerState loaded;
    scaler_fields.require("scale", loaded.scale);
    scaler_fields.require("growth_tracker", loaded.growth_tracker);
    scaler_fields.require("hysteresis_tracker", loaded.hysteresis_tracker);
    scaler_fields.reject_unknown_keys();  // as the tokenizer's object beside it
    if (!(loaded.scale > 0) || !std::isfinite(loaded.scale) || loaded.growth_tracker < 0) {
      refuse_load(scaler_fields.field("scale") + ": must be a finite positive scale with a non-negative tracker");
    }
    state.loss_scaler = loaded;
  }
  if (state.iteration != iteration) {
    refuse_load(path + "/state.json says iteration " + std::to_string(state.iteration) + " but " + latest + " says " +
                std::to_string(iteration));
  }
  for (const nlohmann::json& name : meta["directories"]) {
    if (!name.is_string()) refuse_load(path + "/state.json: \"directories\" holds a non-string");
    read_manifest(path + "/" + name.get<std::string>(), newest.saved);
  }
  return newest;
}

std::optional<TrainingState> load_latest(const std::string& directory, const CheckpointRank& rank) {
  std::optional<Newest> newest = find_newest(directory);
  if (!newest) return std::nullopt;
  const std::string& path = newest->path;
  const TrainingState state = newest->state;
  // Every tensor of every saved rank directory, and the tensors the model has over all its stages.
  const std::map<std::string, std::vector<SavedShard>>& saved = newest->saved;
  const bool untied = rank.model.untie_embeddings_and_output_weights;
  const int64_t vocabulary = rank.model.vocab_size;
  // The real rows must be the model's: another vocabulary's rows are other tokens, or padding.
  if (const auto spec = newest->meta.find("model_spec"); spec != newest->meta.end() && spec->is_object()) {
    if (const auto saved_vocabulary = spec->find("vocab_size");
        saved_vocabulary != spec->end() && saved_vocabulary->is_number_integer() && *saved_vocabulary != vocabulary) {
      refuse_load(path + "/state.json: the checkpoint's vocabulary is " + saved_vocabulary->dump() +
                  " tokens, the model's " + std::to_string(vocabulary) +
                  " (a checkpoint of another vocabulary: --vocab-size " + saved_vocabulary->dump() + " trains on it)");
    }
  }
  std::map<std::string, std::vector<int64_t>> expected;  // name -> global shape
  for (int64_t stage = 0; stage < rank.plan.num_virtual_stages(); ++stage) {
    for (const ParameterSpec& spec : describe_parameters(rank.model, rank.plan, stage)) {
      // The tied output layer's copy is the word embedding's: not a tensor of its own.
      if (spec.name != kOutputWeight || untied) expected[spec.name] = spec.global_shape;
    }
  }
  for (const auto& [name, shards] : saved) {
    // The tied output layer's copy has the word embedding's shape; a layout without one ignores it.
    const auto found = expected.find(name == kOutputWeight && !untied ? kWordEmbeddings : name);
    if (found == expected.end()) {
      refuse_load(shards.front().manifest + ": the checkpoint holds " + name + ", which " + rank.model.name +
                  " does not have (a checkpoint of another model)");
    }
    const std::vector<int64_t>& saved_shape = shards.front().global_shape;
    if (saved_shape != found->second &&
        !(vocabulary_tensor(name) && other_padding(saved_shape, found->second, vocabulary))) {
      refuse_load(shards.front().manifest + ": " + name + " has global shape " + shape_text(saved_shape) +
                  " in the checkpoint but " + shape_text(found->second) + " in the model");
    }
    for (const SavedShard& shard : shards) {
      if (shard.global_shape != shards.front().global_shape) {
        refuse_load(shard.manifest + ": " + name + " has global shape " + shape_text(shard.global_shape) +
                    " here but " + shape_text(shards.front().global_shape) + " in " + shards.front().manifest);
      }
    }
  }
  for (const auto& [name, shape] : expected) {
    if (!saved.count(name)) {
      refuse_load(path + " holds no " + name + ", which the model needs (a checkpoint of another model)");
    }
  }

  // This rank's tensors: every saved part they take read at once (on several threads), then values
  // straight into the chunks, moments through the optimizer.
  const auto source_of = [&](const Parameter& parameter) -> std::string {
    return parameter.name == kOutputWeight && !untied && !saved.count(parameter.name) ? kWordEmbeddings
                                                                                      : parameter.name;
  };
  std::vector<const SavedShard*> needed;
  for (StageChunk* chunk : rank.chunks) {
    for (const Parameter& parameter : chunk->parameters()) {
      const std::string source = source_of(parameter);
      for (const SavedShard* part : saved_parts(source, saved.at(source))) needed.push_back(part);
    }
  }
  ShardBytes read;
  read_shards(needed, rank.threads, read);
  std::vector<TensorState> moments;
  for (StageChunk* chunk : rank.chunks) {
    for (const Parameter& parameter : chunk->parameters()) {
      const std::string source = source_of(parameter);
      const std::vector<SavedShard>& shards = saved.at(source);
      const std::vector<int64_t>& saved_shape = shards.front().global_shape;
      std::vector<std::vector<float>> arrays;
      if (saved_shape == parameter.global_shape) {
        arrays = assemble_tensor(source, shards, tensor_cut(parameter), read);
      } else {
        // The vocabulary under another padding: the whole tensor with this layout's rows, then this
        // rank's part of it.
        arrays = assemble_tensor(source, shards, TensorCut{}, read);
        set_rows(arrays, parameter.global_shape[0], parameter.global_shape[1]);
        for (std::vector<float>& array : arrays) {
          array = reshard({array}, TensorCut{}, parameter.global_shape, tensor_cut(parameter));
        }
      }
      if (arrays[0].size() != parameter.size) {
        throw std::logic_error("checkpoint: " + parameter.name + "'s part holds " + std::to_string(arrays[0].size()) +
                               " elements, the parameter " + std::to_string(parameter.size));
      }
      rank.backend.upload(parameter.value, arrays[0].data(), parameter.size);
      moments.push_back({&parameter, std::move(arrays[1]), std::move(arrays[2])});
    }
  }
  rank.optimizer.import_state(moments);
  for (StageChunk* chunk : rank.chunks) chunk->refresh_compute_weights();

  return state;
}

}  // namespace

bool same_directory(const std::string& a, const std::string& b) {
  std::error_code error;
  const std::filesystem::path first = std::filesystem::weakly_canonical(a, error);
  if (error) return false;
  const std::filesystem::path second = std::filesystem::weakly_canonical(b, error);
  return !error && first == second;
}

void check_checkpoint_directories(const std::optional<std::string>& load, const std::optional<std::string>& save,
                                  int64_t checkpoint_bytes) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (load) {
    const fs::file_status status = fs::status(*load, error);
    if (fs::exists(status) && !fs::is_directory(status)) {
      throw SpecError("--load", *load + " is not a directory");
    }
    if (!fs::exists(status) && !(save && same_directory(*load, *save))) {
      throw SpecError("--load", *load +
                                    " does not exist; to start from scratch and resume from it later, give the "
                                    "same directory to --save (Megatron's resume-or-start idiom)");
    }
  }
  if (!save) return;
  // The directory, or the nearest ancestor a save would create it in.
  fs::path existing = fs::absolute(*save, error);
  while (!fs::exists(existing, error) && existing.has_parent_path() && existing != existing.parent_path()) {
    existing = existing.parent_path();
  }
  if (!fs::is_directory(existing, error)) {
    throw SpecError("--save", existing.string() +
                                  (existing == fs::absolute(*save, error) ? "" : ", on the way to " + *save) +
                                  ", is not a directory");
  }
  if (::access(existing.c_str(), W_OK | X_OK) != 0) {
    throw SpecError("--save", existing.string() + ": cannot write there: " + std::strerror(errno));
  }
  const fs::space_info space = fs::space(existing, error);
  if (!error && space.available < static_cast<std::uintmax_t>(checkpoint_bytes)) {
    throw SpecError("--save", existing.string() + " has " + format_gib(static_cast<double>(space.available)) +
                                  " free, but a checkpoint of this model takes " +
                                  format_gib(static_cast<double>(checkpoint_bytes)));
  }
}

std::optional<TrainingState> load_checkpoint(const std::string& directory, const CheckpointRank& rank) {
  try {
    return load_latest(directory, rank);
  } catch (const SpecError& failure) {
    if (failure.field() == "--load") throw;
    throw SpecError("--load", failure.what());  // an unreadable file names itself: keep it, under --load
  }
}

CheckpointWeights read_checkpoint_weights(const std::string& directory) {
  try {
    std::optional<Newest> newest = find_newest(directory);
    if (!newest) refuse_load(directory + " holds no checkpoint (no latest_checkpointed_iteration.txt)");
    CheckpointWeights weights;
    if (!newest->meta.contains("model_spec")) {
      refuse_load(newest->path + "/state.json names no model_spec (a checkpoint saved before megaplan recorded it)");
    }
    weights.model = model_spec_from_json(newest->meta["model_spec"], newest->path + "/state.json: model_spec");
    validate_model_spec(weights.model);
    weights.tokenizer = newest->state.tokenizer;
    // A tied output layer's copy is the word embedding: left out.
    const auto kept = [&](const std::string& name) {
      return name != kOutputWeight || weights.model.untie_embeddings_and_output_weights;
    };
    std::vector<const SavedShard*> needed;
    for (const auto& [name, shards] : newest->saved) {
      if (!kept(name)) continue;
      for (const SavedShard* part : saved_parts(name, shards)) needed.push_back(part);
    }
    ShardBytes read;
    read_shards(needed, default_checkpoint_threads(), read);
    for (const auto& [name, shards] : newest->saved) {
      if (!kept(name)) continue;
      std::vector<std::vector<float>> arrays = assemble_tensor(name, shards, TensorCut{}, read);
      std::vector<int64_t> shape = shards.front().global_shape;
      if (vocabulary_tensor(name)) {
        // The true vocabulary's rows; the rest were the saving layout's padding.
        if (shape.size() != 2 || shape[0] < weights.model.vocab_size) {
          refuse_load(shards.front().manifest + ": " + name + " has global shape " + shape_text(shape) +
                      ", fewer rows than " + "the vocabulary of " + std::to_string(weights.model.vocab_size) +
                      " state.json records");
        }
        shape[0] = weights.model.vocab_size;
        set_rows(arrays, shape[0], shape[1]);
      }
      weights.tensors[name] = {shape, std::move(arrays[0])};
    }
    return weights;
  } catch (const SpecError& failure) {
    if (failure.field() == "--load") throw;
    throw SpecError("--load", failure.what());
  }
}

void write_checkpoint_weights(const std::string& directory, const ModelSpec& model, const ParallelPlan& plan,
                              const std::map<std::string, WholeTensor>& tensors, uint64_t seed) {
  TrainingState state;  // weights from elsewhere: iteration 0, no tokenizer known
  state.seed = seed;
  const std::string staging = create_staging(directory, state.iteration);
  try {
    for (int64_t p = 0; p < plan.pipeline_parallel_size; ++p) {
      for (int64_t t = 0; t < plan.tensor_parallel_size; ++t) {
        std::vector<ParameterSpec> specs;
        const std::vector<int64_t> stages = stages_of_pipeline_rank(p, plan);
        for (const int64_t stage : stages) {
          for (ParameterSpec& spec : describe_parameters(model, plan, stage, t)) specs.push_back(std::move(spec));
        }
        RankImage image;
        std::vector<TensorEntry> entries;
        for (const ParameterSpec& spec : specs) entries.push_back(entry_of(spec));
        image.lay_out(std::move(entries));
        image.tensor_parallel_rank = t;
        image.pipeline_rank = p;
        image.stages = stages;
        for (std::size_t i = 0; i < specs.size(); ++i) {
          const ParameterSpec& spec = specs[i];
          // A tied output layer's copy starts as the word embedding, as training makes it.
          const bool copy = spec.name == kOutputWeight && !model.untie_embeddings_and_output_weights;
          const auto found = tensors.find(copy ? std::string(kWordEmbeddings) : spec.name);
          if (found == tensors.end()) throw std::logic_error("write_checkpoint_weights: no tensor " + spec.name);
          const WholeTensor& whole = found->second;
          // The vocabulary's rows padded to the layout's (Megatron's padding), with zeros.
          const bool vocabulary = copy || spec.name == kWordEmbeddings || spec.name == kOutputWeight;
          const bool padded = vocabulary && whole.shape.size() == 2 && whole.shape[0] < spec.global_shape[0] &&
                              whole.shape[1] == spec.global_shape[1];
          if (!padded && whole.shape != spec.global_shape) {
            throw SpecError("--save", spec.name + " has shape " + shape_text(whole.shape) + ", the model " +
                                          shape_text(spec.global_shape));
          }
          std::vector<std::vector<float>> parts(1, whole.values);
          if (padded) parts[0].resize(elements(spec.global_shape), 0.0f);
          const std::vector<float> value = reshard(parts, TensorCut{}, spec.global_shape, tensor_cut(spec));
          float* tensor = image.tensor(i);
          std::copy(value.begin(), value.end(), tensor);
          std::fill(tensor + value.size(), tensor + kArraysPerTensor * value.size(), 0.0f);  // a fresh optimizer's
        }
        write_rank_files(staging + "/" + rank_directory(t, p, plan.pipeline_parallel_size), image,
                         default_checkpoint_threads());
      }
    }
    write_file_atomically(staging + "/state.json", checkpoint_meta(state, model, plan).dump(2) + "\n");
    publish(directory, staging, state.iteration);
  } catch (...) {
    std::error_code error;
    std::filesystem::remove_all(staging, error);
    throw;
  }
}

}  // namespace megaplan::exec
