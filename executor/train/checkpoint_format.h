// The on-disk format of checkpoints (checkpoint.h describes it): the names of files and
// directories, the limits a reader trusts, and the tensors' checksums, which saves and loads share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace megaplan::exec::checkpoint_format {

// Format 4 binds each rank directory's manifest to its iteration, name and saving plan
// (RankBinding); format 3, read without that check, checksums tensors as format 4 does, with
// XXH3-64 over blocks; format 2 with FNV-1a 64 over the whole tensor. All three are read.
inline constexpr const char* kFormat = "megaplan-checkpoint/4";
inline constexpr const char* kUnboundFormat = "megaplan-checkpoint/3";
inline constexpr const char* kFnvFormat = "megaplan-checkpoint/2";
// A tensor's checksum blocks: each block's XXH3-64 is computed apart (by any thread), the tensor's
// checksum is the XXH3-64 of their list. Large enough for a write or read of one block to run at
// the disk's speed, small enough that the largest tensor (the word embedding, gigabytes) spreads
// over every thread.
inline constexpr uint64_t kChecksumBlockBytes = uint64_t{4} << 20;
// The manifest's names of the two checksums (the key of each tensor's checksum).
inline constexpr const char* kXxh3Checksum = "xxh3_64";
inline constexpr const char* kFnvChecksum = "fnv1a64";
inline constexpr std::size_t kArraysPerTensor = 3;  // value, first moment, second moment
// More elements than any shard holds (16 TiB of fp32): a manifest's shape beyond it is damage, and
// products below it cannot overflow.
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 42;
// latest_checkpointed_iteration.txt's iteration: a trillion iterations is beyond any run.
inline constexpr std::size_t kMaxIterationDigits = 12;
// state.json and a manifest: a manifest of a hundred thousand tensors takes some 40 MB. A file
// beyond it is not one of these (a link to /dev/zero or to a huge file), and is not read whole.
inline constexpr std::size_t kMaxJsonFileBytes = std::size_t{256} << 20;

// The blocks a streaming save's or load's window holds per thread: enough that the threads' ends
// of a window even out and the copies to or from the device between windows stay a small part of
// the time, few enough that the window stays a small part of host memory (32 MiB per thread).
inline constexpr std::size_t kWindowBlocksPerThread = 8;
// The slots of such a window for `blocks` blocks in all (no more than they need; at least one).
std::size_t window_slots(std::size_t blocks, int64_t threads);

std::string iteration_directory(int64_t iteration);  // iter_0000040
// Megatron's mp_rank_TT (pp = 1) or mp_rank_TT_PPP, and _EEE after it under expert parallelism.
std::string rank_directory(int64_t tensor_parallel_rank, int64_t pipeline_rank, int64_t pipeline_parallel_size,
                           int64_t expert_parallel_rank = 0, int64_t expert_parallel_size = 1);
void sync_directory(const std::string& path);
std::string hex(uint64_t value);  // 16 lower-case hexadecimal digits

bool known_format(const nlohmann::json& format);
// A checkpoint JSON file's own checksum (state.json's, a manifest's): FNV-1a 64 over the compact
// JSON of its other fields, so that any changed value or key — a flipped digit of
// consumed_samples, of a shard's index — is one clear error, not trained on. Absent in files saved
// before it.
std::string json_checksum(nlohmann::json object);
// Throws SpecError("--load") when `object` carries a checksum its contents do not match.
void verify_json_checksum(const nlohmann::json& object, const std::string& path);
[[noreturn]] void refuse_load(const std::string& rule);  // SpecError("--load", rule)
// Whether `path` exists; refuse_load naming the path and the reason where it cannot be told (a
// loop of links, a directory that cannot be searched).
bool checkpoint_path_exists(const std::string& path);
// What a checkpoint's JSON file holds, read whole up to kMaxJsonFileBytes (refuse_load past it).
std::string read_checkpoint_json_text(const std::string& path);

// A tensor's bytes cut into checksum blocks (format 3's, or the reads' of format 2): `item` is the
// tensor's place in the caller's list, `index` the block's in the tensor.
struct Block {
  std::size_t item = 0, index = 0;
  uint64_t begin = 0, size = 0;  // bytes into the tensor
};
void append_blocks(std::size_t item, uint64_t bytes, uint64_t block_bytes, std::vector<Block>& blocks);
std::size_t block_count(uint64_t bytes, uint64_t block_bytes);
// Format 3's checksum of a tensor: XXH3-64 over its blocks' XXH3-64s (as little-endian words).
uint64_t combine_block_checksums(const std::vector<uint64_t>& blocks);

}  // namespace megaplan::exec::checkpoint_format
