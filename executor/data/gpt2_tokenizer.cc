// GPT-2's byte-level BPE: the byte map, the pre-tokenizer as a hand-written scanner (std::regex
// has no \p{L}), vocab.json and merges.txt with errors naming file and line, BPE by merge rank.
#include "executor/data/gpt2_tokenizer.h"

#include <algorithm>
#include <climits>
#include <cstdio>

#include "core/error.h"
#include "core/json_io.h"
#include "core/text_file.h"
#include "executor/data/unicode_classes.h"

namespace megaplan::exec {

namespace {

// A piece cache larger than this is emptied rather than grown: distinct pieces in natural text
// number far fewer, so only adversarial input (random bytes) ever gets here.
constexpr std::size_t kMaxCachedPieces = std::size_t{1} << 20;
const char* const kEndOfText = "<|endoftext|>";

enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

// One character of the text: a decoded code point, or one byte of invalid UTF-8 (kOther).
struct Character {
  CharClass kind;
  uint8_t length;
};

CharClass classify(char32_t code_point) {
  if (code_point < 0x80) {
    // ASCII decides most of English text without a table search.
    if ((code_point | 0x20) >= 'a' && (code_point | 0x20) <= 'z') return CharClass::kLetter;
    if (code_point >= '0' && code_point <= '9') return CharClass::kNumber;
    if (code_point == ' ' || (code_point >= '\t' && code_point <= '\r')) return CharClass::kSpace;
    return CharClass::kOther;
  }
  if (unicode::is_letter(code_point)) return CharClass::kLetter;
  if (unicode::is_number(code_point)) return CharClass::kNumber;
  if (unicode::is_whitespace(code_point)) return CharClass::kSpace;
  return CharClass::kOther;
}

bool is_continuation(unsigned char byte) { return (byte & 0xC0) == 0x80; }

// Decodes the character starting at text[pos] (pos < text.size()). The second-byte bounds
// exclude overlong forms, surrogates and code points above U+10FFFF (RFC 3629, table 3-7 of
// the Unicode standard).
Character character_at(std::string_view text, std::size_t pos) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[pos + i]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return {classify(lead), 1};
  const std::size_t left = text.size() - pos;
  unsigned char low = 0x80;
  unsigned char high = 0xBF;
  std::size_t length = 0;
  char32_t code_point = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
    code_point = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    code_point = lead & 0x0F;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    code_point = lead & 0x07;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return {CharClass::kOther, 1};
  }
  if (left < length || byte(1) < low || byte(1) > high) return {CharClass::kOther, 1};
  for (std::size_t i = 1; i < length; ++i) {
    if (!is_continuation(byte(i))) return {CharClass::kOther, 1};
    code_point = (code_point << 6) | (byte(i) & 0x3F);
  }
  return {classify(code_point), static_cast<uint8_t>(length)};
}

// The end of the regex's match starting at `pos`, alternatives in the regex's order.
std::size_t match_end(std::string_view text, std::size_t pos) {
  const std::size_t size = text.size();
  // 's|'t|'re|'ve|'m|'ll|'d (case-sensitive, ASCII apostrophe only).
  if (text[pos] == '\'' && pos + 1 < size) {
    const char next = text[pos + 1];
    if (next == 's' || next == 't' || next == 'm' || next == 'd') return pos + 2;
    if (pos + 2 < size) {
      const std::string_view two = text.substr(pos + 1, 2);
      if (two == "re" || two == "ve" || two == "ll") return pos + 3;
    }
  }
  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional ' ' and then a run of one class;
  // the class of the first character after the optional space picks the alternative.
  std::size_t body = pos;
  Character first = character_at(text, pos);
  if (text[pos] == ' ' && pos + 1 < size) {
    const Character next = character_at(text, pos + 1);
    if (next.kind != CharClass::kSpace) {
      body = pos + 1;
      first = next;
    }
  }
  if (first.kind != CharClass::kSpace) {
    std::size_t end = body + first.length;
    while (end < size) {
      const Character next = character_at(text, end);
      if (next.kind != first.kind) break;
      end += next.length;
    }
    return end;
  }
  // '\s+(?!\S)' then '\s+': the whole whitespace run when the text ends with it; otherwise the
  // run less its last character, which then starts the next piece (" b" after "a  "), unless the
  // run is one character long and '\s+' takes it alone.
  std::size_t end = pos;
  std::size_t last_start = pos;
  while (end < size) {
    const Character next = character_at(text, end);
    if (next.kind != CharClass::kSpace) break;
    last_start = end;
    end += next.length;
  }
  if (end == size || last_start == pos) return end;
  return last_start;
}

void append_utf8(std::string& out, char32_t code_point) {
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xE0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code_point >> 18));
    out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
}

