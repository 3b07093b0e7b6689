// The regex pre-tokenizer on PCRE2: pattern rewriting (\s as White_Space), JIT matching, and
// invalid UTF-8 taken byte by byte through a substitute character.
#include "executor/data/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdint>
#include <cstring>

#include "core/error.h"

namespace megaplan::exec {

const char* const kGpt2PreTokenizerPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

// The White_Space property as the body of a character class.
constexpr std::string_view kWhiteSpace =
    R"(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
// What an invalid byte is matched as: U+E000, a private-use character (general category Co, so
// not \p{L}, \p{N} or \s).
constexpr std::string_view kInvalidByteStandIn = "\xEE\x80\x80";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0) return "PCRE2 error " + std::to_string(code);
  return reinterpret_cast<const char*>(buffer);
}

// Rewrites \s and \S to the White_Space property (see the header). Other escapes pass through.
std::string rewrite_white_space(const std::string& pattern, const std::string& field, const std::string& where) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  std::size_t class_start = 0;  // where the class's members begin (after '[' or "[^")
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[++i];
      if (next == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (next == 'S') {
        if (in_class) {
          throw SpecError(field, where + ": \\S inside a character class is not supported in the pattern " + pattern);
        }
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += c;
        out += next;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      class_start = i + 1;
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const std::size_t close = pattern.find(":]", i + 2);
      if (close != std::string::npos) {
        out.append(pattern, i, close + 2 - i);
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']' && i != class_start) in_class = false;
    out += c;
  }
  return out;
}

std::size_t utf8_length(unsigned char lead) { return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4; }

// The length of the valid UTF-8 character at text[pos], or 0 when the byte there starts none.
// The second-byte bounds exclude overlong forms, surrogates and code points above U+10FFFF
// (table 3-7 of the Unicode standard).
std::size_t valid_character_length(std::string_view text, std::size_t pos) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[pos + i]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  unsigned char low = 0x80;
  unsigned char high = 0xBF;
  std::size_t length = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (text.size() - pos < length || byte(1) < low || byte(1) > high) return 0;
  for (std::size_t i = 2; i < length; ++i) {
    if ((byte(i) & 0xC0) != 0x80) return 0;
  }
  return length;
}

}  // namespace

std::size_t valid_utf8_prefix(std::string_view text) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    // Eight ASCII bytes at a time: most text is mostly ASCII.
    while (pos + 8 <= text.size()) {
      uint64_t word = 0;
      std::memcpy(&word, text.data() + pos, sizeof(word));
      if ((word & 0x8080808080808080ULL) != 0) break;
      pos += 8;
    }
    if (pos >= text.size()) break;
    const std::size_t length = valid_character_length(text, pos);
    if (length == 0) return pos;
    pos += length;
  }
  return text.size();
}

struct RegexPreTokenizer::Compiled {
  pcre2_code* code = nullptr;
  pcre2_code* anchored = nullptr;  // the same pattern compiled with PCRE2_ANCHORED
  bool jit = false;
  std::string field;
  std::string pattern;

  ~Compiled() {
    pcre2_code_free(code);
    pcre2_code_free(anchored);
  }

  int match(const pcre2_code* compiled, PCRE2_SPTR data, std::size_t size, std::size_t pos,
            pcre2_match_data* match_data) const {
    return jit ? pcre2_jit_match(compiled, data, size, pos, 0, match_data, nullptr)
               : pcre2_match(compiled, data, size, pos, PCRE2_NO_UTF_CHECK, match_data, nullptr);
  }

