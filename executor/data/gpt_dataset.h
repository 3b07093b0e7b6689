// GPT training samples from an indexed dataset, as Megatron-LM's GPTDataset builds them:
// documents split into train / validation / test by --split weights ("949,50,1"), a document index
// (the split's documents once per epoch, shuffled), a sample index (where each sample of
// seq_length + 1 tokens starts: samples overlap by the one token that is both the last label of
// one sample and the first input of the next), and a shuffle index over the samples; as many
// epochs as the requested sample count needs. Shuffles are seeded (--seed) Fisher-Yates on a
// 64-bit Mersenne Twister: reproducible everywhere, though not numpy's exact order.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "executor/data/indexed_dataset.h"

namespace megaplan::exec {

// Documents [begin, end) of one split.
struct DocumentRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Megatron's rule: weights normalised, boundaries rounded (half to even, as Python's round), the
// rounding error taken off every boundary but the first. Throws SpecError("--split", ...) for
// anything but one to three non-negative numbers with a positive sum.
std::array<DocumentRange, 3> split_documents(const std::string& split, int64_t documents);

class GptSamples {
 public:
  // REQUIRES: the range lies within the dataset's documents. Throws SpecError("--split", ...) when
  // the range holds no tokens but samples are asked for.
  GptSamples(const IndexedDataset& dataset, DocumentRange documents, int64_t seq_length, int64_t num_samples,
             uint64_t seed);

  int64_t size() const { return static_cast<int64_t>(shuffle_.size()); }
  int64_t epochs() const { return epochs_; }
  int64_t seq_length() const { return seq_length_; }
  // The index-th sample (after shuffling): seq_length + 1 tokens into `out`.
  void sample(int64_t index, int64_t* out) const;

 private:
  const IndexedDataset& dataset_;
  int64_t seq_length_;
  int64_t epochs_ = 0;
  std::vector<int32_t> document_index_;         // sequences, epoch after epoch, each epoch shuffled
  std::vector<std::array<int64_t, 2>> starts_;  // per sample: position in document_index_, token offset
  std::vector<int64_t> shuffle_;                // sample order
};

}  // namespace megaplan::exec
