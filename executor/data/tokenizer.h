// Tokenizers for `megaplan data prepare` and the trainer. Byte-level: every byte is its own token
// (0-255) and the end-of-document token is 256. GPT-2's byte-level BPE is in gpt2_tokenizer.h,
// Hugging Face's tokenizer.json in hf_tokenizer.h, SentencePiece in sentencepiece_tokenizer.h.
// Megatron-LM's --tokenizer-type names map onto these (resolve_tokenizer below).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace megaplan::exec {

// Contract: encode() is a pure function of the text; every implementation is safe to call from
// several threads at once (`data prepare --workers` does).
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int64_t> encode(std::string_view text) const = 0;
  // Throws SpecError("--append-eod", ...) where the tokenizer has no end-of-document token.
  virtual int64_t end_of_document() const = 0;
  virtual int64_t vocab_size() const = 0;
};

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int64_t> encode(std::string_view text) const override;
  int64_t end_of_document() const override { return 256; }
  int64_t vocab_size() const override { return 257; }
};

// What --tokenizer, --vocab-file, --merge-file, --tokenizer-file, --tokenizer-model and
// --tokenizer-type say.
struct TokenizerOptions {
  std::string kind = "byte";  // megaplan's name; empty: none given (the type's, else byte)
  std::string vocab_file;
  std::string merge_file;
  std::string tokenizer_file;
  std::string tokenizer_model;
  // Megatron-LM's --tokenizer-type (GPT2BPETokenizer, HuggingFaceTokenizer, ...); empty: none.
  std::string megatron_type = {};
};

// The options with --tokenizer-type read as megaplan's kind: GPT2BPETokenizer is gpt2,
// HuggingFaceTokenizer hf (its tokenizer.json given as Megatron gives it, by --tokenizer-model: the
// file, or a folder holding tokenizer.json), SentencePieceTokenizer, GPTSentencePieceTokenizer and
// Llama2Tokenizer sentencepiece. An empty kind becomes the type's, else byte. Throws
// SpecError("--tokenizer-type", ...) for any other Megatron name, naming the supported ones, and
// when --tokenizer names another kind; SpecError("--tokenizer-model", ...) when a
// HuggingFaceTokenizer gets its tokenizer.json from both --tokenizer-model and --tokenizer-file.
TokenizerOptions resolve_tokenizer(const TokenizerOptions& options);

// The file that holds a resolved tokenizer, for messages: its tokenizer.json, tokenizer.model or
// vocab.json; empty for the byte tokenizer.
std::string tokenizer_main_file(const TokenizerOptions& resolved);

// resolve_tokenizer's rule on the name alone: throws SpecError("--tokenizer-type", ...) unless
// `megatron_type` is a Megatron-LM tokenizer type megaplan builds.
void check_megatron_tokenizer_type(const std::string& megatron_type);

// The tokenizer resolve_tokenizer(options) names: "byte", "gpt2" (--vocab-file and --merge-file),
// "hf" (--tokenizer-file) or "sentencepiece" (--tokenizer-model). Throws SpecError("--tokenizer",
// ...) naming the known kinds; a file the kind needs and is not given, or one given that it does
// not read, is a SpecError naming the flag; file errors as each tokenizer's.
std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerOptions& options);

}  // namespace megaplan::exec
