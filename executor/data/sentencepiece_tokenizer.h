// SentencePiece models (Llama 2's and Mistral's tokenizer.model) through Debian's libsentencepiece:
// ids exactly as sentencepiece.SentencePieceProcessor().encode(text) gives them (the model's own
// normalizer and dummy prefix; no BOS or EOS added).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "executor/data/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace megaplan::exec {

// Contract: encode() is a pure function of the text and the model; safe to share between threads
// (libsentencepiece's Encode is const on a loaded model).
class SentencePieceTokenizer final : public Tokenizer {
 public:
  // Throws SpecError("--tokenizer-model", "<file>: ...") for a file that cannot be read or is not
  // a SentencePiece model.
  explicit SentencePieceTokenizer(const std::string& model_path);
  ~SentencePieceTokenizer() override;

  // Throws SpecError("--tokenizer-model", ...) if libsentencepiece refuses the text.
  std::vector<int64_t> encode(std::string_view text) const override;
  // The model's eos_id(); throws SpecError("--append-eod", ...) when the model has none.
  int64_t end_of_document() const override;
  // GetPieceSize().
  int64_t vocab_size() const override { return vocab_size_; }

 private:
  std::string model_path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  int64_t vocab_size_ = 0;
};

}  // namespace megaplan::exec
