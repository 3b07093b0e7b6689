// Hugging Face tokenizer.json byte-level BPE against the hand-written fixtures of
// tests/data/hf_tiny (README there lists their ids). Every expected id below is worked out by
// hand from the fixture's merges and the pre-tokenizer pattern, not taken from this code.
#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "executor/data/byte_pair_encoding.h"
#include "executor/data/hf_tokenizer.h"
#include "executor/data/tokenizer.h"
#include "tests/executor/train/training_fixtures.h"

using Catch::Matchers::Contains;
using megaplan::exec::HfTokenizer;
using megaplan::test::ScratchDirectory;
using Ids = std::vector<int64_t>;

namespace {

const std::string kData = std::string(MEGAPLAN_TEST_DATA_DIR) + "/hf_tiny/";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary).write(text.data(), static_cast<std::streamsize>(text.size()));
}

nlohmann::json fixture(const std::string& name) {
  return nlohmann::json::parse(read_file(kData + name + "/tokenizer.json"));
}

// The bytes of each id of a fixture (vocabulary through the byte map, added tokens as written).
std::string decode(const nlohmann::json& tokenizer, const Ids& ids) {
  std::map<int64_t, std::string> bytes_of;
  for (auto entry = tokenizer["model"]["vocab"].begin(); entry != tokenizer["model"]["vocab"].end(); ++entry) {
    std::string bytes;
    REQUIRE(megaplan::exec::byte_level_token_bytes(entry.key(), bytes));
    bytes_of[entry.value().get<int64_t>()] = bytes;
  }
  for (const auto& added : tokenizer["added_tokens"]) bytes_of[added["id"].get<int64_t>()] = added["content"];
  std::string text;
  for (const int64_t id : ids) text += bytes_of.at(id);
  return text;
}

}  // namespace

