#include "executor/data/vocabulary.h"

#include <memory>

#include "core/error.h"

namespace megaplan::exec {

Vocabulary training_vocabulary(const std::optional<Vocabulary>& given, const std::optional<TokenizerOptions>& tokenizer,
                               const IndexedDataset& data, const std::string& data_path) {
  const auto [smallest, largest] = data.token_range();
  Vocabulary vocabulary;
  if (given) {
    vocabulary = *given;
  } else if (tokenizer) {
    const std::string file = !tokenizer->tokenizer_file.empty()    ? tokenizer->tokenizer_file
                             : !tokenizer->tokenizer_model.empty() ? tokenizer->tokenizer_model
                                                                   : tokenizer->vocab_file;
    vocabulary = {make_tokenizer(*tokenizer)->vocab_size(),
                  "the tokenizer (" + tokenizer->kind + (file.empty() ? "" : ": " + file) + ")"};
  } else {
    vocabulary = {largest + 1, "the data (the largest token id in " + data_path +
                                   ".bin, plus one; name the tokenizer or give --vocab-size for the tokenizer's own)"};
  }
  if (smallest < 0) {
    throw SpecError("--data-path", data_path + ".bin holds the token id " + std::to_string(smallest) +
                                       ": token ids must be >= 0");
  }
  if (largest >= vocabulary.size) {
    throw SpecError("--vocab-size", data_path + ".bin holds the token id " + std::to_string(largest) +
                                        ", outside the vocabulary of " + std::to_string(vocabulary.size) + " from " +
                                        vocabulary.source + ": give a vocabulary of at least " +
                                        std::to_string(largest + 1));
  }
  return vocabulary;
}

}  // namespace megaplan::exec
