// GPT training samples from an indexed dataset, as Megatron-LM's GPTDataset draws them: documents
// split into train / validation / test by --split weights ("949,50,1"), then a split's samples
// read through its three indexes (executor/data/gpt_sample_index.h: document, sample and shuffle
// index), built once, cached on disk and memory-mapped (executor/data/index_cache.h), so that a
// run of billions of samples starts in seconds and holds only the pages it reads.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "executor/data/gpt_sample_index.h"
#include "executor/data/index_cache.h"
#include "executor/data/index_file.h"
#include "executor/data/indexed_dataset.h"

namespace megaplan::exec {

// Megatron's rule: weights normalised, boundaries rounded (half to even, as Python's round), the
// rounding error taken off every boundary but the first. Throws SpecError("--split", ...) for
// anything but one to three non-negative numbers with a positive sum.
std::array<DocumentRange, 3> split_documents(const std::string& split, int64_t documents);

// Which samples of a dataset.
struct GptSampleSpec {
  DocumentRange documents;  // one split's (split_documents)
  std::string split_name;   // Megatron's name of the split ("train", "valid", "test"), in the file's name
  int64_t seq_length = 0;
  int64_t num_samples = 0;
  uint64_t seed = 0;  // the shuffles' (executor/data/seeded_shuffle.h)
};

class GptSamples {
 public:
  // REQUIRES: the range lies within the dataset's documents. Throws SpecError("--split", ...) when
  // the range holds no tokens but samples are asked for; the cache's errors (index_cache.h).
  GptSamples(const IndexedDataset& dataset, const GptSampleSpec& spec, const IndexCache& cache);

  int64_t size() const { return layout_.samples; }
  int64_t epochs() const { return layout_.epochs; }
  int64_t seq_length() const { return layout_.seq_length; }
  // The index-th sample (after shuffling): seq_length + 1 tokens into `out`. Throws the cache's
  // damaged-file error where an index entry lies out of range.
  void sample(int64_t index, int64_t* out) const;

  // The indexes, as Megatron's hold them. Where sample `sample` (before shuffling) starts: a
  // position in the document index and a token offset into its sequence.
  struct Start {
    int64_t position = 0;
    int64_t offset = 0;
  };
  Start start(int64_t sample) const;
  // The sample read index-th.
  int64_t shuffled(int64_t index) const;
  // The dataset's sequence at `position` of the document index (E x D positions).
  int64_t document(int64_t position) const;
  int64_t document_index_size() const { return layout_.epochs * layout_.sequences; }

 private:
  const IndexedDataset& dataset_;
  EpochLayout layout_;
  std::optional<MappedIndexFile> file_;  // none without samples
  PackedArray documents_;
  PackedArray starts_;
  PackedArray shuffle_;
};

}  // namespace megaplan::exec
