// --data-path as Megatron-LM reads it (megatron/core/datasets/utils.py, get_blend_from_list): one
// dataset prefix; several prefixes, blended in proportion to the samples each holds; or weights and
// prefixes ("0.3 A 0.7 B"), blended in proportion to the weights, normalised to sum to one.
#pragma once

#include <string>
#include <vector>

namespace megaplan::exec {

struct DataBlend {
  std::vector<std::string> prefixes;
  std::vector<double> weights;  // one per prefix, summing to 1; empty: none given

  DataBlend() = default;
  // One prefix, as `--data-path PREFIX` gives it: a blend of one dataset, read as it is.
  DataBlend(std::string prefix) : prefixes{std::move(prefix)} {}  // NOLINT(google-explicit-constructor)

  bool empty() const { return prefixes.empty(); }
  bool weighted() const { return !weights.empty(); }
};

// Megatron's rule: an odd number of words are all prefixes; an even number whose every other word,
// from the first, is a number are weight-prefix pairs; an even number with no such number are all
// prefixes. Prefixes are stripped of surrounding white space. Throws SpecError("--data-path", ...)
// for no words, an empty prefix, numbers before some prefixes but not others, a weight that is not
// a positive finite number, or more than 32767 datasets (Megatron's 16-bit dataset index).
DataBlend parse_data_blend(const std::vector<std::string>& words);

}  // namespace megaplan::exec
