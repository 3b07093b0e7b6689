// The Unicode classes GPT-2's pre-tokenizer regex uses (\p{L}, \p{N}, \s), as generated range
// tables (unicode_classes.cc, from tools/generate_unicode_classes.py): no ICU, no regex engine.
#pragma once

namespace megaplan::exec::unicode {

// The Unicode version the tables were generated from, e.g. "14.0.0".
const char* unicode_version();

// \p{L}: general category Lu, Ll, Lt, Lm or Lo. Combining marks (Mn, Mc, Me) are not letters.
bool is_letter(char32_t code_point);

// \p{N}: general category Nd, Nl or No.
bool is_number(char32_t code_point);

// \s as the `regex` module matches it on str: the White_Space property (space, tab, line breaks,
// U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000).
bool is_whitespace(char32_t code_point);

}  // namespace megaplan::exec::unicode