  // Appends the pieces of `subject` to `pieces`.
  void split(std::string_view subject, pcre2_match_data* match_data, std::vector<std::string_view>& pieces) const {
    const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data);
    std::size_t pos = 0;
    std::size_t gap_start = 0;
    while (pos < subject.size()) {
      // Most patterns match at every position, and an anchored match skips PCRE2's search for
      // a start; where it fails the unanchored search from the same position finds the next.
      int rc = match(anchored, data, subject.size(), pos, match_data);
      if (rc == PCRE2_ERROR_NOMATCH) rc = match(code, data, subject.size(), pos, match_data);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        throw SpecError(field, "the pre-tokenizer pattern " + pattern + " failed on the text: " + pcre2_message(rc));
      }
      const std::size_t start = ovector[0];
      const std::size_t end = ovector[1];
      if (start == end) {
        if (start >= subject.size()) break;
        pos = start + utf8_length(static_cast<unsigned char>(subject[start]));
        continue;
      }
      if (start > gap_start) pieces.push_back(subject.substr(gap_start, start - gap_start));
      pieces.push_back(subject.substr(start, end - start));
      gap_start = pos = end;
    }
    if (gap_start < subject.size()) pieces.push_back(subject.substr(gap_start));
  }
};

RegexPreTokenizer::RegexPreTokenizer(const std::vector<std::string>& patterns, const std::string& field,
                                     const std::string& where) {
  for (const std::string& pattern : patterns) {
    auto compiled = std::make_unique<Compiled>();
    compiled->field = field;
    compiled->pattern = pattern;
    const std::string rewritten = rewrite_white_space(pattern, field, where);
    int error = 0;
    PCRE2_SIZE offset = 0;
    compiled->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    if (compiled->code == nullptr) {
      throw SpecError(field, where + ": PCRE2 refuses the pattern " + pattern + ": " + pcre2_message(error) +
                                 " (at offset " + std::to_string(offset) + " of its rewritten form)");
    }
    compiled->anchored = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                                       PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &error, &offset, nullptr);
    if (compiled->anchored == nullptr) throw std::bad_alloc();  // compiled once already, so only memory fails
    // Without JIT support (some architectures) the interpreter gives the same matches, slower.
    compiled->jit = pcre2_jit_compile(compiled->code, PCRE2_JIT_COMPLETE) == 0 &&
                    pcre2_jit_compile(compiled->anchored, PCRE2_JIT_COMPLETE) == 0;
    patterns_.push_back(std::move(compiled));
  }
}

RegexPreTokenizer::~RegexPreTokenizer() = default;

std::vector<std::string_view> RegexPreTokenizer::split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  if (text.empty()) return pieces;
  if (patterns_.empty()) return {text};
  // Invalid UTF-8: split a copy with each invalid byte replaced by the stand-in, then map the
  // pieces back through `origin` (the text offset of each copy offset at a character start).
  std::string copy;
  std::vector<std::size_t> origin;
  std::string_view subject = text;
  if (valid_utf8_prefix(text) < text.size()) {
    copy.reserve(text.size() + 16);
    origin.reserve(text.size() + 16);
    for (std::size_t pos = 0; pos < text.size();) {
      const std::size_t length = valid_character_length(text, pos);
      const std::string_view character = length == 0 ? kInvalidByteStandIn : text.substr(pos, length);
      for (std::size_t i = 0; i < character.size(); ++i) origin.push_back(pos);
      copy += character;
      pos += length == 0 ? 1 : length;
    }
    origin.push_back(text.size());
    subject = copy;
  }
  pcre2_match_data* match_data = pcre2_match_data_create(1, nullptr);
  if (match_data == nullptr) throw std::bad_alloc();
  try {
    pieces.reserve(subject.size() / 4 + 1);
    patterns_.front()->split(subject, match_data, pieces);
    std::vector<std::string_view> next;
    for (std::size_t i = 1; i < patterns_.size(); ++i) {
      next.clear();
      next.reserve(pieces.size() + pieces.size() / 2);
      for (const std::string_view piece : pieces) patterns_[i]->split(piece, match_data, next);
      pieces.swap(next);
    }
  } catch (...) {
    pcre2_match_data_free(match_data);
    throw;
  }
  pcre2_match_data_free(match_data);
  if (!origin.empty()) {
    for (std::string_view& piece : pieces) {
      const auto start = static_cast<std::size_t>(piece.data() - copy.data());
      const std::size_t begin = origin[start];
      const std::size_t end = origin[start + piece.size()];
      piece = text.substr(begin, end - begin);
    }
  }
  return pieces;
}

}  // namespace megaplan::exec
