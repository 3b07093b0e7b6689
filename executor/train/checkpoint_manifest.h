// A rank directory's manifest.json: how its model.bin is laid out (each tensor's name, shapes,
// shard, offset and checksum), written by saves and read, every field checked, by loads.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/parameter_list.h"
#include "executor/model/tensor_shards.h"
#include "executor/train/checkpoint_format.h"

namespace megaplan::exec::checkpoint_format {

// What a manifest says of a tensor besides its offset and checksum.
struct TensorEntry {
  std::string name;
  std::vector<int64_t> shape, global_shape;
  TensorCut cut;
  uint64_t bytes() const;  // in model.bin: value, first and second moment
};
TensorEntry entry_of(const ParameterSpec& spec);

// The parts of a tensor's bytes [begin, begin + size) (model.bin's: its value, first and second
// moment, `elements` floats each) that lie in each array: visit(array, first element, elements,
// their bytes' offset into the range). Blocks and arrays start at whole floats.
template <typename Visit>
void for_each_array_part(uint64_t elements, uint64_t begin, uint64_t size, Visit&& visit) {
  const uint64_t array_bytes = elements * sizeof(float);
  for (std::size_t array = 0; array < kArraysPerTensor; ++array) {
    const uint64_t lo = std::max(begin, array * array_bytes), hi = std::min(begin + size, (array + 1) * array_bytes);
    if (lo < hi) visit(array, (lo - array * array_bytes) / sizeof(float), (hi - lo) / sizeof(float), lo - begin);
  }
}

// What binds a rank directory to its checkpoint (format 4): the iteration, the directory's own
// name and the saving plan, written into its manifest (under the manifest's checksum) and checked
// against state.json on load, so that a directory or manifest copied from another iteration, rank
// or layout is refused, not trained on.
struct RankBinding {
  int64_t iteration = 0;
  std::string directory;  // mp_rank_...
  nlohmann::json plan;    // parallel_plan_to_json of the saving plan, as state.json's "plan"
};

// A rank directory's model.bin: its tensors one after the other, and the rank that saved them.
struct RankLayout {
  RankBinding binding;
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
  std::string algorithm;             // kXxh3Checksum or kFnvChecksum
  uint64_t block_bytes = 0;          // kXxh3Checksum's block size
  int64_t tensor_parallel_rank = 0;  // of the rank that saved it (its manifest's)
  uint64_t bytes() const;
};

// Reads the manifest of the rank directory `directory` in `iteration_path` (DIR/iter_...) into
// `saved` (by tensor name, in directory order). Throws SpecError("--load", ...) naming the file and
// the field for a missing or damaged manifest, a model.bin of another size than its tensors', or
// (format 4) a binding other than `expected`.
void read_manifest(const std::string& iteration_path, const RankBinding& expected,
                   std::map<std::string, std::vector<SavedShard>>& saved);

}  // namespace megaplan::exec::checkpoint_format
