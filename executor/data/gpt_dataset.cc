#include "executor/data/gpt_dataset.h"

#include <cfenv>
#include <cmath>
#include <random>
#include <sstream>

#include "core/error.h"

namespace megaplan::exec {

namespace {

// A uniform integer in [0, bound) by rejection: the same on every standard library.
uint64_t uniform_below(std::mt19937_64& generator, uint64_t bound) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t draw = generator();
  while (draw >= limit) draw = generator();
  return draw % bound;
}

template <typename T>
void shuffle(std::vector<T>& values, std::mt19937_64& generator) {
  for (std::size_t i = values.size(); i > 1; --i) {
    std::swap(values[i - 1], values[static_cast<std::size_t>(uniform_below(generator, i))]);
  }
}

}  // namespace

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

GptSamples::GptSamples(const IndexedDataset& dataset, DocumentRange documents, int64_t seq_length, int64_t num_samples,
                       uint64_t seed)
    : dataset_(dataset), seq_length_(seq_length) {
  if (num_samples <= 0) return;
  const int64_t first = dataset.document_start(static_cast<std::size_t>(documents.begin));
  const int64_t last = dataset.document_start(static_cast<std::size_t>(documents.end));
  int64_t tokens_per_epoch = 0;
  for (int64_t s = first; s < last; ++s) tokens_per_epoch += dataset.sequence_length(static_cast<std::size_t>(s));
  if (tokens_per_epoch <= 1) {
    throw SpecError("--split", "the split's documents [" + std::to_string(documents.begin) + ", " +
                                   std::to_string(documents.end) + ") hold " + std::to_string(tokens_per_epoch) +
                                   " tokens, too few for any sample");
  }
  // Enough epochs that the token stream holds num_samples samples of seq_length + 1 overlapping tokens.
  epochs_ = 1;
  while ((epochs_ * tokens_per_epoch - 1) / seq_length < num_samples) ++epochs_;
  std::mt19937_64 generator(seed);
  for (int64_t epoch = 0; epoch < epochs_; ++epoch) {
    std::vector<int32_t> order;
    for (int64_t s = first; s < last; ++s) order.push_back(static_cast<int32_t>(s));
    shuffle(order, generator);
    document_index_.insert(document_index_.end(), order.begin(), order.end());
  }
  // Walk the stream: a sample starts where the previous one's last token sits.
  std::size_t position = 0;
  int64_t offset = 0;
  for (int64_t sample = 0; sample < num_samples; ++sample) {
    starts_.push_back({static_cast<int64_t>(position), offset});
    int64_t remaining = seq_length;  // tokens to advance: the next sample starts seq_length tokens on
    while (remaining > 0) {
      const int64_t length = dataset.sequence_length(static_cast<std::size_t>(document_index_[position]));
      if (offset + remaining < length) {
        offset += remaining;
        remaining = 0;
      } else {
        remaining -= length - offset;
        offset = 0;
        ++position;
      }
    }
    // The stream holds the next start, and seq_length + 1 tokens from each start (checked by
    // the epoch count above).
  }
  shuffle_.resize(starts_.size());
  for (std::size_t i = 0; i < shuffle_.size(); ++i) shuffle_[i] = static_cast<int64_t>(i);
  shuffle(shuffle_, generator);
}

void GptSamples::sample(int64_t index, int64_t* out) const {
  const std::array<int64_t, 2>& start = starts_[static_cast<std::size_t>(shuffle_[static_cast<std::size_t>(index)])];
  auto position = static_cast<std::size_t>(start[0]);
  int64_t offset = start[1];
  int64_t needed = seq_length_ + 1;
  while (needed > 0) {
    const auto sequence = static_cast<std::size_t>(document_index_[position]);
    const int64_t take = std::min<int64_t>(needed, dataset_.sequence_length(sequence) - offset);
    dataset_.read(sequence, static_cast<std::size_t>(offset), static_cast<std::size_t>(take), out);
    out += take;
    needed -= take;
    offset = 0;
    ++position;
  }
}

}  // namespace megaplan::exec
