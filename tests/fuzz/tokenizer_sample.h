// The text the tokenizer targets encode with the tokenizer their input builds: letters, digits,
// contractions, runs of spaces, a tab and newlines, accents and an emoji, invalid UTF-8 and a
// special token, so that every pre-tokenizer branch and the byte fallback see some of it.
#pragma once

#include <string_view>

namespace megaplan::fuzz {

inline constexpr std::string_view kTokenizerSample =
    "hello the world! It's 2024:  we'll see.\tnaïve café ☕ x\xff\xc3(<|endoftext|>)\n\n  12345 ___";

}  // namespace megaplan::fuzz