// gpt2-style: ByteLevel(use_regex), merges as "a b" strings; he 256, ll 257, hell 258, hello 259,
// Ġw 260, or 261, Ġwor 262, Ġworl 263, Ġworld 264, 12 265, <|endoftext|> 266.
TEST_CASE("a GPT-2 tokenizer.json: ByteLevel's regex, merges as strings, <|endoftext|> in text", "[tokenizer]") {
  const HfTokenizer tokenizer(kData + "gpt2-style/tokenizer.json");
  CHECK(tokenizer.vocab_size() == 267);
  CHECK(tokenizer.end_of_document() == 266);
  CHECK(tokenizer.encode("hello world") == Ids{259, 264});
  // The added token is matched first; "world" after it has no leading space, so only "o r" merges.
  CHECK(tokenizer.encode("hello<|endoftext|>world") == Ids{259, 266, 'w', 261, 'l', 'd'});
  CHECK(tokenizer.encode("<|endoftext|><|endoftext|>") == Ids{266, 266});
  CHECK(tokenizer.encode("<|endoftext") == Ids{'<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't'});
  // GPT-2's \p{N}+ keeps "12" together; " 345" has no merges.
  CHECK(tokenizer.encode("12 345") == Ids{265, ' ', '3', '4', '5'});
  CHECK(tokenizer.encode("I'm") == Ids{'I', '\'', 'm'});
  CHECK(tokenizer.encode("中") == Ids{0xE4, 0xB8, 0xAD});
  CHECK(tokenizer.encode("😀") == Ids{0xF0, 0x9F, 0x98, 0x80});
  CHECK(tokenizer.encode("").empty());
}

// llama3-style: Split(Llama 3's regex) + ByteLevel(use_regex false), merges as pairs,
// ignore_merges; he 256, ll 257, hell 258, hello 259, ĠĠ 260, 12 261, Ġworld 262 (no merge
// makes it), <|begin_of_text|> 263, <|end_of_text|> 264, <|eot_id|> 265.
TEST_CASE("a Llama 3 tokenizer.json: Split regex, merges as pairs, ignore_merges, eos_token", "[tokenizer]") {
  const HfTokenizer tokenizer(kData + "llama3-style/tokenizer.json");
  CHECK(tokenizer.vocab_size() == 266);
  CHECK(tokenizer.end_of_document() == 265);  // tokenizer_config.json's eos_token <|eot_id|>
  // " world" is a vocabulary token, which no merge reaches: ignore_merges takes it whole.
  CHECK(tokenizer.encode("hello world") == Ids{259, 262});
  CHECK(tokenizer.encode("!hello") == Ids{'!', 259});           // [^\r\n\p{L}\p{N}]?\p{L}+ takes the '!'
  CHECK(tokenizer.encode("12345") == Ids{261, '3', '4', '5'});  // \p{N}{1,3}: "123" "45"
  CHECK(tokenizer.encode("I'M") == Ids{'I', '\'', 'M'});        // (?i:'m)
  CHECK(tokenizer.encode("a   b") == Ids{'a', 260, ' ', 'b'});  // "a" "  " " b"
  CHECK(tokenizer.encode("a\n\n b") == Ids{'a', '\n', '\n', ' ', 'b'});
  CHECK(tokenizer.encode("<|begin_of_text|>hello<|eot_id|>") == Ids{263, 259, 265});

  const ScratchDirectory scratch;
  nlohmann::json changed = fixture("llama3-style");
  changed["model"]["ignore_merges"] = false;
  write_file(scratch.file("tokenizer.json"), changed.dump());
  const HfTokenizer merging(scratch.file("tokenizer.json"));
  CHECK(merging.encode("hello world") == Ids{259, ' ', 'w', 'o', 'r', 'l', 'd'});
  // No tokenizer_config.json beside it: the first of the known end-of-text names.
  CHECK(merging.end_of_document() == 264);
}

// qwen2-style: NFC, Split(Qwen2's regex: single digits), ByteLevel(use_regex false); he 256,
// ll 257, hell 258, hello 259, é (C3 A9) 260, 12 261, <|endoftext|> 262, <|im_start|> 263,
// <|im_end|> 264.
TEST_CASE("a Qwen2 tokenizer.json: NFC before the pre-tokenizer, single digits", "[tokenizer]") {
  const HfTokenizer tokenizer(kData + "qwen2-style/tokenizer.json");
  CHECK(tokenizer.vocab_size() == 265);
  CHECK(tokenizer.end_of_document() == 262);
  CHECK(tokenizer.encode("café") == Ids{'c', 'a', 'f', 260});
  CHECK(tokenizer.encode("cafe\u0301") == Ids{'c', 'a', 'f', 260});  // e + U+0301 composes to é
  CHECK(tokenizer.encode("123") == Ids{'1', '2', '3'});
  CHECK(tokenizer.encode("<|im_start|>hello<|im_end|>") == Ids{263, 259, 264});
  CHECK(tokenizer.encode("e\u0301\xFF") == Ids{260, 0xFF});  // invalid bytes pass NFC untouched
  CHECK(tokenizer.encode("hello world") == Ids{259, ' ', 'w', 'o', 'r', 'l', 'd'});
}

TEST_CASE("NFC keeps ASCII and invalid bytes, composes the rest", "[tokenizer]") {
  using megaplan::exec::nfc_normalize;
  CHECK(nfc_normalize("plain text") == "plain text");
  CHECK(nfc_normalize("e\u0301") == "\u00E9");
  CHECK(nfc_normalize("\u212B") == "\u00C5");  // ANGSTROM SIGN -> Å
  CHECK(nfc_normalize("\uAC00") == "\uAC00");
  CHECK(nfc_normalize("\u1100\u1161") == "\uAC00");  // Hangul jamo compose
  CHECK(nfc_normalize("a\xFF"
                      "e\u0301\x80") == "a\xFF\u00E9\x80");
  CHECK(nfc_normalize("") == "");
}

TEST_CASE("hf ids decode back to any bytes, invalid UTF-8 included", "[tokenizer]") {
  std::mt19937 generator(7);
  for (const std::string name : {"gpt2-style", "llama3-style"}) {
    const HfTokenizer tokenizer(kData + name + "/tokenizer.json");
    const nlohmann::json json = fixture(name);
    for (int round = 0; round < 200; ++round) {
      std::string bytes(generator() % 60, '\0');
      for (char& byte : bytes)
        byte = static_cast<char>(generator() % 3 == 0 ? generator() : "hel o\n12<|"[generator() % 10]);
      CHECK(decode(json, tokenizer.encode(bytes)) == bytes);
    }
    const std::string mixed = "Съешь 中文 😀👍🏽 \t\t  x\n\n\xC0\xAF\xED\xA0\x80<|endoftext|>";
    CHECK(decode(json, tokenizer.encode(mixed)) == mixed);
  }
}

TEST_CASE("malformed tokenizer.json files are refused naming the field", "[tokenizer]") {
  const ScratchDirectory scratch;
  const std::string path = scratch.file("tokenizer.json");
  const auto refuse = [&](const nlohmann::json& json, const std::string& message) {
    write_file(path, json.dump());
    CHECK_THROWS_WITH(HfTokenizer(path), Contains("--tokenizer-file: " + path + ": " + message));
  };
  CHECK_THROWS_WITH(HfTokenizer(scratch.file("none.json")),
                    Contains("--tokenizer-file: " + scratch.file("none.json") + ": cannot read file"));
  write_file(path, "{\"model\": ");
  CHECK_THROWS_WITH(HfTokenizer(path), Contains("--tokenizer-file: " + path + ":1:") && Contains("malformed JSON"));
  refuse(nlohmann::json::array(), "must be a JSON object (a tokenizer.json), got a JSON array");

  const nlohmann::json good = fixture("gpt2-style");
  nlohmann::json bad = good;
  bad["model"]["type"] = "Unigram";
  refuse(bad, "model.type: must be \"BPE\"");
  bad = good;
  bad["model"]["type"] = "WordPiece";
  refuse(bad,
         "model.type: must be \"BPE\" (byte-level BPE; use --tokenizer sentencepiece for SentencePiece models), got "
         "\"WordPiece\"");
  bad = good;
  bad["normalizer"] = {{"type", "Lowercase"}};
  refuse(bad, "normalizer: \"Lowercase\" is not supported (supported: null, NFC, or a Sequence of NFC)");
  bad["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "NFKC"}}}}};
  refuse(bad, "normalizer: \"NFKC\" in a Sequence is not supported");
  bad = good;
  bad["pre_tokenizer"] = {{"type", "Whitespace"}};
  refuse(bad, "pre_tokenizer: \"Whitespace\" is not supported: must be ByteLevel, or a Sequence of Split");
  bad["pre_tokenizer"] = nullptr;
  refuse(bad,
         "pre_tokenizer: must be ByteLevel, or a Sequence of Split (behavior Isolated) ending in ByteLevel, got null");
  bad["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}};
  refuse(bad, "pre_tokenizer.add_prefix_space: true is not supported");
  nlohmann::json split = fixture("llama3-style");
  split["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
  refuse(split, "pre_tokenizer.pretokenizers[0].behavior: must be \"Isolated\", got \"Removed\"");
  split = fixture("llama3-style");
  split["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "(\\p{L}"}};
  refuse(split, "pre_tokenizer: PCRE2 refuses the pattern (\\p{L}: missing closing parenthesis");
  split["pre_tokenizer"]["pretokenizers"] = {split["pre_tokenizer"]["pretokenizers"][1]};
  refuse(split, "pre_tokenizer.pretokenizers[0]: ByteLevel without use_regex needs a Split before it");
  split = fixture("llama3-style");
  split["model"]["ignore_merges"] = "yes";
  refuse(split, "model.ignore_merges: must be true or false, got \"yes\"");
  bad = good;
  bad["model"]["merges"][0] = "h q";
  refuse(bad, "model.merges[0]: the merged token \"hq\" is not in model.vocab");
  bad["model"]["merges"][0] = "\xCE\xA9 e";
  refuse(bad, "model.merges[0]: the left token \"\xCE\xA9\" is not in model.vocab");
  bad["model"]["merges"][0] = {"h", "\xCE\xA9"};
  refuse(bad, "model.merges[0]: the right token \"\xCE\xA9\" is not in model.vocab");
  bad["model"]["merges"][0] = "he";
  refuse(bad, "model.merges[0]: want two tokens separated by one space, got \"he\"");
  bad["model"]["merges"][0] = {"h", "e", "x"};
  refuse(bad, "model.merges[0]: want a \"left right\" string or a [\"left\", \"right\"] pair");
  bad["model"]["merges"][0] = "l l";
  refuse(bad, "model.merges[1]: repeats the merge \"l l\"");
  bad = good;
  bad["model"]["vocab"]["h"] = -3;
  refuse(bad, "model.vocab.\"h\": id must be an integer in [0, 2^31), got -3");
  bad["model"]["vocab"]["h"] = 0;
  refuse(bad, "model.vocab: \"h\" and \"\xC4\x80\" share id 0");
  bad = good;
  bad["model"]["dropout"] = 0.1;
  refuse(bad, "model.dropout: BPE dropout is not supported");
  bad = good;
  bad["added_tokens"][0]["lstrip"] = true;
  refuse(bad, "added_tokens[0].lstrip: \"<|endoftext|>\": true is not supported");
}

TEST_CASE("--append-eod needs an end-of-text token the tokenizer has", "[tokenizer]") {
  const ScratchDirectory scratch;
  nlohmann::json json = fixture("gpt2-style");
  json["added_tokens"] = nlohmann::json::array();
  write_file(scratch.file("tokenizer.json"), json.dump());
  const HfTokenizer without(scratch.file("tokenizer.json"));
  CHECK(without.encode("hello") == Ids{259});
  CHECK_THROWS_WITH(without.end_of_document(),
                    Contains("--append-eod: " + scratch.file("tokenizer.json") + ": no end-of-text token"));

  write_file(scratch.file("tokenizer.json"), fixture("gpt2-style").dump());
  write_file(scratch.file("tokenizer_config.json"),
             R"({"eos_token": {"__type": "AddedToken", "content": "<|im_end|>"}})");
  CHECK_THROWS_WITH(HfTokenizer(scratch.file("tokenizer.json")).end_of_document(),
                    Contains("--append-eod: " + scratch.file("tokenizer_config.json") +
                             ": eos_token \"<|im_end|>\" is not among the added tokens"));
  write_file(scratch.file("tokenizer_config.json"),
             R"({"eos_token": {"__type": "AddedToken", "content": "<|endoftext|>"}})");
  CHECK(HfTokenizer(scratch.file("tokenizer.json")).end_of_document() == 266);
  write_file(scratch.file("tokenizer_config.json"), "{oops");
  CHECK_THROWS_WITH(HfTokenizer(scratch.file("tokenizer.json")),
                    Contains("--tokenizer-file: " + scratch.file("tokenizer_config.json") + ":1:"));
}

TEST_CASE("make_tokenizer wires hf and sentencepiece to their files", "[tokenizer]") {
  using megaplan::exec::make_tokenizer;
  using megaplan::exec::TokenizerOptions;
  TokenizerOptions hf;
  hf.kind = "hf";
  CHECK_THROWS_WITH(make_tokenizer(hf), Contains("--tokenizer-file: --tokenizer hf needs its tokenizer.json"));
  hf.tokenizer_file = kData + "gpt2-style/tokenizer.json";
  CHECK(make_tokenizer(hf)->encode("hello world") == Ids{259, 264});
  hf.tokenizer_model = "tokenizer.model";
  CHECK_THROWS_WITH(make_tokenizer(hf), Contains("--tokenizer-model: --tokenizer hf does not read its tokenizer.model "
                                                 "(--tokenizer sentencepiece does); drop it"));
  TokenizerOptions spm;
  spm.kind = "sentencepiece";
  CHECK_THROWS_WITH(make_tokenizer(spm),
                    Contains("--tokenizer-model: --tokenizer sentencepiece needs its tokenizer.model"));
  spm.vocab_file = "vocab.json";
  spm.tokenizer_model = "x.model";
  CHECK_THROWS_WITH(make_tokenizer(spm),
                    Contains("--vocab-file: --tokenizer sentencepiece does not read its vocab.json"));
}
