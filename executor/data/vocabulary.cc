#include "executor/data/vocabulary.h"

#include <memory>

#include "core/error.h"
#include "executor/data/indexed_dataset.h"

namespace megaplan::exec {

Vocabulary training_vocabulary(const std::optional<Vocabulary>& given, const std::optional<TokenizerOptions>& tokenizer,
                               const DataBlend& data) {
  // The smallest and the largest token over the datasets, and the file each is in.
  struct Extreme {
    int64_t token = 0;
    std::string prefix;
  };
  std::optional<Extreme> smallest;
  std::optional<Extreme> largest;
  for (const std::string& prefix : data.prefixes) {
    const auto [low, high] = IndexedDataset(prefix).token_range();
    if (low > high) continue;  // no tokens
    if (!smallest || low < smallest->token) smallest = Extreme{low, prefix};
    if (!largest || high > largest->token) largest = Extreme{high, prefix};
  }
  const std::string largest_file = largest ? largest->prefix + ".bin" : data.prefixes.front() + ".bin";
  const int64_t largest_token = largest ? largest->token : -1;
  Vocabulary vocabulary;
  if (given) {
    vocabulary = *given;
  } else if (tokenizer) {
    const TokenizerOptions resolved = resolve_tokenizer(*tokenizer);
    const std::string file = tokenizer_main_file(resolved);
    vocabulary = {make_tokenizer(*tokenizer)->vocab_size(),
                  "the tokenizer (" + resolved.kind + (file.empty() ? "" : ": " + file) + ")"};
  } else {
    vocabulary = {largest_token + 1,
                  "the data (the largest token id in " + largest_file +
                      ", plus one; name the tokenizer or give --vocab-size for the tokenizer's own)"};
  }
  if (smallest && smallest->token < 0) {
    throw SpecError("--data-path", smallest->prefix + ".bin holds the token id " + std::to_string(smallest->token) +
                                       ": token ids must be >= 0");
  }
  if (largest_token >= vocabulary.size) {
    throw SpecError("--vocab-size", largest_file + " holds the token id " + std::to_string(largest_token) +
                                        ", outside the vocabulary of " + std::to_string(vocabulary.size) + " from " +
                                        vocabulary.source + ": give a vocabulary of at least " +
                                        std::to_string(largest_token + 1));
  }
  return vocabulary;
}

}  // namespace megaplan::exec
