// A rank directory's manifest.json: how its model.bin is laid out (each tensor's name, shapes,
// shard, offset and checksum), written by saves and read, every field checked, by loads.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/parameter_list.h"
#include "executor/model/tensor_shards.h"

namespace megaplan::exec::checkpoint_format {

// What a manifest says of a tensor besides its offset and checksum.
struct TensorEntry {
  std::string name;
  std::vector<int64_t> shape, global_shape;
  TensorCut cut;
  uint64_t bytes() const;  // in model.bin: value, first and second moment
};
TensorEntry entry_of(const ParameterSpec& spec);

// A rank directory's model.bin: its tensors one after the other, and the rank that saved them.
struct RankLayout {
  std::vector<TensorEntry> entries;
  std::vector<uint64_t> offsets;  // bytes into model.bin, per entry
  uint64_t total_bytes = 0;
  int64_t tensor_parallel_rank = 0, pipeline_rank = 0;
  std::vector<int64_t> stages;

  void lay_out(std::vector<TensorEntry> laid_out);  // sets entries, offsets and total_bytes
};

// The manifest of `layout`, each tensor's XXH3-64 from its blocks' (`block_checksums[i]`).
nlohmann::json rank_manifest(const RankLayout& layout, const std::vector<std::vector<uint64_t>>& block_checksums);

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
  uint64_t bytes() const;
};

// Reads a rank directory's manifest into `saved` (by tensor name, in directory order). Throws
// SpecError("--load", ...) naming the file and the field for a missing or damaged manifest.
void read_manifest(const std::string& rank_path, std::map<std::string, std::vector<SavedShard>>& saved);

}  // namespace megaplan::exec::checkpoint_format
