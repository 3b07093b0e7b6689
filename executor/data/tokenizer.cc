#include "executor/data/tokenizer.h"

#include "core/error.h"
#include "executor/data/gpt2_tokenizer.h"
#include "executor/data/hf_tokenizer.h"
#include "executor/data/sentencepiece_tokenizer.h"

namespace megaplan::exec {

std::vector<int64_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> tokens(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerOptions& options) {
  struct FileFlag {
    const char* flag;
    const std::string& value;
    const char* kind;  // the tokenizer that reads it
    const char* what;
  };
  const FileFlag flags[] = {
      {"--vocab-file", options.vocab_file, "gpt2", "its vocab.json"},
      {"--merge-file", options.merge_file, "gpt2", "its merges.txt"},
      {"--tokenizer-file", options.tokenizer_file, "hf", "its tokenizer.json"},
      {"--tokenizer-model", options.tokenizer_model, "sentencepiece", "its tokenizer.model"},
  };
  if (options.kind != "byte" && options.kind != "gpt2" && options.kind != "hf" && options.kind != "sentencepiece") {
    throw SpecError("--tokenizer", "unknown tokenizer \"" + options.kind + "\" (known: byte, gpt2, hf, sentencepiece)");
  }
  for (const FileFlag& file : flags) {
    if (file.kind == options.kind && file.value.empty()) {
      throw SpecError(file.flag, "--tokenizer " + options.kind + " needs " + file.what);
    }
    if (file.kind != options.kind && !file.value.empty()) {
      throw SpecError(file.flag, "--tokenizer " + options.kind + " does not read " + file.what + " (--tokenizer " +
                                     file.kind + " does); drop it");
    }
  }
  if (options.kind == "gpt2") return std::make_unique<Gpt2Tokenizer>(options.vocab_file, options.merge_file);
  if (options.kind == "hf") return std::make_unique<HfTokenizer>(options.tokenizer_file);
  if (options.kind == "sentencepiece") return std::make_unique<SentencePieceTokenizer>(options.tokenizer_model);
  return std::make_unique<ByteTokenizer>();
}

}  // namespace megaplan::exec