// The bytes a vocabulary token stands for, or false when a character of it is outside the byte
// map. Token strings come from parsed JSON, so they are valid UTF-8.
bool token_to_bytes(const std::string& token, std::string& bytes) {
  static const std::unordered_map<char32_t, unsigned char> byte_of = [] {
    std::unordered_map<char32_t, unsigned char> inverse;
    for (int byte = 0; byte < 256; ++byte) inverse[gpt2_byte_to_unicode()[byte]] = static_cast<unsigned char>(byte);
    return inverse;
  }();
  bytes.clear();
  for (std::size_t pos = 0; pos < token.size();) {
    const auto lead = static_cast<unsigned char>(token[pos]);
    const std::size_t length = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
    char32_t code_point = length == 1 ? lead : length == 2 ? lead & 0x1F : length == 3 ? lead & 0x0F : lead & 0x07;
    for (std::size_t i = 1; i < length && pos + i < token.size(); ++i) {
      code_point = (code_point << 6) | (static_cast<unsigned char>(token[pos + i]) & 0x3F);
    }
    const auto found = byte_of.find(code_point);
    if (found == byte_of.end()) return false;
    bytes += static_cast<char>(found->second);
    pos += length;
  }
  return true;
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// A token or line quoted for an error message, cut after about 60 bytes at a UTF-8 boundary.
std::string excerpt(std::string_view text) {
  std::size_t shown = std::min<std::size_t>(text.size(), 60);
  while (shown < text.size() && shown > 0 && is_continuation(static_cast<unsigned char>(text[shown]))) --shown;
  return "\"" + std::string(text.substr(0, shown)) + (shown < text.size() ? "...\"" : "\"");
}

}  // namespace

const std::array<char32_t, 256>& gpt2_byte_to_unicode() {
  static const std::array<char32_t, 256> map = [] {
    std::array<char32_t, 256> code_points{};
    char32_t next_unprintable = 256;
    for (int byte = 0; byte < 256; ++byte) {
      const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE);
      code_points[byte] = printable ? static_cast<char32_t>(byte) : next_unprintable++;
    }
    return code_points;
  }();
  return map;
}

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  for (std::size_t pos = 0; pos < text.size();) {
    const std::size_t end = match_end(text, pos);
    pieces.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return pieces;
}

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& vocab_path, const std::string& merges_path)
    : vocab_path_(vocab_path) {
  std::unordered_map<std::string, int32_t> ids;
  read_vocabulary(vocab_path, ids);
  read_merges(merges_path, ids);
}

void Gpt2Tokenizer::read_vocabulary(const std::string& vocab_path, std::unordered_map<std::string, int32_t>& ids) {
  nlohmann::json vocab;
  try {
    vocab = parse_json_text(read_text_file(vocab_path), vocab_path);
  } catch (const SpecError& error) {
    throw SpecError("--vocab-file", error.what());
  }
  if (!vocab.is_object() || vocab.empty()) {
    throw SpecError("--vocab-file", vocab_path + ": must be a non-empty JSON object of token -> id, got " +
                                        (vocab.is_object() ? std::string("{}") : std::string(vocab.type_name())));
  }
  // Ids must be exactly 0..size-1: the size is the vocabulary written into the dataset, so an id
  // at or above it would not fit the token type chosen for it.
  const auto size = static_cast<int64_t>(vocab.size());
  if (size > INT32_MAX) throw SpecError("--vocab-file", vocab_path + ": more than 2^31 tokens");
  std::vector<const std::string*> token_of(static_cast<std::size_t>(size), nullptr);
  token_bytes_.assign(static_cast<std::size_t>(size), std::string());
  decodable_.assign(static_cast<std::size_t>(size), false);
  ids.reserve(static_cast<std::size_t>(size));
  for (auto entry = vocab.begin(); entry != vocab.end(); ++entry) {
    const std::string& token = entry.key();
    const nlohmann::json& value = entry.value();
    int64_t id = -1;
    if (value.is_number_unsigned()) {
      id = value.get<uint64_t>() < static_cast<uint64_t>(size) ? static_cast<int64_t>(value.get<uint64_t>()) : size;
    } else if (value.is_number_integer()) {
      id = value.get<int64_t>();
    }
    if (id < 0 || id >= size) {
      throw SpecError("--vocab-file", vocab_path + ": " + excerpt(token) + ": id must be an integer in [0, " +
                                          std::to_string(size) + "), got " + value.dump());
    }
    if (token_of[id] != nullptr) {
      throw SpecError("--vocab-file", vocab_path + ": " + excerpt(*token_of[id]) + " and " + excerpt(token) +
                                          " share id " + std::to_string(id));
    }
    token_of[id] = &token;
    ids.emplace(token, static_cast<int32_t>(id));
    decodable_[id] = token_to_bytes(token, token_bytes_[id]);
  }
  const auto end_of_text = ids.find(kEndOfText);
  if (end_of_text == ids.end()) {
    throw SpecError("--vocab-file", vocab_path + ": no \"" + kEndOfText + "\" token to end documents with");
  }
  end_of_document_ = end_of_text->second;
  for (int byte = 0; byte < 256; ++byte) {
    std::string spelling;
    append_utf8(spelling, gpt2_byte_to_unicode()[byte]);
    const auto found = ids.find(spelling);
    byte_token_[byte] = found == ids.end() ? -1 : found->second;
  }
}

