// Byte-level BPE inside one pre-tokenizer piece, shared by GPT-2's tokenizer (vocab.json and
// merges.txt) and Hugging Face's (tokenizer.json): each byte starts as its one-character token,
// then the adjacent pair with the lowest merge rank is merged, every occurrence left to right
// without overlap, until no pair has a rank (encoder.py's bpe(); HF's BPE model gives the same
// ids for merges where a merged token ranks after its parts, as every trained merge list does).
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace megaplan::exec {

// GPT-2's reversible byte -> code point map: the printable bytes '!'..'~', U+00A1..U+00AC and
// U+00AE..U+00FF stand for themselves; the other 68 bytes, in byte order, take U+0100 onwards
// (so ' ' is U+0120 'Ġ' and '\n' is U+010A 'Ċ'). Byte-level vocabularies (vocab.json, the vocab of
// a byte-level tokenizer.json) spell every token in these code points.
const std::array<char32_t, 256>& gpt2_byte_to_unicode();

// `code_point` as UTF-8.
void append_utf8(std::string& out, char32_t code_point);

// The bytes a byte-level token stands for, or false when a character of it is outside the byte
// map (special tokens such as "<|endoftext|>" are inside it). REQUIRES: `token` is valid UTF-8.
bool byte_level_token_bytes(std::string_view token, std::string& bytes);

// A token or line quoted for an error message, cut after about 60 bytes at a UTF-8 boundary.
std::string quoted_excerpt(std::string_view text);

// A merge as merges.txt and tokenizer.json spell it, "left right": its two tokens, split at its one
// space. False, setting nothing, when `merge` is not two non-empty tokens separated by one space.
bool split_merge(std::string_view merge, std::string& left, std::string& right);

// Contract: encode() is a pure function of the pieces and what was set (the cache of encoded
// pieces only saves time). Safe to share between threads once set up: the cache is split into
// shards, each locked only while one piece is looked up or stored, so that threads encoding at
// once (data prepare --workers) seldom wait on each other.
class BytePairEncoder {
 public:
  // `field` and `source` name the flag and the file in errors.
  BytePairEncoder(std::string field, std::string source);

  // The id of the one-character token of `byte`; a byte without one is refused by encode().
  void set_byte_token(unsigned char byte, int32_t id) { byte_token_[byte] = id; }
  // Gives the pair of the tokens spelled `left` and `right` the next rank, merging into the token
  // spelled left + right, the three ids looked up in `ids`. Throws SpecError(field, where + ": the
  // left token \"x\" is not in " + vocabulary) for a token `ids` lacks; returns false, changing
  // nothing, when the pair has a rank already.
  bool add_merge(const std::string& left, const std::string& right, const std::unordered_map<std::string, int32_t>& ids,
                 const std::string& field, const std::string& where, const std::string& vocabulary);
  // HF's ignore_merges: a piece whose bytes are a token is that token, whatever the merges say.
  // Keyed by the token's bytes (not its byte-map spelling).
  void set_whole_piece_tokens(const std::unordered_map<std::string, int32_t>& tokens) {
    whole_piece_tokens_.insert(tokens.begin(), tokens.end());
  }

  // Appends the ids of each piece to `out`. Throws SpecError(field, source + ": no token ... for
  // byte 0x..") when a piece holds a byte without a token.
  void encode(const std::vector<std::string_view>& pieces, std::vector<int64_t>& out) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  struct PieceHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view piece) const { return std::hash<std::string_view>()(piece); }
  };
  using PieceCache = std::unordered_map<std::string, std::vector<int32_t>, PieceHash, std::equal_to<>>;

  std::vector<int32_t> encode_piece(std::string_view piece) const;

  std::string field_;
  std::string source_;
  std::array<int32_t, 256> byte_token_;
  // Keyed by (left id << 32 | right id).
  std::unordered_map<uint64_t, Merge> merges_;
  std::unordered_map<std::string, int32_t, PieceHash, std::equal_to<>> whole_piece_tokens_;

  struct CacheShard {
    std::mutex mutex;
    PieceCache pieces;
  };
  static constexpr std::size_t kCacheShards = 64;
  mutable std::array<CacheShard, kCacheShards> cache_;
};

}  // namespace megaplan::exec
