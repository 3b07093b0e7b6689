// Hugging Face byte-level BPE tokenizers from their tokenizer.json (GPT-2's, Llama 3's, Qwen2's),
// ids as HF `tokenizers` gives them with encode(text, add_special_tokens=False):
//   1. added tokens (added_tokens: special tokens such as "<|endoftext|>") found in the text,
//      leftmost first and the longest at a position, are their ids; the text between them goes on;
//   2. the normalizer: none, or NFC (utf8proc);
//   3. the pre-tokenizer: ByteLevel with use_regex (GPT-2's pattern), or a Sequence of Split
//      {pattern: {Regex | String}, behavior: Isolated} ending in ByteLevel (use_regex false or
//      true), run by RegexPreTokenizer (pretokenizer.h);
//   4. BPE by merge rank in each piece (byte_pair_encoding.h); with ignore_merges (Llama 3) a
//      piece that is itself a vocabulary token is that token.
// Anything else a tokenizer.json may say that changes ids is refused naming the field, rather
// than tokenized differently from HF: another model type or normalizer, other pre-tokenizers,
// Split behaviors other than Isolated, ByteLevel's add_prefix_space, BPE dropout, subword
// prefixes or suffixes, byte_fallback, and added tokens with lstrip, rstrip or single_word.
// Differences left: added tokens are matched in the text before normalization (HF matches
// "normalized": true ones after it; with NFC this matters only for added tokens that NFC changes).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "executor/data/byte_pair_encoding.h"
#include "executor/data/pretokenizer.h"
#include "executor/data/tokenizer.h"

namespace megaplan::exec {

// Contract: encode() is a pure function of the text and the files; safe to share between threads.
class HfTokenizer final : public Tokenizer {
 public:
  // Reads tokenizer.json and, when there is one beside it, tokenizer_config.json (for eos_token).
  // Throws SpecError("--tokenizer-file", "<file>: <field>: ...") naming the field and the rule
  // broken (unreadable or malformed JSON, an unsupported model type, normalizer or pre-tokenizer,
  // a merge naming a token outside the vocabulary, ...).
  explicit HfTokenizer(const std::string& path);
  ~HfTokenizer() override;

  // Throws SpecError("--tokenizer-file", ...) when the text holds a byte without a token.
  std::vector<int64_t> encode(std::string_view text) const override;
  // The end-of-text id: tokenizer_config.json's eos_token where given, else the first added
  // token among "<|endoftext|>", "<|end_of_text|>" and "</s>". Throws SpecError("--append-eod",
  // ...) saying so when there is none.
  int64_t end_of_document() const override;
  // The largest id of the vocabulary and the added tokens, plus one.
  int64_t vocab_size() const override { return vocab_size_; }

 private:
  struct AddedToken {
    std::string content;
    int32_t id;
  };
  void read(const std::string& path);
  void read_end_of_document(const std::string& path);
  // Appends the ids of a stretch of text without added tokens.
  void encode_plain(std::string_view text, std::vector<int64_t>& out) const;

  std::string path_;
  bool nfc_ = false;
  std::unique_ptr<RegexPreTokenizer> pre_tokenizer_;
  std::unique_ptr<BytePairEncoder> encoder_;
  // Added tokens by their first byte, the longest first.
  std::vector<std::vector<AddedToken>> added_by_first_byte_;
  int64_t vocab_size_ = 0;
  int64_t end_of_document_ = -1;
  std::string end_of_document_problem_;
};

// NFC of `text` (utf8proc); stretches of invalid UTF-8 are kept byte for byte and the valid text
// between them is normalized on its own.
std::string nfc_normalize(std::string_view text);

}  // namespace megaplan::exec
