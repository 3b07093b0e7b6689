#include "executor/data/tokenizer.h"

#include "core/error.h"
#include "executor/data/gpt2_tokenizer.h"

namespace megaplan::exec {

std::vector<int64_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> tokens(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerOptions& options) {
  if (options.kind == "byte") {
    if (!options.vocab_file.empty()) throw SpecError("--vocab-file", "--tokenizer byte reads no vocabulary; drop it");
    if (!options.merge_file.empty()) throw SpecError("--merge-file", "--tokenizer byte reads no merges; drop it");
    return std::make_unique<ByteTokenizer>();
  }
  if (options.kind == "gpt2") {
    if (options.vocab_file.empty()) throw SpecError("--vocab-file", "--tokenizer gpt2 needs its vocab.json");
    if (options.merge_file.empty()) throw SpecError("--merge-file", "--tokenizer gpt2 needs its merges.txt");
    return std::make_unique<Gpt2Tokenizer>(options.vocab_file, options.merge_file);
  }
  throw SpecError("--tokenizer", "unknown tokenizer \"" + options.kind + "\" (known: byte, gpt2)");
}

}  // namespace megaplan::exec
