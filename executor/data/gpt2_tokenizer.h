// GPT-2's byte-level BPE, token for token what OpenAI's encoder.py (and Megatron's copy of it)
// produces from the same vocab.json and merges.txt: bytes mapped to printable code points, the
// pre-tokenizer regex, then BPE by merge rank inside each piece.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "executor/data/byte_pair_encoding.h"
#include "executor/data/tokenizer.h"

namespace megaplan::exec {

// GPT-2's pre-tokenizer: splits `text` where the regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// finds its matches (leftmost alternative first, as Python's `regex` module runs it), run by
// RegexPreTokenizer (pretokenizer.h: PCRE2, \s as White_Space). The pieces are views into `text`
// and concatenate back to it. Invalid UTF-8 (a stray continuation byte, a truncated, overlong or
// surrogate sequence, anything above U+10FFFF) is taken one byte at a time, each byte a character
// that is neither letter, number nor space, so it joins punctuation runs; BPE then sees its byte
// like any other.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

// Contract: encode() is a pure function of the text and the two files (the cache of encoded
// pieces only saves time); decode(encode(text)) == text for any bytes. "<|endoftext|>" inside
// the text is ordinary text, as in encoder.py; end_of_document() is its id, appended by prepare.
// Safe to share between threads (the cache is locked).
class Gpt2Tokenizer final : public Tokenizer {
 public:
  // Reads vocab.json (a JSON object: token -> id, the ids exactly 0..size-1) and merges.txt (an
  // optional first line "#version...", then one merge "left right" per line, best first; every
  // left, right and left+right must be vocabulary tokens). Throws SpecError("--vocab-file" or
  // "--merge-file", "<file>[:<line>[:<column>]]: ...") naming the broken line or entry, and when
  // the vocabulary has no "<|endoftext|>".
  Gpt2Tokenizer(const std::string& vocab_path, const std::string& merges_path);

  // Throws SpecError("--vocab-file", ...) when the text needs a byte whose single-character
  // token the vocabulary lacks.
  std::vector<int64_t> encode(std::string_view text) const override;
  // Throws SpecError("--vocab-file", ...) for an id outside [0, vocab_size()) or a token spelled
  // with a character outside the byte map (a special token such as "<|endoftext|>" decodes to
  // its own characters, which the map holds).
  std::string decode(const std::vector<int64_t>& tokens) const;
  int64_t end_of_document() const override { return end_of_document_; }
  int64_t vocab_size() const override { return static_cast<int64_t>(token_bytes_.size()); }

 private:
  void read_vocabulary(const std::string& vocab_path, std::unordered_map<std::string, int32_t>& ids);
  void read_merges(const std::string& merges_path, const std::unordered_map<std::string, int32_t>& ids);

  std::string vocab_path_;
  // The bytes each token decodes to; `decodable_[id]` is false where the spelling leaves the map.
  std::vector<std::string> token_bytes_;
  std::vector<bool> decodable_;
  int64_t end_of_document_ = -1;
  BytePairEncoder encoder_;
};

}  // namespace megaplan::exec
