#include "executor/data/data_blend.h"

#include <cmath>
#include <cstdlib>
#include <optional>

#include "core/error.h"

namespace megaplan::exec {

namespace {

constexpr std::size_t kMaxBlendDatasets = 32767;  // Megatron's BlendedDataset indexes them in int16

std::string stripped(const std::string& word) {
  const std::size_t first = word.find_first_not_of(" \t\n\r\f\v");
  if (first == std::string::npos) return "";
  return word.substr(first, word.find_last_not_of(" \t\n\r\f\v") - first + 1);
}

// `word` as Python's float() reads a weight, or nothing when it is no number.
std::optional<double> number_of(const std::string& word) {
  const std::string text = stripped(word);
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

DataBlend parse_data_blend(const std::vector<std::string>& words) {
  if (words.empty()) throw SpecError("--data-path", "needs a dataset prefix (PREFIX of PREFIX.bin and PREFIX.idx)");
  DataBlend blend;
  std::vector<std::string> prefix_words = words;
  if (words.size() % 2 == 0) {
    std::vector<double> weights;
    std::size_t numbers = 0;
    for (std::size_t i = 0; i < words.size(); i += 2) {
      const std::optional<double> weight = number_of(words[i]);
      if (weight) ++numbers;
      weights.push_back(weight.value_or(0.0));
    }
    if (numbers == weights.size()) {
      prefix_words.clear();
      double total = 0;
      for (std::size_t i = 0; i < weights.size(); ++i) {
        if (!(weights[i] > 0) || !std::isfinite(weights[i])) {
          throw SpecError("--data-path", "the weight \"" + words[2 * i] + "\" of " + words[2 * i + 1] +
                                             " must be a positive finite number");
        }
        total += weights[i];
        prefix_words.push_back(words[2 * i + 1]);
      }
      if (!std::isfinite(total)) throw SpecError("--data-path", "the weights' sum must be finite");
      for (double& weight : weights) weight /= total;
      blend.weights = weights;
    } else if (numbers > 0) {
      for (std::size_t i = 0; i < words.size(); i += 2) {
        if (number_of(words[i])) continue;
        throw SpecError("--data-path", "\"" + words[i] + "\" (word " + std::to_string(i + 1) +
                                           ") is no weight where other prefixes have one: give a weight before every "
                                           "prefix (0.3 A 0.7 B), or none (A B)");
      }
    }
  }
  if (prefix_words.size() > kMaxBlendDatasets) {
    throw SpecError("--data-path", std::to_string(prefix_words.size()) + " datasets: must be at most " +
                                       std::to_string(kMaxBlendDatasets) + " (Megatron's 16-bit dataset index)");
  }
  for (const std::string& word : prefix_words) {
    std::string prefix = stripped(word);
    if (prefix.empty()) throw SpecError("--data-path", "a dataset prefix must not be empty");
    blend.prefixes.push_back(std::move(prefix));
  }
  return blend;
}

}  // namespace megaplan::exec
