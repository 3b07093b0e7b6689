// The three indexes of a split's GPT samples, as Megatron-LM's GPTDataset builds them, and where
// each sample lies in them. The split's D sequences, T tokens, are read epoch after epoch, each
// epoch in its own seeded order (a shuffle of the D sequences), as one stream of tokens; sample k
// is the seq_length + 1 tokens from token k x seq_length of that stream, so samples overlap by one
// token and run across sequence and epoch boundaries; E epochs are enough for N samples.
//   - document index: E x D entries, epoch e's order at [e D, (e + 1) D), each a sequence of the
//     split counted from its first (a slot);
//   - sample index: N (slot, offset) pairs. Sample k starts in the epoch that holds its token
//     before (k x seq_length - 1; epoch 0 for k = 0), at position e D + slot of the document index,
//     `offset` tokens into that sequence. The epoch is k's arithmetic, so the pair needs no more
//     bits than the split's sequences and lengths, however many epochs there are;
//   - shuffle index: a permutation of the N samples, the order they are read in.
// One generator (executor/data/seeded_shuffle.h, seeded with --seed) shuffles epoch 0's order,
// epoch 1's, ..., then the samples. Each epoch's order depends only on the generator's state at its
// start: a first pass advances the generator through the epochs, noting its state every chunk of
// epochs, and threads build the chunks while the pass goes on to shuffle the samples, the longest
// step. Entries are stored in the narrowest width that holds them (index_width).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "executor/data/indexed_dataset.h"

namespace megaplan::exec {

// Documents [begin, end) of one split.
struct DocumentRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// How a split's samples lie in its epochs.
struct EpochLayout {
  int64_t first_sequence = 0;    // the split's sequences are [first_sequence, first_sequence + sequences)
  int64_t sequences = 0;         // D
  int64_t tokens_per_epoch = 0;  // T
  int64_t longest_sequence = 0;  // tokens
  int64_t seq_length = 0;
  int64_t samples = 0;  // N
  int64_t epochs = 0;   // E: the fewest whose stream holds N samples of seq_length + 1 tokens

  // The epoch sample k starts in, as the sample index counts it (see above).
  int64_t epoch_of(int64_t sample) const { return sample == 0 ? 0 : (sample * seq_length - 1) / tokens_per_epoch; }
  // The samples that start in epoch e are [first_sample(e), first_sample(e + 1)).
  int64_t first_sample(int64_t epoch) const;
};

// The layout of `samples` samples of a split's documents. Throws SpecError("--split", ...) when
// they hold too few tokens for any sample, and SpecError("--data-path", ...) for a split of 2^32
// sequences or more. REQUIRES: samples > 0; the range lies within the dataset's documents.
EpochLayout epoch_layout(const IndexedDataset& dataset, DocumentRange documents, int64_t seq_length, int64_t samples);

// The indexes' sections in the file.
inline constexpr const char* kDocumentIndex = "document_index";
inline constexpr const char* kSampleIndex = "sample_index";
inline constexpr const char* kShuffleIndex = "shuffle_index";

// Writes the three indexes to `path` (executor/data/index_file.h) over `header`, the layout in its
// facts, on `threads` threads (this one among them). The shuffle is built in memory: N entries of
// index_width(N - 1) bytes.
void build_gpt_sample_index(const IndexedDataset& dataset, const EpochLayout& layout, uint64_t seed, int64_t threads,
                            const std::string& path, nlohmann::json header);

}  // namespace megaplan::exec
