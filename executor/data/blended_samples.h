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

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "executor/data/data_blend.h"
#include "executor/data/gpt_dataset.h"
#include "executor/data/index_cache.h"
#include "executor/data/index_file.h"
#include "executor/data/indexed_dataset.h"

namespace megaplan::exec {

// Megatron's build_blending_indices: for each of `size` samples in turn, visit(dataset, index)
// with the dataset it comes from and its index within that dataset's samples.
// REQUIRES: weights non-negative, summing to 1.
template <typename Visit>
void blend_samples(const std::vector<double>& weights, int64_t size, Visit&& visit) {
  std::vector<int64_t> drawn(weights.size(), 0);
  for (int64_t k = 0; k < size; ++k) {
    const double position = std::max(static_cast<double>(k), 1.0);
    std::size_t behind = 0;
    double most_behind = weights[0] * position - static_cast<double>(drawn[0]);
    for (std::size_t d = 1; d < weights.size(); ++d) {
      const double error = weights[d] * position - static_cast<double>(drawn[d]);
      if (error > most_behind) {
        most_behind = error;
        behind = d;
      }
    }
    visit(behind, drawn[behind]++);
  }
}

class BlendedSamples {
 public:
  // `datasets`: the blend's datasets, opened, one per prefix. `split_index`: 0 train, 1 validation,
  // 2 test, of each dataset's documents split by `split`. Every dataset's samples are seeded with
  // `seed`; its indexes, and the blend's (dataset index and dataset sample index, as Megatron's
  // BlendedDataset names them), are cached (executor/data/index_cache.h). Throws
  // SpecError("--split", "PREFIX: ...") where a dataset the blend draws from has no sample in the
  // split, and SpecError("--data-path", ...) where datasets without weights hold fewer than
  // `num_samples` samples; the cache's errors. REQUIRES: datasets.size() == blend.prefixes.size().
  BlendedSamples(const DataBlend& blend, const std::vector<std::unique_ptr<IndexedDataset>>& datasets,
                 const std::string& split, int split_index, int64_t seq_length, int64_t num_samples, uint64_t seed,
                 const IndexCache& cache);

  int64_t size() const;
  // The most epochs any dataset's samples span.
  int64_t epochs() const;
  // The index-th sample: seq_length + 1 tokens into `out`.
  void sample(int64_t index, int64_t* out) const;
  // How many of the blend's samples come from each dataset, in prefix order.
  const std::vector<int64_t>& samples_per_dataset() const { return drawn_; }

 private:
  std::vector<GptSamples> parts_;        // one per dataset (those of no sample in the split: empty)
  std::optional<MappedIndexFile> file_;  // the blend's index; none: one dataset, read directly
  PackedArray dataset_index_;
  PackedArray dataset_sample_index_;
  std::vector<int64_t> drawn_;
};

// The datasets of a --data-path, opened (memory-mapped) in prefix order; IndexedDataset's errors.
std::vector<std::unique_ptr<IndexedDataset>> open_datasets(const DataBlend& blend);

// Whether any dataset of a --data-path has documents in a split (0 train, 1 validation, 2 test).
bool any_documents_in_split(const std::vector<std::unique_ptr<IndexedDataset>>& datasets, const std::string& split,
                            int split_index);

}  // namespace megaplan::exec