void Gpt2Tokenizer::read_merges(const std::string& merges_path, const std::unordered_map<std::string, int32_t>& ids) {
  std::string text;
  try {
    text = read_text_file(merges_path);
  } catch (const SpecError& error) {
    throw SpecError("--merge-file", error.what());
  }
  std::unordered_map<uint64_t, std::size_t> line_of_pair;
  std::size_t line_number = 0;
  int32_t rank = 0;
  for (std::size_t start = 0; start < text.size();) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + start, end - start);
    start = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_number == 1 && line.starts_with("#version"))) continue;
    const std::string where = merges_path + ":" + std::to_string(line_number);
    const std::size_t space = line.find(' ');
    if (space == 0 || space == std::string_view::npos || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos) {
      throw SpecError("--merge-file", where + ": want two tokens separated by one space, got " + excerpt(line));
    }
    const std::string left(line.substr(0, space));
    const std::string right(line.substr(space + 1));
    const auto id_of = [&](const std::string& token, const char* what) {
      const auto found = ids.find(token);
      if (found == ids.end()) {
        throw SpecError("--merge-file", where + ": " + what + " " + excerpt(token) + " is not in " + vocab_path_);
      }
      return found->second;
    };
    const int32_t left_id = id_of(left, "the left token");
    const int32_t right_id = id_of(right, "the right token");
    const int32_t merged_id = id_of(left + right, "the merged token");
    const uint64_t key = pair_key(left_id, right_id);
    const auto [previous, inserted] = line_of_pair.emplace(key, line_number);
    if (!inserted) {
      throw SpecError("--merge-file", where + ": repeats the merge " + excerpt(line) + " of line " +
                                          std::to_string(previous->second));
    }
    merges_.emplace(key, Merge{rank++, merged_id});
  }
}

// As encoder.py's bpe(): find the adjacent pair with the lowest merge rank, merge every
// occurrence of it left to right without overlap, repeat until no pair has a rank.
std::vector<int32_t> Gpt2Tokenizer::byte_pair_encode(std::string_view piece) const {
  std::vector<int32_t> symbols;
  symbols.reserve(piece.size());
  for (const char raw : piece) {
    const auto byte = static_cast<unsigned char>(raw);
    if (byte_token_[byte] < 0) {
      std::string spelling;
      append_utf8(spelling, gpt2_byte_to_unicode()[byte]);
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02X", byte);
      throw SpecError("--vocab-file", vocab_path_ + ": no token \"" + spelling + "\" for byte " + hex +
                                          ", which the text holds");
    }
    symbols.push_back(byte_token_[byte]);
  }
  while (symbols.size() > 1) {
    const Merge* best = nullptr;
    int32_t best_left = 0;
    int32_t best_right = 0;
    for (std::size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto found = merges_.find(pair_key(symbols[i], symbols[i + 1]));
      if (found != merges_.end() && (best == nullptr || found->second.rank < best->rank)) {
        best = &found->second;
        best_left = symbols[i];
        best_right = symbols[i + 1];
      }
    }
    if (best == nullptr) break;
    std::size_t kept = 0;
    for (std::size_t i = 0; i < symbols.size();) {
      if (i + 1 < symbols.size() && symbols[i] == best_left && symbols[i + 1] == best_right) {
        symbols[kept++] = best->merged;
        i += 2;
      } else {
        symbols[kept++] = symbols[i++];
      }
    }
    symbols.resize(kept);
  }
  return symbols;
}

std::vector<int64_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<int64_t> tokens;
  tokens.reserve(text.size() / 3);
  const std::lock_guard<std::mutex> lock(cache_mutex_);
  for (const std::string_view piece : gpt2_pretokenize(text)) {
    auto found = cache_.find(piece);
    if (found == cache_.end()) {
      std::vector<int32_t> ids = byte_pair_encode(piece);
      if (cache_.size() >= kMaxCachedPieces) cache_.clear();
      found = cache_.emplace(std::string(piece), std::move(ids)).first;
    }
    tokens.insert(tokens.end(), found->second.begin(), found->second.end());
  }
  return tokens;
}

std::string Gpt2Tokenizer::decode(const std::vector<int64_t>& tokens) const {
  std::string text;
  for (const int64_t id : tokens) {
    if (id < 0 || id >= vocab_size()) {
      throw SpecError("--vocab-file", vocab_path_ + ": token id " + std::to_string(id) +
                                          " is outside the vocabulary of " + std::to_string(vocab_size()));
    }
    if (!decodable_[id]) {
      throw SpecError("--vocab-file", vocab_path_ + ": token " + std::to_string(id) +
                                          " is spelled with characters outside GPT-2's byte map");
    }
    text += token_bytes_[id];
  }
  return text;
}

}  // namespace megaplan::exec
