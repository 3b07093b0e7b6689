// Tokenizers for `megaplan data prepare` and the trainer. Byte-level: every byte is its own token
// (0-255) and the end-of-document token is 256. GPT-2's byte-level BPE is in gpt2_tokenizer.h,
// Hugging Face's tokenizer.json in hf_tokenizer.h, SentencePiece in sentencepiece_tokenizer.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace megaplan::exec {

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

// What --tokenizer, --vocab-file, --merge-file, --tokenizer-file and --tokenizer-model say.
struct TokenizerOptions {
  std::string kind = "byte";
  std::string vocab_file;
  std::string merge_file;
  std::string tokenizer_file;
  std::string tokenizer_model;
};

// "byte", "gpt2" (--vocab-file and --merge-file), "hf" (--tokenizer-file) or "sentencepiece"
// (--tokenizer-model). Throws SpecError("--tokenizer", ...) naming the known kinds; a file the
// kind needs and is not given, or one given that it does not read, is a SpecError naming the
// flag; file errors as each tokenizer's.
std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerOptions& options);

}  // namespace megaplan::exec
