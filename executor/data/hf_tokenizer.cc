// Hugging Face byte-level BPE: tokenizer.json read field by field, with a refusal naming the
// field for anything that would change ids and is not implemented.
#include "executor/data/hf_tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <unordered_map>

#include "core/error.h"
#include "core/json_io.h"
#include "core/text_file.h"

namespace megaplan::exec {

namespace {

const char* const kFileFlag = "--tokenizer-file";
const char* const kEndOfTextNames[] = {"<|endoftext|>", "<|end_of_text|>", "</s>"};

// "null", "\"Unigram\"", "an object": how a JSON value is named in a refusal.
std::string shown(const nlohmann::json& value) {
  if (value.is_string()) return quoted_excerpt(value.get<std::string>());
  if (value.is_object() || value.is_array()) return std::string("a JSON ") + value.type_name();
  return value.dump();
}

// The type of a normalizer or pre-tokenizer object, or "" when it has none.
std::string type_of(const nlohmann::json& component) {
  if (!component.is_object() || !component.contains("type") || !component["type"].is_string()) return "";
  return component["type"].get<std::string>();
}

// A regex matching `literal` itself (Split's {"String": ...} pattern): ASCII punctuation escaped.
std::string escape_literal(const std::string& literal) {
  std::string pattern;
  for (const char c : literal) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x80 && !std::isalnum(byte) && c != ' ') pattern += '\\';
    pattern += c;
  }
  return pattern;
}

void append_nfc(std::string_view valid, std::string& out) {
  utf8proc_uint8_t* normalized = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(valid.data()), static_cast<utf8proc_ssize_t>(valid.size()),
                   &normalized, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (length < 0) {
    // Only memory can fail here: the stretch is valid UTF-8.
    throw std::bad_alloc();
  }
  out.append(reinterpret_cast<const char*>(normalized), static_cast<std::size_t>(length));
  std::free(normalized);
}

}  // namespace

std::string nfc_normalize(std::string_view text) {
  // Text made of code points below U+0300 (no byte from 0xCC up) is NFC already: nothing there
  // decomposes and nothing composes with it.
  if (std::none_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) >= 0xCC; })) {
    return std::string(text);
  }
  std::string out;
  out.reserve(text.size());
  while (!text.empty()) {
    const std::size_t valid = valid_utf8_prefix(text);
    if (valid > 0) append_nfc(text.substr(0, valid), out);
    if (valid < text.size()) out += text[valid];  // one invalid byte, kept as it is
    text.remove_prefix(std::min(text.size(), valid + 1));
  }
  return out;
}

HfTokenizer::HfTokenizer(const std::string& path) : path_(path), added_by_first_byte_(256) {
  read(path);
  read_end_of_document(path);
}

HfTokenizer::~HfTokenizer() = default;

