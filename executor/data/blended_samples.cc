#include "executor/data/blended_samples.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace megaplan::exec {

namespace {

constexpr double kMidLevelSurplus = 0.005;  // Megatron's mid_level_dataset_surplus default
// Building the index visits every dataset for every sample (as Megatron's helper does): bounded so
// that a huge blend is refused rather than left running for hours.
constexpr double kMaxBlendSteps = 17179869184.0;  // 2^34
const char* const kSplitNames[] = {"training", "validation", "test"};

DocumentRange split_range(const IndexedDataset& dataset, const std::string& split, int split_index) {
  return split_documents(split, static_cast<int64_t>(dataset.num_documents()))[static_cast<std::size_t>(split_index)];
}

int64_t tokens_in(const IndexedDataset& dataset, DocumentRange documents) {
  int64_t tokens = 0;
  const int64_t last = dataset.document_start(static_cast<std::size_t>(documents.end));
  for (int64_t s = dataset.document_start(static_cast<std::size_t>(documents.begin)); s < last; ++s) {
    tokens += dataset.sequence_length(static_cast<std::size_t>(s));
  }
  return tokens;
}

}  // namespace

BlendingIndex build_blending_index(const std::vector<double>& weights, int64_t size) {
  BlendingIndex index;
  index.dataset.resize(static_cast<std::size_t>(size));
  index.sample.resize(static_cast<std::size_t>(size));
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
    index.dataset[static_cast<std::size_t>(k)] = static_cast<int32_t>(behind);
    index.sample[static_cast<std::size_t>(k)] = drawn[behind]++;
  }
  return index;
}

BlendedSamples::BlendedSamples(const DataBlend& blend, const std::vector<std::unique_ptr<IndexedDataset>>& datasets,
                               const std::string& split, int split_index, int64_t seq_length, int64_t num_samples,
                               uint64_t seed) {
  if (num_samples <= 0) return;
  if (blend.prefixes.size() == 1 && !blend.weighted()) {
    parts_.emplace_back(*datasets[0], split_range(*datasets[0], split, split_index), seq_length, num_samples, seed);
    return;
  }
  const std::size_t count = datasets.size();
  const std::string split_name = kSplitNames[split_index];
  std::vector<double> weights(count);
  std::vector<int64_t> built(count);  // the samples each dataset builds
  int64_t size = 0;
  if (blend.weighted()) {
    weights = blend.weights;
    for (std::size_t d = 0; d < count; ++d) {
      const double target = std::ceil(static_cast<double>(num_samples) * weights[d]);
      built[d] = static_cast<int64_t>(std::ceil(target * (1 + kMidLevelSurplus)));
      size += static_cast<int64_t>(target);
    }
  } else {
    // One epoch of each dataset's split: (tokens - 1) / seq_length samples of seq_length + 1 tokens.
    int64_t total = 0;
    for (std::size_t d = 0; d < count; ++d) {
      const int64_t tokens = tokens_in(*datasets[d], split_range(*datasets[d], split, split_index));
      built[d] = tokens > 1 ? (tokens - 1) / seq_length : 0;
      total += built[d];
    }
    if (total < num_samples) {
      throw SpecError("--data-path", "the " + std::to_string(count) + " datasets given without weights hold " +
                                         std::to_string(total) + " " + split_name + " samples of " +
                                         std::to_string(seq_length + 1) +
                                         " tokens (an epoch of each, as Megatron-LM "
                                         "blends them), fewer than the " +
                                         std::to_string(num_samples) +
                                         " this run draws: give weights (0.5 A 0.5 B) to repeat them, or more data");
    }
    for (std::size_t d = 0; d < count; ++d) weights[d] = static_cast<double>(built[d]) / static_cast<double>(total);
    size = num_samples;
  }
  if (static_cast<double>(count) * static_cast<double>(size) > kMaxBlendSteps) {
    throw SpecError("--data-path", std::to_string(count) + " datasets x " + std::to_string(size) + " " + split_name +
                                       " samples: must be at most 2^34 (the blend's index weighs every dataset for "
                                       "every sample)");
  }
  parts_.reserve(count);
  for (std::size_t d = 0; d < count; ++d) {
    try {
      parts_.emplace_back(*datasets[d], split_range(*datasets[d], split, split_index), seq_length, built[d], seed);
    } catch (const SpecError& error) {
      throw SpecError(error.field(), blend.prefixes[d] + ": " + error.rule());
    }
  }
  index_ = build_blending_index(weights, size);
  const std::vector<int64_t> drawn = samples_per_dataset();
  for (std::size_t d = 0; d < count; ++d) {
    if (drawn[d] > built[d]) {  // Megatron raises here too; its margin makes it rare
      throw SpecError("--data-path", "the " + split_name + " blend draws " + std::to_string(drawn[d]) +
                                         " samples from " + blend.prefixes[d] + ", more than the " +
                                         std::to_string(built[d]) + " it built");
    }
  }
}

int64_t BlendedSamples::size() const {
  if (parts_.empty()) return 0;
  if (index_.dataset.empty()) return parts_.front().size();
  return static_cast<int64_t>(index_.dataset.size());
}

int64_t BlendedSamples::epochs() const {
  int64_t most = 0;
  for (const GptSamples& part : parts_) most = std::max(most, part.epochs());
  return most;
}

void BlendedSamples::sample(int64_t index, int64_t* out) const {
  if (index_.dataset.empty()) {
    parts_.front().sample(index, out);
    return;
  }
  const auto at = static_cast<std::size_t>(index);
  parts_[static_cast<std::size_t>(index_.dataset[at])].sample(index_.sample[at], out);
}

std::vector<int64_t> BlendedSamples::samples_per_dataset() const {
  if (index_.dataset.empty()) return {size()};
  std::vector<int64_t> drawn(parts_.size(), 0);
  for (const int32_t dataset : index_.dataset) ++drawn[static_cast<std::size_t>(dataset)];
  return drawn;
}

std::vector<std::unique_ptr<IndexedDataset>> open_datasets(const DataBlend& blend) {
  std::vector<std::unique_ptr<IndexedDataset>> datasets;
  for (const std::string& prefix : blend.prefixes) datasets.push_back(std::make_unique<IndexedDataset>(prefix));
  return datasets;
}

bool any_documents_in_split(const std::vector<std::unique_ptr<IndexedDataset>>& datasets, const std::string& split,
                            int split_index) {
  return std::any_of(datasets.begin(), datasets.end(), [&](const std::unique_ptr<IndexedDataset>& dataset) {
    return split_range(*dataset, split, split_index).size() > 0;
  });
}

}  // namespace megaplan::exec
