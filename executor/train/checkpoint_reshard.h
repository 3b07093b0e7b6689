// A checkpoint's tensors under another layout than the one that saved them (checkpoint.h): the
// saved parts joined and this rank's part cut out, and the vocabulary's rows under another padding.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "executor/model/tensor_shards.h"
#include "executor/train/checkpoint_manifest.h"
#include "executor/train/checkpoint_shard_reader.h"

namespace megaplan::exec::checkpoint_format {

// The saved shards that make up `name`: the parts of the first shard's cut (replicated tensors were
// saved by every tensor-parallel rank and any one copy serves). Throws SpecError("--load", ...)
// when a part is missing.
std::vector<const SavedShard*> saved_parts(const std::string& name, const std::vector<SavedShard>& shards);

// The three arrays (value, first and second moment) of `name`'s part `wanted`, from its saved
// parts' bytes in `read` (read_shards'), each freed by its last use.
std::vector<std::vector<float>> assemble_tensor(const std::string& name, const std::vector<SavedShard>& shards,
                                                const TensorCut& wanted, ShardBytes& read);

// The word embedding and the output layer: their rows are the padded vocabulary, which changes
// with tp (checkpoint.h says how a load under another padding reads them).
bool vocabulary_tensor(const std::string& name);
// Whether a vocabulary tensor saved with `saved` global shape holds the `vocabulary` rows of one of
// `wanted` shape under another padding: the same columns, and at least the real rows.
bool other_padding(const std::vector<int64_t>& saved, const std::vector<int64_t>& wanted, int64_t vocabulary);
// Row-major arrays of `columns` columns given `rows` rows: the first rows kept, zero rows added.
void set_rows(std::vector<std::vector<float>>& arrays, int64_t rows, int64_t columns);

}  // namespace megaplan::exec::checkpoint_format