void HfTokenizer::read(const std::string& path) {
  const auto fail = [&](const std::string& field, const std::string& rule) {
    return SpecError(kFileFlag, path + ": " + field + ": " + rule);
  };
  nlohmann::json root;
  try {
    root = parse_json_text(read_text_file(path), path);
  } catch (const SpecError& error) {
    throw SpecError(kFileFlag, error.what());
  }
  if (!root.is_object())
    throw SpecError(kFileFlag, path + ": must be a JSON object (a tokenizer.json), got " + shown(root));

  // The model: byte-level BPE.
  if (!root.contains("model") || !root["model"].is_object()) throw fail("model", "must be an object");
  const nlohmann::json& model = root["model"];
  if (type_of(model) != "BPE") {
    throw fail("model.type",
               "must be \"BPE\" (byte-level BPE; use --tokenizer sentencepiece for SentencePiece "
               "models), got " +
                   shown(model.value("type", nlohmann::json())));
  }
  // A true/false field, false when absent or null.
  const auto flag = [&](const nlohmann::json& object, const char* key, const std::string& field) {
    if (!object.contains(key) || object[key].is_null()) return false;
    if (!object[key].is_boolean()) throw fail(field, "must be true or false, got " + shown(object[key]));
    return object[key].get<bool>();
  };
  const auto refuse_set = [&](const char* key, const std::string& rule) {
    if (!model.contains(key)) return;
    const nlohmann::json& value = model[key];
    if (value.is_null() || value == false || (value.is_string() && value.get<std::string>().empty())) return;
    throw fail(std::string("model.") + key, rule + ", got " + shown(value));
  };
  refuse_set("dropout", "BPE dropout is not supported (ids would be random); must be null");
  refuse_set("continuing_subword_prefix", "is not supported by byte-level BPE here; must be null");
  refuse_set("end_of_word_suffix", "is not supported by byte-level BPE here; must be null");
  refuse_set("byte_fallback", "is not supported (byte-level BPE has a token for every byte); must be false");
  const bool ignore_merges = flag(model, "ignore_merges", "model.ignore_merges");

  if (!model.contains("vocab") || !model["vocab"].is_object() || model["vocab"].empty()) {
    throw fail("model.vocab", "must be a non-empty object of token -> id");
  }
  std::unordered_map<std::string, int32_t> ids;
  std::unordered_map<int64_t, std::string> token_of_id;
  std::unordered_map<std::string, int32_t> whole_tokens;  // by bytes, for ignore_merges
  encoder_ = std::make_unique<BytePairEncoder>(kFileFlag, path);
  int64_t largest_id = -1;
  const auto read_id = [&](const nlohmann::json& value, const std::string& field) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > INT32_MAX) {
      throw fail(field, "id must be an integer in [0, 2^31), got " + shown(value));
    }
    return static_cast<int32_t>(value.get<int64_t>());
  };
  for (auto entry = model["vocab"].begin(); entry != model["vocab"].end(); ++entry) {
    const std::string& token = entry.key();
    const int32_t id = read_id(entry.value(), "model.vocab." + quoted_excerpt(token));
    const auto [previous, inserted] = token_of_id.emplace(id, token);
    if (!inserted) {
      throw fail("model.vocab", quoted_excerpt(previous->second) + " and " + quoted_excerpt(token) + " share id " +
                                    std::to_string(id));
    }
    ids.emplace(token, id);
    largest_id = std::max<int64_t>(largest_id, id);
    std::string bytes;
    if (byte_level_token_bytes(token, bytes)) {
      if (bytes.size() == 1) encoder_->set_byte_token(static_cast<unsigned char>(bytes[0]), id);
      if (ignore_merges) whole_tokens.emplace(bytes, id);
    }
  }
  if (ignore_merges) encoder_->set_whole_piece_tokens(whole_tokens);

  if (!model.contains("merges") || !model["merges"].is_array()) {
    throw fail("model.merges", "must be an array of merges (\"left right\" strings or [\"left\", \"right\"] pairs)");
  }
  const nlohmann::json& merges = model["merges"];
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const nlohmann::json& merge = merges[rank];
    const std::string field = "model.merges[" + std::to_string(rank) + "]";
    std::string left;
    std::string right;
    if (merge.is_string()) {
      const std::string line = merge.get<std::string>();
      if (!split_merge(line, left, right)) {
        throw fail(field, "want two tokens separated by one space, got " + quoted_excerpt(line));
      }
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      throw fail(field, "want a \"left right\" string or a [\"left\", \"right\"] pair, got " + shown(merge));
    }
    if (!encoder_->add_merge(left, right, ids, kFileFlag, path + ": " + field, "model.vocab")) {
      throw fail(field, "repeats the merge " + quoted_excerpt(left + " " + right));
    }
  }

  // The normalizer: none or NFC.
  const auto normalizer_rule = "is not supported (supported: null, NFC, or a Sequence of NFC)";
  if (root.contains("normalizer") && !root["normalizer"].is_null()) {
    const nlohmann::json& normalizer = root["normalizer"];
    const std::string type = type_of(normalizer);
    if (type == "NFC") {
      nfc_ = true;
    } else if (type == "Sequence" && normalizer.contains("normalizers") && normalizer["normalizers"].is_array()) {
      for (const nlohmann::json& step : normalizer["normalizers"]) {
        if (type_of(step) != "NFC")
          throw fail("normalizer", "\"" + type_of(step) + "\" in a Sequence " + normalizer_rule);
        nfc_ = true;
      }
    } else {
      throw fail("normalizer", (type.empty() ? shown(normalizer) : "\"" + type + "\"") + " " + normalizer_rule);
    }
  }

  // The pre-tokenizer: Splits then ByteLevel, or ByteLevel alone.
  const auto pre_tokenizer_rule = "must be ByteLevel, or a Sequence of Split (behavior Isolated) ending in ByteLevel";
  if (!root.contains("pre_tokenizer") || root["pre_tokenizer"].is_null()) {
    throw fail("pre_tokenizer", std::string(pre_tokenizer_rule) + ", got null");
  }
  std::vector<nlohmann::json> steps;
  const nlohmann::json& pre_tokenizer = root["pre_tokenizer"];
  const bool sequence = type_of(pre_tokenizer) == "Sequence";
  if (sequence) {
    if (!pre_tokenizer.contains("pretokenizers") || !pre_tokenizer["pretokenizers"].is_array()) {
      throw fail("pre_tokenizer.pretokenizers", "must be an array");
    }
    for (const nlohmann::json& step : pre_tokenizer["pretokenizers"]) steps.push_back(step);
  } else {
    steps.push_back(pre_tokenizer);
  }
  std::vector<std::string> patterns;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const nlohmann::json& step = steps[i];
    const std::string type = type_of(step);
    const std::string field = sequence ? "pre_tokenizer.pretokenizers[" + std::to_string(i) + "]" : "pre_tokenizer";
    if (type == "ByteLevel") {
      if (i + 1 != steps.size()) throw fail(field, std::string("ByteLevel must come last: ") + pre_tokenizer_rule);
      if (flag(step, "add_prefix_space", field + ".add_prefix_space")) {
        throw fail(field + ".add_prefix_space", "true is not supported; must be false");
      }
      // use_regex defaults to true.
      if (!step.contains("use_regex") || step["use_regex"].is_null() || flag(step, "use_regex", field + ".use_regex")) {
        patterns.push_back(kGpt2PreTokenizerPattern);
      }
      if (patterns.empty()) throw fail(field, "ByteLevel without use_regex needs a Split before it");
      continue;
    }
    if (type != "Split") {
      throw fail(field, "\"" + (type.empty() ? shown(step) : type) + "\" is not supported: " + pre_tokenizer_rule);
    }
    if (step.value("behavior", nlohmann::json()) != "Isolated") {
      throw fail(field + ".behavior", "must be \"Isolated\", got " + shown(step.value("behavior", nlohmann::json())));
    }
    if (flag(step, "invert", field + ".invert")) throw fail(field + ".invert", "true is not supported; must be false");
    const nlohmann::json pattern = step.value("pattern", nlohmann::json());
    if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
      patterns.push_back(pattern["Regex"].get<std::string>());
    } else if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
      patterns.push_back(escape_literal(pattern["String"].get<std::string>()));
    } else {
      throw fail(field + ".pattern", "must be {\"Regex\": \"...\"} or {\"String\": \"...\"}, got " + shown(pattern));
    }
  }
  if (steps.empty() || type_of(steps.back()) != "ByteLevel") throw fail("pre_tokenizer", pre_tokenizer_rule);
  pre_tokenizer_ = std::make_unique<RegexPreTokenizer>(patterns, kFileFlag, path + ": pre_tokenizer");

  // Added tokens.
  if (root.contains("added_tokens") && !root["added_tokens"].is_null()) {
    const nlohmann::json& added = root["added_tokens"];
    if (!added.is_array()) throw fail("added_tokens", "must be an array");
    for (std::size_t i = 0; i < added.size(); ++i) {
      const nlohmann::json& token = added[i];
      const std::string field = "added_tokens[" + std::to_string(i) + "]";
      if (!token.is_object() || !token.contains("content") || !token["content"].is_string() ||
          token["content"].get<std::string>().empty() || !token.contains("id")) {
        throw fail(field, "must be an object with a non-empty \"content\" and an \"id\"");
      }
      const std::string content = token["content"].get<std::string>();
      const int32_t id = read_id(token["id"], field + ".id");
      for (const char* option : {"lstrip", "rstrip", "single_word"}) {
        if (flag(token, option, field + "." + option)) {
          throw fail(field + "." + option, quoted_excerpt(content) + ": true is not supported; must be false");
        }
      }
      largest_id = std::max<int64_t>(largest_id, id);
      added_by_first_byte_[static_cast<unsigned char>(content[0])].push_back(AddedToken{content, id});
    }
    for (auto& tokens : added_by_first_byte_) {
      std::stable_sort(tokens.begin(), tokens.end(),
                       [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
    }
  }
  vocab_size_ = largest_id + 1;
}

void HfTokenizer::read_end_of_document(const std::string& path) {
  const auto id_of = [&](const std::string& content) -> int64_t {
    for (const AddedToken& token : added_by_first_byte_[static_cast<unsigned char>(content[0])]) {
      if (token.content == content) return token.id;
    }
    return -1;
  };
  const std::filesystem::path config_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  std::error_code error;
  if (std::filesystem::exists(config_path, error)) {
    nlohmann::json config;
    try {
      config = parse_json_text(read_text_file(config_path.string()), config_path.string());
    } catch (const SpecError& problem) {
      throw SpecError(kFileFlag, problem.what());
    }
    nlohmann::json eos = config.is_object() ? config.value("eos_token", nlohmann::json()) : nlohmann::json();
    if (eos.is_object()) eos = eos.value("content", nlohmann::json());  // {"__type": "AddedToken", ...}
    if (eos.is_string() && !eos.get<std::string>().empty()) {
      const std::string content = eos.get<std::string>();
      end_of_document_ = id_of(content);
      if (end_of_document_ < 0) {
        end_of_document_problem_ = config_path.string() + ": eos_token " + quoted_excerpt(content) +
                                   " is not among the added tokens of " + path;
      }
      return;
    }
  }
  for (const char* name : kEndOfTextNames) {
    end_of_document_ = id_of(name);
    if (end_of_document_ >= 0) return;
  }
  end_of_document_problem_ = path +
                             ": no end-of-text token: no tokenizer_config.json with an eos_token beside it, "
                             "and no added token named \"<|endoftext|>\", \"<|end_of_text|>\" or \"</s>\"";
}

int64_t HfTokenizer::end_of_document() const {
  if (end_of_document_ < 0) throw SpecError("--append-eod", end_of_document_problem_);
  return end_of_document_;
}

void HfTokenizer::encode_plain(std::string_view text, std::vector<int64_t>& out) const {
  if (text.empty()) return;
  if (nfc_) {
    const std::string normalized = nfc_normalize(text);
    encoder_->encode(pre_tokenizer_->split(normalized), out);
  } else {
    encoder_->encode(pre_tokenizer_->split(text), out);
  }
}

std::vector<int64_t> HfTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> tokens;
  tokens.reserve(text.size() / 3);
  std::size_t plain_start = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    const AddedToken* match = nullptr;
    for (const AddedToken& token : added_by_first_byte_[static_cast<unsigned char>(text[pos])]) {
      if (text.compare(pos, token.content.size(), token.content) == 0) {
        match = &token;
        break;
      }
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    encode_plain(text.substr(plain_start, pos - plain_start), tokens);
    tokens.push_back(match->id);
    pos += match->content.size();
    plain_start = pos;
  }
  encode_plain(text.substr(plain_start), tokens);
  return tokens;
}

}  // namespace megaplan::exec
