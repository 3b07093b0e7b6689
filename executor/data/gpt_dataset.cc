#include "executor/data/gpt_dataset.h"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <tuple>

#include "core/error.h"

namespace megaplan::exec {

std::array<DocumentRange, 3> split_documents(const std::string& split, int64_t documents) {
  std::vector<double> weights;
  std::stringstream stream(split);
  std::string part;
  while (std::getline(stream, part, ',')) {
    std::size_t used = 0;
    double weight = -1;
    try {
      weight = std::stod(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != part.size() || !(weight >= 0) || !std::isfinite(weight)) {
      throw SpecError("--split", "\"" + split + "\": each weight must be a non-negative number");
    }
    weights.push_back(weight);
  }
  double total = 0;
  for (double weight : weights) total += weight;
  if (weights.empty() || weights.size() > 3 || !(total > 0)) {
    throw SpecError("--split",
                    "\"" + split + "\": needs one to three weights (train, validation, test) with a positive sum");
  }
  weights.resize(3, 0.0);
  std::array<int64_t, 4> bounds{0, 0, 0, 0};
  const int saved_rounding = std::fegetround();
  std::fesetround(FE_TONEAREST);  // nearbyint then rounds half to even, as Python's round
  for (std::size_t i = 0; i < 3; ++i) {
    bounds[i + 1] =
        bounds[i] + static_cast<int64_t>(std::nearbyint(weights[i] / total * static_cast<double>(documents)));
  }
  std::fesetround(saved_rounding);
  const int64_t excess = bounds[3] - documents;
  for (std::size_t i = 1; i < 4; ++i) bounds[i] -= excess;
  return {DocumentRange{bounds[0], bounds[1]}, DocumentRange{bounds[1], bounds[2]},
          DocumentRange{bounds[2], bounds[3]}};
}

GptSamples::GptSamples(const IndexedDataset& dataset, const GptSampleSpec& spec, const IndexCache& cache)
    : dataset_(dataset) {
  layout_.seq_length = spec.seq_length;
  if (spec.num_samples <= 0) return;
  layout_ = epoch_layout(dataset, spec.documents, spec.seq_length, spec.num_samples);
  const std::string prefix = std::filesystem::absolute(dataset.prefix()).lexically_normal().string();
  IndexRequest request;
  std::tie(request.folder, request.field) = cache_folder(cache, dataset.prefix(), "GPTDataset");
  request.name = "GPTDataset-" + spec.split_name;
  request.description = {{"class", "GPTDataset"},
                         {"dataset_path", prefix},
                         {"index_split", spec.split_name},
                         {"documents", {spec.documents.begin, spec.documents.end}},
                         {"sequence_length", spec.seq_length},
                         {"num_samples", spec.num_samples},
                         {"random_seed", spec.seed}};
  request.inputs = {prefix + ".bin", prefix + ".idx"};
  request.what = "the " + spec.split_name + " samples of " + dataset.prefix();
  file_.emplace(open_or_build_index(request, cache, [&](const std::string& path, nlohmann::json header) {
    build_gpt_sample_index(dataset, layout_, spec.seed, cache.threads, path, std::move(header));
  }));
  documents_ = file_->section(kDocumentIndex);
  starts_ = file_->section(kSampleIndex);
  shuffle_ = file_->section(kShuffleIndex);
  const nlohmann::json& facts = file_->facts();
  if (documents_.size() != static_cast<uint64_t>(document_index_size()) ||
      starts_.size() != 2 * static_cast<uint64_t>(layout_.samples) ||
      shuffle_.size() != static_cast<uint64_t>(layout_.samples) ||
      facts.value("epochs", int64_t{-1}) != layout_.epochs ||
      facts.value("first_sequence", int64_t{-1}) != layout_.first_sequence ||
      facts.value("sequences", int64_t{-1}) != layout_.sequences) {
    file_->damaged("its sections do not hold the " + std::to_string(layout_.samples) + " samples of " +
                   std::to_string(layout_.epochs) + " epochs its description asks for");
  }
}

GptSamples::Start GptSamples::start(int64_t sample) const {
  const auto at = 2 * static_cast<uint64_t>(sample);
  const uint64_t slot = starts_[at];
  if (slot > static_cast<uint64_t>(layout_.sequences)) {
    file_->damaged("sample " + std::to_string(sample) + " starts at slot " + std::to_string(slot) + " of an epoch of " +
                   std::to_string(layout_.sequences) + " sequences");
  }
  return {layout_.epoch_of(sample) * layout_.sequences + static_cast<int64_t>(slot),
          static_cast<int64_t>(starts_[at + 1])};
}

int64_t GptSamples::shuffled(int64_t index) const {
  const uint64_t sample = shuffle_[static_cast<uint64_t>(index)];
  if (sample >= static_cast<uint64_t>(layout_.samples)) {
    file_->damaged("shuffle entry " + std::to_string(index) + " is " + std::to_string(sample) + ", not one of the " +
                   std::to_string(layout_.samples) + " samples");
  }
  return static_cast<int64_t>(sample);
}

int64_t GptSamples::document(int64_t position) const {
  if (position >= document_index_size()) {
    file_->damaged("a sample runs past the document index's " + std::to_string(document_index_size()) + " entries");
  }
  const uint64_t slot = documents_[static_cast<uint64_t>(position)];
  if (slot >= static_cast<uint64_t>(layout_.sequences)) {
    file_->damaged("document entry " + std::to_string(position) + " is " + std::to_string(slot) + ", not one of the " +
                   std::to_string(layout_.sequences) + " sequences");
  }
  return layout_.first_sequence + static_cast<int64_t>(slot);
}

void GptSamples::sample(int64_t index, int64_t* out) const {
  const Start begin = start(shuffled(index));
  int64_t position = begin.position;
  int64_t offset = begin.offset;
  int64_t needed = layout_.seq_length + 1;
  while (needed > 0) {
    const auto sequence = static_cast<std::size_t>(document(position));
    const int64_t length = dataset_.sequence_length(sequence);
    if (offset > length) {
      file_->damaged("a sample starts at token " + std::to_string(offset) + " of a sequence of " +
                     std::to_string(length));
    }
    const int64_t take = std::min(needed, length - offset);
    dataset_.read(sequence, static_cast<std::size_t>(offset), static_cast<std::size_t>(take), out);
    out += take;
    needed -= take;
    offset = 0;
    ++position;
  }
}

}  // namespace megaplan::exec
