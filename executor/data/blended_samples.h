// One split's GPT samples over the datasets of a --data-path, drawn as Megatron-LM draws them
// (megatron/core/datasets/blended_megatron_dataset_builder.py and blended_dataset.py):
//   - one prefix without a weight: that dataset's samples (GptSamples), nothing blended;
//   - weights: dataset i builds ceil(ceil(N w_i) x 1.005) samples (Megatron's default
//     mid_level_dataset_surplus) and the blend holds sum_i ceil(N w_i) >= N of them;
//   - prefixes without weights: each dataset builds one epoch of its split, the weights are those
//     sample counts, and the blend holds N of them; a run needing more than their sum is refused
//     (Megatron's data loader would run dry partway).
// Sample k of the blend comes from the dataset furthest behind its share, w_i max(k, 1) minus the
// samples it has given (the first on a tie), and is that dataset's next sample: each dataset's
// count stays within one of its weight's share at every k, in a fixed order.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "executor/data/data_blend.h"
#include "executor/data/gpt_dataset.h"
#include "executor/data/indexed_dataset.h"

namespace megaplan::exec {

// Megatron's build_blending_indices: for each of `size` samples, the dataset it comes from and
// its index within that dataset's samples. REQUIRES: weights non-negative, summing to 1.
struct BlendingIndex {
  std::vector<int32_t> dataset;
  std::vector<int64_t> sample;
};
BlendingIndex build_blending_index(const std::vector<double>& weights, int64_t size);

class BlendedSamples {
 public:
  // `datasets`: the blend's datasets, opened, one per prefix. `split_index`: 0 train, 1 validation,
  // 2 test, of each dataset's documents split by `split`. Every dataset's samples are seeded with
  // `seed`. Throws SpecError("--split", "PREFIX: ...") where a dataset the blend draws from has no
  // sample in the split, and SpecError("--data-path", ...) where datasets without weights hold
  // fewer than `num_samples` samples. REQUIRES: datasets.size() == blend.prefixes.size().
  BlendedSamples(const DataBlend& blend, const std::vector<std::unique_ptr<IndexedDataset>>& datasets,
                 const std::string& split, int split_index, int64_t seq_length, int64_t num_samples, uint64_t seed);

  int64_t size() const;
  // The most epochs any dataset's samples span.
  int64_t epochs() const;
  // The index-th sample: seq_length + 1 tokens into `out`.
  void sample(int64_t index, int64_t* out) const;
  // How many of the blend's samples come from each dataset, in prefix order.
  std::vector<int64_t> samples_per_dataset() const;

 private:
  std::vector<GptSamples> parts_;  // one per dataset (those of no sample in the split: empty)
  BlendingIndex index_;            // empty: one dataset, read directly
};

// The datasets of a --data-path, opened (memory-mapped) in prefix order; IndexedDataset's errors.
std::vector<std::unique_ptr<IndexedDataset>> open_datasets(const DataBlend& blend);

// Whether any dataset of a --data-path has documents in a split (0 train, 1 validation, 2 test).
bool any_documents_in_split(const std::vector<std::unique_ptr<IndexedDataset>>& datasets, const std::string& split,
                            int split_index);

}  // namespace megaplan::exec
