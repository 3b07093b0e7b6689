// GPT-2's byte-level BPE: vocab.json and merges.txt with errors naming file and line; the
// pre-tokenizer (pretokenizer.h) and BPE by merge rank (byte_pair_encoding.h) are shared with HF's.
#include "executor/data/gpt2_tokenizer.h"

#include <climits>
#include <cstdio>

#include "core/error.h"
#include "core/json_io.h"
#include "core/text_file.h"
#include "executor/data/pretokenizer.h"

namespace megaplan::exec {

namespace {

const char* const kEndOfText = "<|endoftext|>";

}  // namespace

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  static const RegexPreTokenizer pre_tokenizer({kGpt2PreTokenizerPattern}, "--tokenizer", "GPT-2's pattern");
  return pre_tokenizer.split(text);
}

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& vocab_path, const std::string& merges_path)
    : vocab_path_(vocab_path), encoder_("--vocab-file", vocab_path) {
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
      throw SpecError("--vocab-file", vocab_path + ": " + quoted_excerpt(token) + ": id must be an integer in [0, " +
                                          std::to_string(size) + "), got " + value.dump());
    }
    if (token_of[id] != nullptr) {
      throw SpecError("--vocab-file", vocab_path + ": " + quoted_excerpt(*token_of[id]) + " and " +
                                          quoted_excerpt(token) + " share id " + std::to_string(id));
    }
    token_of[id] = &token;
    ids.emplace(token, static_cast<int32_t>(id));
    decodable_[id] = byte_level_token_bytes(token, token_bytes_[id]);
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
    if (found != ids.end()) encoder_.set_byte_token(static_cast<unsigned char>(byte), found->second);
  }
}

void Gpt2Tokenizer::read_merges(const std::string& merges_path, const std::unordered_map<std::string, int32_t>& ids) {
  std::string text;
  try {
    text = read_text_file(merges_path);
  } catch (const SpecError& error) {
    throw SpecError("--merge-file", error.what());
  }
  std::unordered_map<std::string, std::size_t> line_of_merge;
  std::size_t line_number = 0;
  for (std::size_t start = 0; start < text.size();) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + start, end - start);
    start = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_number == 1 && line.starts_with("#version"))) continue;
    const std::string where = merges_path + ":" + std::to_string(line_number);
    std::string left, right;
    if (!split_merge(line, left, right)) {
      throw SpecError("--merge-file", where + ": want two tokens separated by one space, got " + quoted_excerpt(line));
    }
    const auto [previous, inserted] = line_of_merge.emplace(std::string(line), line_number);
    if (!inserted || !encoder_.add_merge(left, right, ids, "--merge-file", where, vocab_path_)) {
      throw SpecError("--merge-file", where + ": repeats the merge " + quoted_excerpt(line) + " of line " +
                                          std::to_string(previous->second));
    }
  }
}

std::vector<int64_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<int64_t> tokens;
  tokens.reserve(text.size() / 3);
  encoder_.encode(gpt2_pretokenize(text), tokens);
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
