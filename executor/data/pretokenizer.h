// The regex pre-tokenizer of byte-level BPE tokenizers (GPT-2's, and Hugging Face's Split and
// ByteLevel pre-tokenizers), run by PCRE2's JIT with PCRE2_UTF | PCRE2_UCP.
//
// Why PCRE2 and not hand-written Unicode tables: the patterns come from tokenizer.json files
// (Llama 3's, Qwen2's, ...), so a fixed scanner per pattern does not scale, and PCRE2 (Debian's
// libpcre2-8, Unicode 14) is maintained. Measured on 8 MB of mixed text (docs/executor.md,
// "Tokenizers"), PCRE2's JIT splits GPT-2's pattern within a few percent of the scanner it
// replaced, and the whole GPT-2 encode is dominated by the piece cache and BPE either way.
//
// Semantics, where PCRE2 and the reference engines (Python's `regex` for GPT-2's encoder.py,
// Oniguruma for HF `tokenizers`) differ, are pinned to the references:
// - `\s` is the Unicode White_Space property (U+0009..U+000D, U+0020, U+0085, U+00A0, U+1680,
//   U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000), not PCRE2's \s, which also takes
//   U+180E; patterns are rewritten accordingly (`\S` likewise, outside character classes).
// - Invalid UTF-8 (a stray continuation byte, a truncated, overlong or surrogate sequence,
//   anything above U+10FFFF) is taken one byte at a time, each byte a character that is neither
//   letter, number nor space (it is matched as a private-use character would be), so it joins
//   punctuation runs. The references never see such text (they take decoded strings).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace megaplan::exec {

// GPT-2's pattern, also HF's ByteLevel pre-tokenizer's with use_regex.
extern const char* const kGpt2PreTokenizerPattern;

// Contract: split() is a pure function of the text; the pieces are non-empty views into it, in
// order, and concatenate back to it. Safe to share between threads.
class RegexPreTokenizer {
 public:
  // Each pattern splits every piece of the one before, as HF's Split with behavior "Isolated":
  // each match is a piece and so is each non-empty stretch between matches (empty matches are
  // skipped). Throws SpecError(field, where + ": ...") when PCRE2 refuses a pattern, quoting
  // PCRE2's message and the offset, or when a pattern uses \S inside a character class.
  RegexPreTokenizer(const std::vector<std::string>& patterns, const std::string& field, const std::string& where);
  ~RegexPreTokenizer();
  RegexPreTokenizer(const RegexPreTokenizer&) = delete;
  RegexPreTokenizer& operator=(const RegexPreTokenizer&) = delete;

  std::vector<std::string_view> split(std::string_view text) const;

 private:
  struct Compiled;
  std::vector<std::unique_ptr<Compiled>> patterns_;
};

// The length of the longest prefix of `text` that is valid UTF-8 (RFC 3629: no overlong forms,
// surrogates or code points above U+10FFFF): text.size() when all of it is.
std::size_t valid_utf8_prefix(std::string_view text);

}  // namespace megaplan::exec
