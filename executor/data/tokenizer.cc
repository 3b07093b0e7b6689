#include "executor/data/tokenizer.h"

#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "executor/data/gpt2_tokenizer.h"
#include "executor/data/hf_tokenizer.h"
#include "executor/data/sentencepiece_tokenizer.h"

namespace megaplan::exec {

namespace {

// Megatron-LM's --tokenizer-type values (megatron/training/arguments.py's choices) and megaplan's
// tokenizer for each; nullptr where megaplan has none. A new mapping is one row here.
struct MegatronTokenizerType {
  const char* name;
  const char* kind;
};
constexpr MegatronTokenizerType kMegatronTokenizerTypes[] = {
    {"GPT2BPETokenizer", "gpt2"},
    {"HuggingFaceTokenizer", "hf"},
    {"SentencePieceTokenizer", "sentencepiece"},
    {"GPTSentencePieceTokenizer", "sentencepiece"},
    {"Llama2Tokenizer", "sentencepiece"},
    {"BertWordPieceLowerCase", nullptr},
    {"BertWordPieceCase", nullptr},
    {"TikTokenizer", nullptr},
    {"MultimodalTokenizer", nullptr},
    {"NullTokenizer", nullptr},
    {"NullMultimodalTokenizer", nullptr},
    {"SFTTokenizer", nullptr},
};

std::string supported_megatron_types() {
  std::string names;
  for (const MegatronTokenizerType& type : kMegatronTokenizerTypes) {
    if (type.kind) names += (names.empty() ? "" : ", ") + std::string(type.name);
  }
  return names;
}

// The row of a type megaplan builds; throws SpecError("--tokenizer-type", ...) for any other name.
const MegatronTokenizerType& megatron_tokenizer_type(const std::string& name) {
  for (const MegatronTokenizerType& row : kMegatronTokenizerTypes) {
    if (name == row.name && row.kind) return row;
    if (name == row.name) {
      throw SpecError("--tokenizer-type", "\"" + name + "\" is Megatron-LM's but not built in megaplan (supported: " +
                                              supported_megatron_types() + ")");
    }
  }
  throw SpecError("--tokenizer-type",
                  "\"" + name + "\" is no Megatron-LM tokenizer type (supported: " + supported_megatron_types() + ")");
}

// How the tokenizer was named, for messages: the flag the user wrote.
std::string named(const TokenizerOptions& options) {
  if (!options.megatron_type.empty()) return "--tokenizer-type " + options.megatron_type;
  return "--tokenizer " + options.kind;
}

}  // namespace

std::vector<int64_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> tokens(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::string tokenizer_main_file(const TokenizerOptions& resolved) {
  return !resolved.tokenizer_file.empty()    ? resolved.tokenizer_file
         : !resolved.tokenizer_model.empty() ? resolved.tokenizer_model
                                             : resolved.vocab_file;
}

void check_megatron_tokenizer_type(const std::string& megatron_type) { (void)megatron_tokenizer_type(megatron_type); }

TokenizerOptions resolve_tokenizer(const TokenizerOptions& options) {
  TokenizerOptions resolved = options;
  if (options.megatron_type.empty()) {
    if (resolved.kind.empty()) resolved.kind = "byte";
    return resolved;
  }
  const MegatronTokenizerType& type = megatron_tokenizer_type(options.megatron_type);
  if (!options.kind.empty() && options.kind != type.kind) {
    throw SpecError("--tokenizer-type", options.megatron_type + " is megaplan's --tokenizer " + type.kind +
                                            ", not --tokenizer " + options.kind +
                                            ": give one of them, or both agreeing");
  }
  resolved.kind = type.kind;
  if (resolved.kind == "hf" && !options.tokenizer_model.empty()) {
    // Megatron hands HuggingFaceTokenizer its tokenizer as --tokenizer-model: a file or a folder.
    if (!options.tokenizer_file.empty()) {
      throw SpecError("--tokenizer-model",
                      "and --tokenizer-file both name HuggingFaceTokenizer's tokenizer.json: give one");
    }
    std::error_code error;
    const bool folder = std::filesystem::is_directory(options.tokenizer_model, error);
    resolved.tokenizer_file =
        folder ? (std::filesystem::path(options.tokenizer_model) / "tokenizer.json").string() : options.tokenizer_model;
    resolved.tokenizer_model.clear();
  }
  return resolved;
}

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerOptions& given) {
  const TokenizerOptions options = resolve_tokenizer(given);
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
  // HuggingFaceTokenizer takes its tokenizer.json as --tokenizer-model, as Megatron-LM does: errors
  // about that file name the flag it came by.
  const bool hf_by_model = options.kind == "hf" && !given.tokenizer_model.empty() && options.tokenizer_model.empty();
  for (const FileFlag& file : flags) {
    const bool hf_file = options.kind == "hf" && !options.megatron_type.empty() && file.kind == options.kind;
    const char* flag = hf_file ? "--tokenizer-model" : file.flag;
    if (file.kind == options.kind && file.value.empty()) {
      throw SpecError(flag, named(options) + " needs " + file.what);
    }
    if (file.kind != options.kind && !file.value.empty()) {
      throw SpecError(
          file.flag, named(options) + " does not read " + file.what + " (--tokenizer " + file.kind + " does); drop it");
    }
  }
  if (options.kind == "gpt2") return std::make_unique<Gpt2Tokenizer>(options.vocab_file, options.merge_file);
  if (options.kind == "hf") {
    try {
      return std::make_unique<HfTokenizer>(options.tokenizer_file);
    } catch (const SpecError& error) {
      if (hf_by_model && error.field() == "--tokenizer-file") throw SpecError("--tokenizer-model", error.rule());
      throw;
    }
  }
  if (options.kind == "sentencepiece") return std::make_unique<SentencePieceTokenizer>(options.tokenizer_model);
  return std::make_unique<ByteTokenizer>();
}

}  // namespace megaplan::exec
