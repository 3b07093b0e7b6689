#include "executor/data/blended_samples.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "core/error.h"

namespace megaplan::exec {

namespace {

constexpr double kMidLevelSurplus = 0.005;  // Megatron's mid_level_dataset_surplus default
// Building the index visits every dataset for every sample (as Megatron's helper does): bounded so
// that a huge blend is refused rather than left running for hours.
constexpr double kMaxBlendSteps = 17179869184.0;                        // 2^34
const char* const kSplitNames[] = {"train", "valid", "test"};           // Megatron's, in file names
const char* const kSplitTitles[] = {"training", "validation", "test"};  // in messages
// The blend's index, as Megatron's BlendedDataset names its arrays.
constexpr const char* kDatasetIndex = "dataset_index";
constexpr const char* kDatasetSampleIndex = "dataset_sample_index";
constexpr const char* kSamplesPerDataset = "samples_per_dataset";
enum BlendSection : std::size_t { kDatasets, kDatasetSamples, kCounts };  // in the file, in this order
constexpr std::size_t kEntriesPerWrite = std::size_t{1} << 20;

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

// Writes blend_samples()'s choices to `path`, and how many each dataset gives.
void build_blend_index(const std::vector<double>& weights, int64_t size, const std::string& path,
                       nlohmann::json header) {
  const auto samples = static_cast<uint64_t>(size);
  header["facts"] = nlohmann::json::object();
  IndexFileWriter writer(path, std::move(header),
                         {{kDatasetIndex, index_width(weights.size() - 1), samples},
                          {kDatasetSampleIndex, index_width(samples - 1), samples},
                          {kSamplesPerDataset, index_width(samples), weights.size()}});
  std::vector<uint16_t> datasets;  // at most 32767 datasets (data_blend.h)
  std::vector<uint64_t> indices;
  uint64_t written = 0;
  const auto flush = [&] {
    writer.write(kDatasets, written, datasets.data(), datasets.size());
    writer.write(kDatasetSamples, written, indices.data(), indices.size());
    written += datasets.size();
    datasets.clear();
    indices.clear();
  };
  std::vector<uint64_t> drawn(weights.size(), 0);
  blend_samples(weights, size, [&](std::size_t dataset, int64_t index) {
    datasets.push_back(static_cast<uint16_t>(dataset));
    indices.push_back(static_cast<uint64_t>(index));
    ++drawn[dataset];
    if (datasets.size() == kEntriesPerWrite) flush();
  });
  flush();
  writer.write(kCounts, 0, drawn.data(), drawn.size());
  writer.commit();
}

}  // namespace

BlendedSamples::BlendedSamples(const DataBlend& blend, const std::vector<std::unique_ptr<IndexedDataset>>& datasets,
                               const std::string& split, int split_index, int64_t seq_length, int64_t num_samples,
                               uint64_t seed, const IndexCache& cache) {
  if (num_samples <= 0) return;
  const auto part_spec = [&](std::size_t d, int64_t samples) {
    return GptSampleSpec{split_range(*datasets[d], split, split_index), kSplitNames[split_index], seq_length, samples,
                         seed};
  };
  if (blend.prefixes.size() == 1 && !blend.weighted()) {
    parts_.emplace_back(*datasets[0], part_spec(0, num_samples), cache);
    drawn_ = {num_samples};
    return;
  }
  const std::size_t count = datasets.size();
  const std::string split_name = kSplitTitles[split_index];
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
      parts_.emplace_back(*datasets[d], part_spec(d, built[d]), cache);
    } catch (const SpecError& error) {
      throw SpecError(error.field(), blend.prefixes[d] + ": " + error.rule());
    }
  }

  IndexRequest request;
  std::tie(request.folder, request.field) = cache_folder(cache, datasets[0]->prefix(), "BlendedDataset");
  request.name = std::string("BlendedDataset-") + kSplitNames[split_index];
  // The index depends on the weights and the size alone, whatever the datasets hold.
  request.description = {{"class", "BlendedDataset"}, {"weights", weights}, {"size", size}};
  request.what = "the " + split_name + " blend of " + std::to_string(count) + " datasets";
  file_.emplace(open_or_build_index(request, cache, [&](const std::string& path, nlohmann::json header) {
    build_blend_index(weights, size, path, std::move(header));
  }));
  dataset_index_ = file_->section(kDatasetIndex);
  dataset_sample_index_ = file_->section(kDatasetSampleIndex);
  const PackedArray drawn = file_->section(kSamplesPerDataset);
  for (uint64_t d = 0; d < drawn.size(); ++d) drawn_.push_back(static_cast<int64_t>(drawn[d]));
  if (dataset_index_.size() != static_cast<uint64_t>(size) ||
      dataset_sample_index_.size() != static_cast<uint64_t>(size) || drawn_.size() != count) {
    file_->damaged("its sections do not hold the " + std::to_string(size) + " samples its description asks for");
  }
  for (std::size_t d = 0; d < count; ++d) {
    if (drawn_[d] > built[d]) {  // Megatron raises here too; its margin makes it rare
      throw SpecError("--data-path", "the " + split_name + " blend draws " + std::to_string(drawn_[d]) +
                                         " samples from " + blend.prefixes[d] + ", more than the " +
                                         std::to_string(built[d]) + " it built");
    }
  }
}

int64_t BlendedSamples::size() const {
  if (parts_.empty()) return 0;
  if (!file_) return parts_.front().size();
  return static_cast<int64_t>(dataset_index_.size());
}

int64_t BlendedSamples::epochs() const {
  int64_t most = 0;
  for (const GptSamples& part : parts_) most = std::max(most, part.epochs());
  return most;
}

void BlendedSamples::sample(int64_t index, int64_t* out) const {
  if (!file_) {
    parts_.front().sample(index, out);
    return;
  }
  const auto at = static_cast<uint64_t>(index);
  const uint64_t dataset = dataset_index_[at];
  const uint64_t sample = dataset_sample_index_[at];
  if (dataset >= parts_.size() || sample >= static_cast<uint64_t>(parts_[dataset].size())) {
    file_->damaged("entry " + std::to_string(index) + " names sample " + std::to_string(sample) + " of dataset " +
                   std::to_string(dataset) + ", which does not hold it");
  }
  parts_[dataset].sample(static_cast<int64_t>(sample), out);
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
