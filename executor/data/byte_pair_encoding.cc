#include "executor/data/byte_pair_encoding.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdio>

#include "core/error.h"

namespace megaplan::exec {

namespace {

// A piece cache larger than this is emptied rather than grown: distinct pieces in natural text
// number far fewer, so only adversarial input (random bytes) ever gets here.
constexpr std::size_t kMaxCachedPieces = std::size_t{1} << 20;

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
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

void append_utf8(std::string& out, char32_t code_point) {
  utf8proc_uint8_t bytes[4];
  const utf8proc_ssize_t length = utf8proc_encode_char(static_cast<utf8proc_int32_t>(code_point), bytes);
  out.append(reinterpret_cast<const char*>(bytes), static_cast<std::size_t>(length));
}

bool byte_level_token_bytes(std::string_view token, std::string& bytes) {
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

std::string quoted_excerpt(std::string_view text) {
  std::size_t shown = std::min<std::size_t>(text.size(), 60);
  while (shown < text.size() && shown > 0 && (static_cast<unsigned char>(text[shown]) & 0xC0) == 0x80) --shown;
  return "\"" + std::string(text.substr(0, shown)) + (shown < text.size() ? "...\"" : "\"");
}

BytePairEncoder::BytePairEncoder(std::string field, std::string source)
    : field_(std::move(field)), source_(std::move(source)) {
  byte_token_.fill(-1);
}

bool split_merge(std::string_view merge, std::string& left, std::string& right) {
  const std::size_t space = merge.find(' ');
  if (space == 0 || space == std::string_view::npos || space + 1 == merge.size() ||
      merge.find(' ', space + 1) != std::string_view::npos) {
    return false;
  }
  left = merge.substr(0, space);
  right = merge.substr(space + 1);
  return true;
}

bool BytePairEncoder::add_merge(const std::string& left, const std::string& right,
                                const std::unordered_map<std::string, int32_t>& ids, const std::string& field,
                                const std::string& where, const std::string& vocabulary) {
  const auto id_of = [&](const std::string& token, const char* what) {
    const auto found = ids.find(token);
    if (found == ids.end()) {
      throw SpecError(field, where + ": " + what + " " + quoted_excerpt(token) + " is not in " + vocabulary);
    }
    return found->second;
  };
  const int32_t left_id = id_of(left, "the left token");
  const int32_t right_id = id_of(right, "the right token");
  const int32_t merged_id = id_of(left + right, "the merged token");
  const auto rank = static_cast<int32_t>(merges_.size());
  return merges_.emplace(pair_key(left_id, right_id), Merge{rank, merged_id}).second;
}

std::vector<int32_t> BytePairEncoder::encode_piece(std::string_view piece) const {
  if (!whole_piece_tokens_.empty()) {
    const auto whole = whole_piece_tokens_.find(piece);
    if (whole != whole_piece_tokens_.end()) return {whole->second};
  }
  std::vector<int32_t> symbols;
  symbols.reserve(piece.size());
  for (const char raw : piece) {
    const auto byte = static_cast<unsigned char>(raw);
    if (byte_token_[byte] < 0) {
      std::string spelling;
      append_utf8(spelling, gpt2_byte_to_unicode()[byte]);
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02X", byte);
      throw SpecError(field_, source_ + ": no token \"" + spelling + "\" for byte " + hex + ", which the text holds");
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

void BytePairEncoder::encode(const std::vector<std::string_view>& pieces, std::vector<int64_t>& out) const {
  for (const std::string_view piece : pieces) {
    CacheShard& shard = cache_[PieceHash{}(piece) % kCacheShards];
    {
      const std::lock_guard<std::mutex> lock(shard.mutex);
      const auto found = shard.pieces.find(piece);
      if (found != shard.pieces.end()) {
        out.insert(out.end(), found->second.begin(), found->second.end());
        continue;
      }
    }
    // Merged outside the lock: another thread may store the same piece meanwhile, with the same ids.
    std::vector<int32_t> ids = encode_piece(piece);
    out.insert(out.end(), ids.begin(), ids.end());
    const std::lock_guard<std::mutex> lock(shard.mutex);
    if (shard.pieces.size() >= kMaxCachedPieces / kCacheShards) shard.pieces.clear();
    shard.pieces.emplace(std::string(piece), std::move(ids));
  }
}

}  // namespace megaplan::exec
