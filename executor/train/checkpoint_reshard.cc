#include "executor/train/checkpoint_reshard.h"

#include <stdexcept>

#include "core/parameter_list.h"
#include "executor/train/checkpoint_format.h"

namespace megaplan::exec::checkpoint_format {

std::vector<const SavedShard*> saved_parts(const std::string& name, const std::vector<SavedShard>& shards) {
  const TensorCut saved_cut = shards.front().cut;
  std::vector<const SavedShard*> parts(static_cast<std::size_t>(saved_cut.count), nullptr);
  for (const SavedShard& shard : shards) {
    if (same_partition(shard.cut, saved_cut) && !parts[static_cast<std::size_t>(shard.cut.index)]) {
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

bool vocabulary_tensor(const std::string& name) { return name == kWordEmbeddings || name == kOutputWeight; }

bool other_padding(const std::vector<int64_t>& saved, const std::vector<int64_t>& wanted, int64_t vocabulary) {
  return saved.size() == 2 && wanted.size() == 2 && saved[1] == wanted[1] && saved[0] >= vocabulary &&
         wanted[0] >= vocabulary;
}

void set_rows(std::vector<std::vector<float>>& arrays, int64_t rows, int64_t columns) {
  for (std::vector<float>& array : arrays) array.resize(static_cast<std::size_t>(rows * columns), 0.0f);
}

}  // namespace megaplan::exec::checkpoint_format
