// GPT-2's byte-level BPE. The real vocab.json/merges.txt are not at hand, so a fixture vocabulary
// (all 256 byte tokens, a dozen merges, "<|endoftext|>") is written to a scratch directory and the
// expected encodings are worked out by hand from the BPE rules. The pre-tokenizer splits below
// are those of Python's `regex` module running GPT-2's pattern.
#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "executor/data/gpt2_tokenizer.h"
#include "tests/executor/train/training_fixtures.h"

using Catch::Matchers::Contains;
using megaplan::exec::gpt2_byte_to_unicode;
using megaplan::exec::Gpt2Tokenizer;
using megaplan::test::ScratchDirectory;

namespace {

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

// Raw bytes as vocab.json spells them ("the" -> "the", " the" -> "Ġthe").
std::string spell(std::string_view bytes) {
  std::string spelled;
  for (const char byte : bytes) append_utf8(spelled, gpt2_byte_to_unicode()[static_cast<unsigned char>(byte)]);
  return spelled;
}

std::vector<std::string> split(std::string_view text) {
  std::vector<std::string> pieces;
  for (const std::string_view piece : megaplan::exec::gpt2_pretokenize(text)) pieces.emplace_back(piece);
  return pieces;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary).write(text.data(), static_cast<std::streamsize>(text.size()));
}

// The merges of the fixture, best first, in raw bytes.
const std::vector<std::pair<std::string, std::string>> kMerges = {
    {" ", "t"},   {"h", "e"},    {" t", "he"}, {"l", "l"}, {"e", "ll"}, {"y", "ell"},
    {"he", "ll"}, {"hell", "o"}, {"a", "a"},   {" ", " "}, {"1", "2"},  {"t", "e"},
};

// Byte b is id b (bytes in `missing` left out), merge r is id 256 + r, then "<|endoftext|>".
// Writes vocab.json and merges.txt under `scratch`; `id` maps raw bytes to ids.
struct Fixture {
  explicit Fixture(const ScratchDirectory& scratch, const std::string& missing = "")
      : vocab_path(scratch.file("vocab.json")), merges_path(scratch.file("merges.txt")) {
    nlohmann::json vocab = nlohmann::json::object();
    int64_t next = 0;
    for (int byte = 0; byte < 256; ++byte) {
      const std::string raw(1, static_cast<char>(byte));
      if (missing.find(raw) != std::string::npos) continue;
      ids[raw] = next;
      vocab[spell(raw)] = next++;
    }
    std::string merges = "#version: 0.2\n";
    for (const auto& [left, right] : kMerges) {
      ids[left + right] = next;
      vocab[spell(left + right)] = next++;
      merges += spell(left) + " " + spell(right) + "\n";
    }
    end_of_text = next;
    vocab["<|endoftext|>"] = next++;
    write_file(vocab_path, vocab.dump());
    write_file(merges_path, merges);
  }
  int64_t id(const std::string& raw) const { return ids.at(raw); }

  std::string vocab_path;
  std::string merges_path;
  std::map<std::string, int64_t> ids;
  int64_t end_of_text = -1;
};

// Random valid UTF-8: ASCII, Latin, Greek, CJK, emoji, combining marks, odd spaces.
std::string random_utf8(std::mt19937& generator, int characters) {
  const std::vector<std::pair<char32_t, char32_t>> ranges = {
      {0x20, 0x7E},     {0x09, 0x0D},     {0xA0, 0x17F},      {0x300, 0x36F},     {0x391, 0x3C9},  {0x4E00, 0x4FFF},
      {0x3000, 0x3000}, {0x2000, 0x200D}, {0x1F600, 0x1F64F}, {0x10000, 0x1000F}, {0xE000, 0xE00F}};
  std::string text;
  for (int i = 0; i < characters; ++i) {
    const auto& [first, last] = ranges[generator() % ranges.size()];
    append_utf8(text, first + static_cast<char32_t>(generator() % (last - first + 1)));
  }
  return text;
}

}  // namespace

TEST_CASE("the byte map is GPT-2's: printable bytes stand for themselves, the rest from U+0100", "[tokenizer]") {
  const auto& map = gpt2_byte_to_unicode();
  std::set<char32_t> seen;
  char32_t next_unprintable = 0x100;
  for (int byte = 0; byte < 256; ++byte) {
    const bool printable = (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
    CHECK(map[byte] == (printable ? static_cast<char32_t>(byte) : next_unprintable));
    if (!printable) ++next_unprintable;
    seen.insert(map[byte]);
  }
  CHECK(seen.size() == 256);  // bijective onto its image
  CHECK(next_unprintable == 0x100 + 68);
  CHECK(map[' '] == 0x120);   // 'Ġ'
  CHECK(map['\n'] == 0x10A);  // 'Ċ'
  CHECK(map[0] == 0x100);     // 'Ā'
  CHECK(map['\t'] == 0x109);
  CHECK(map[0x7F] == 0x121);
  CHECK(map[0xAD] == 0x143);  // the soft hyphen, last of the 68
  CHECK(map['A'] == U'A');
  CHECK(map[0xE9] == 0xE9);
  CHECK(spell(" the") == "\xC4\xA0the");
}

TEST_CASE("\\s is White_Space, as in Python's regex and Oniguruma, not PCRE2's own", "[tokenizer]") {
  using Pieces = std::vector<std::string>;
  // U+0085 is White_Space; U+180E (PCRE2's \s takes it), U+200B and U+001C are not.
  CHECK(split("a\u0085b") == Pieces{"a", "\u0085", "b"});
  CHECK(split("a\u180E\u180Eb") == Pieces{"a", "\u180E\u180E", "b"});
  CHECK(split("a\u200B b") == Pieces{"a", "\u200B", " b"});
  CHECK(split("a\u3000\u3000b") == Pieces{"a", "\u3000", "\u3000", "b"});
}

TEST_CASE("the pre-tokenizer splits as GPT-2's regex does", "[tokenizer]") {
  using Pieces = std::vector<std::string>;
  // Contractions: ASCII apostrophe, lower case only.
  CHECK(split("I'm") == Pieces{"I", "'m"});
  CHECK(split("they'll") == Pieces{"they", "'ll"});
  CHECK(split("don't you're we've he'd it's") ==
        Pieces{"don", "'t", " you", "'re", " we", "'ve", " he", "'d", " it", "'s"});
  CHECK(split("'S 'RE") == Pieces{"'", "S", " '", "RE"});
  CHECK(split("x'''s") == Pieces{"x", "'''", "s"});
  // \s+(?!\S): a whitespace run before a word gives its last character to the word.
  CHECK(split("a   b") == Pieces{"a", "  ", " b"});
  CHECK(split("hello  ") == Pieces{"hello", "  "});
  CHECK(split("hello ") == Pieces{"hello", " "});
  CHECK(split("  ") == Pieces{"  "});
  CHECK(split("a\n\nb") == Pieces{"a", "\n", "\n", "b"});
  CHECK(split("line one\nline two\n") == Pieces{"line", " one", "\n", "line", " two", "\n"});
  CHECK(split("a \n\tb") == Pieces{"a", " \n", "\t", "b"});
  CHECK(split("a\u00A0b") == Pieces{"a", "\u00A0", "b"});
  // Digits, punctuation runs.
  CHECK(split("abc123") == Pieces{"abc", "123"});
  CHECK(split("x 42") == Pieces{"x", " 42"});
  CHECK(split("Hello!!! ...ok?") == Pieces{"Hello", "!!!", " ...", "ok", "?"});
  // Beyond ASCII: letters, CJK, numbers; emoji and combining marks are neither letter nor number.
  CHECK(split("héllo wörld") == Pieces{"héllo", " wörld"});
  CHECK(split("中文字 テスト") == Pieces{"中文字", " テスト"});
  CHECK(split("hi 😀😀!") == Pieces{"hi", " 😀😀!"});
  CHECK(split("cafe\u0301 ok") == Pieces{"cafe", "\u0301", " ok"});
  CHECK(split("²³ Ⅻ") == Pieces{"²³", " Ⅻ"});
  CHECK(split("a\x1C\x1C"
              "b") == Pieces{"a", "\x1C\x1C", "b"});
  // Invalid UTF-8: each bad byte is a character of the punctuation class.
  CHECK(split("ab\xFF\xFE!cd") == Pieces{"ab", "\xFF\xFE!", "cd"});
  CHECK(split("x\xE4\xB8") == Pieces{"x", "\xE4\xB8"});  // truncated U+4E2D
  CHECK(split("\xC0\xAF"
              "a") == Pieces{"\xC0\xAF", "a"});                    // overlong '/'
  CHECK(split("\xED\xA0\x80 z") == Pieces{"\xED\xA0\x80", " z"});  // a surrogate
  CHECK(split(" \x80x") == Pieces{" \x80", "x"});
  CHECK(split("").empty());
}

TEST_CASE("the pieces always concatenate back to the text", "[tokenizer]") {
  std::mt19937 generator(11);
  for (int round = 0; round < 300; ++round) {
    std::string text = random_utf8(generator, static_cast<int>(generator() % 40));
    if (round % 2 == 1) {
      for (char& byte : text) {
        if (generator() % 5 == 0) byte = static_cast<char>(generator());
      }
    }
    std::string joined;
    for (const std::string& piece : split(text)) {
      CHECK_FALSE(piece.empty());
      joined += piece;
    }
    CHECK(joined == text);
  }
}

TEST_CASE("BPE merges the lowest-ranked pair first, every occurrence left to right", "[tokenizer]") {
  const ScratchDirectory scratch;
  const Fixture fixture(scratch);
  const Gpt2Tokenizer tokenizer(fixture.vocab_path, fixture.merges_path);
  using Ids = std::vector<int64_t>;
  const auto id = [&](const std::string& raw) { return fixture.id(raw); };
  CHECK(tokenizer.vocab_size() == 256 + 12 + 1);
  CHECK(tokenizer.end_of_document() == fixture.end_of_text);
  // h e l l o: "h e" (rank 1) before "l l" (3), then "he ll" (6), then "hell o" (7).
  CHECK(tokenizer.encode("hello") == Ids{id("hello")});
  // y e l l: "l l", then "e ll", then "y ell".
  CHECK(tokenizer.encode("yell") == Ids{id("yell")});
  // t e l l: "l l" (3) and "e ll" (4) outrank "t e" (11), which then no longer applies;
  // merging the leftmost pair first would give "te" "ll".
  CHECK(tokenizer.encode("tell") == Ids{id("t"), id("ell")});
  CHECK(tokenizer.encode("te") == Ids{id("te")});
  // Ġ t h e: "Ġ t" (0), "h e" (1), "Ġt he" (2).
  CHECK(tokenizer.encode(" the") == Ids{id(" the")});
  // Non-overlapping, left to right: a a a -> aa a.
  CHECK(tokenizer.encode("aaa") == Ids{id("aa"), id("a")});
  CHECK(tokenizer.encode("aaaaa") == Ids{id("aa"), id("aa"), id("a")});
  // Pieces never merge across the pre-tokenizer's splits: "  " and " the", "12" "3".
  CHECK(tokenizer.encode("   the") == Ids{id("  "), id(" the")});
  CHECK(tokenizer.encode("x12345") == Ids{id("x"), id("12"), id("3"), id("4"), id("5")});
  CHECK(tokenizer.encode("hello the  yell") == Ids{id("hello"), id(" the"), id(" "), id(" "), id("yell")});
  // Non-ASCII goes byte by byte: é is C3 A9.
  CHECK(tokenizer.encode("é") == Ids{0xC3, 0xA9});
  // "<|endoftext|>" in the text is text, as in encoder.py.
  CHECK(tokenizer.encode("<|endoftext|>") == Ids{'<', '|', 'e', 'n', 'd', 'o', 'f', id("te"), 'x', 't', '|', '>'});
  CHECK(tokenizer.encode("").empty());
  // The cache returns what BPE computed the first time.
  CHECK(tokenizer.encode("hello hello") == Ids{id("hello"), ' ', id("hello")});
  CHECK(tokenizer.decode({fixture.end_of_text}) == "<|endoftext|>");
  CHECK(tokenizer.decode({id("hello"), id(" the")}) == "hello the");
}

TEST_CASE("decode(encode(text)) is the text for random UTF-8 and random bytes", "[tokenizer]") {
  const ScratchDirectory scratch;
  const Fixture fixture(scratch);
  const Gpt2Tokenizer tokenizer(fixture.vocab_path, fixture.merges_path);
  std::mt19937 generator(5);
  for (int round = 0; round < 200; ++round) {
    const std::string text = random_utf8(generator, static_cast<int>(generator() % 60));
    CHECK(tokenizer.decode(tokenizer.encode(text)) == text);
    std::string bytes(generator() % 80, '\0');
    for (char& byte : bytes) byte = static_cast<char>(generator());
    const std::vector<int64_t> tokens = tokenizer.encode(bytes);
    CHECK(tokenizer.decode(tokens) == bytes);
    for (const int64_t token : tokens) CHECK((token >= 0 && token < tokenizer.vocab_size()));
  }
}

TEST_CASE("a byte without a token and an id outside the vocabulary are refused", "[tokenizer]") {
  const ScratchDirectory scratch;
  const Fixture fixture(scratch, "zq");
  const Gpt2Tokenizer tokenizer(fixture.vocab_path, fixture.merges_path);
  CHECK(tokenizer.vocab_size() == 254 + 12 + 1);
  CHECK(tokenizer.encode("hello") == std::vector<int64_t>{fixture.id("hello")});
  CHECK_THROWS_WITH(tokenizer.encode("a fizz"),
                    Contains("--vocab-file: " + fixture.vocab_path + ": no token \"z\" for byte 0x7A"));
  CHECK_THROWS_WITH(tokenizer.decode({1, 9999}), Contains("token id 9999 is outside the vocabulary of 267"));
  CHECK_THROWS_WITH(tokenizer.decode({-1}), Contains("token id -1 is outside"));
}

TEST_CASE("broken vocab.json and merges.txt are refused naming the file and the line", "[tokenizer]") {
  const ScratchDirectory scratch;
  const Fixture fixture(scratch);
  const std::string vocab = scratch.file("bad-vocab.json");
  const std::string merges = scratch.file("bad-merges.txt");
  const auto refuse = [&](const std::string& vocab_path, const std::string& merges_path, const std::string& message) {
    CHECK_THROWS_WITH(Gpt2Tokenizer(vocab_path, merges_path), Contains(message));
  };
  refuse(scratch.file("none.json"), fixture.merges_path,
         "--vocab-file: " + scratch.file("none.json") + ": cannot read");
  refuse(fixture.vocab_path, scratch.file("none.txt"), "--merge-file: " + scratch.file("none.txt") + ": cannot read");

  write_file(vocab, "{\n  \"a\": 0,\n  \"b\" 1\n}\n");
  refuse(vocab, fixture.merges_path, "--vocab-file: " + vocab + ":3:7: malformed JSON");
  write_file(vocab, "[\"a\", \"b\"]");
  refuse(vocab, fixture.merges_path, vocab + ": must be a non-empty JSON object of token -> id, got array");
  write_file(vocab, "{\"a\": 0, \"b\": \"1\", \"<|endoftext|>\": 2}");
  refuse(vocab, fixture.merges_path, vocab + ": \"b\": id must be an integer in [0, 3), got \"1\"");
  write_file(vocab, "{\"a\": 0, \"b\": 3, \"<|endoftext|>\": 2}");
  refuse(vocab, fixture.merges_path, "\"b\": id must be an integer in [0, 3), got 3");
  write_file(vocab, "{\"a\": 0, \"b\": -1, \"<|endoftext|>\": 2}");
  refuse(vocab, fixture.merges_path, "\"b\": id must be an integer in [0, 3), got -1");
  write_file(vocab, "{\"a\": 0, \"b\": 0, \"<|endoftext|>\": 2}");
  refuse(vocab, fixture.merges_path, vocab + ": \"a\" and \"b\" share id 0");
  write_file(vocab, "{\"a\": 0, \"b\": 1}");
  refuse(vocab, fixture.merges_path, vocab + ": no \"<|endoftext|>\" token");

  write_file(merges, "#version: 0.2\nh e\nl l l\n");
  refuse(fixture.vocab_path, merges,
         "--merge-file: " + merges + ":3: want two tokens separated by one space, got \"l l l\"");
  write_file(merges, "h e\nhe\n");
  refuse(fixture.vocab_path, merges, merges + ":2: want two tokens separated by one space, got \"he\"");
  write_file(merges, "h e\n l\n");
  refuse(fixture.vocab_path, merges, merges + ":2: want two tokens");
  write_file(merges, "#version: 0.2\n\xC4\xA0 t\nh \xC3\xA9\n");
  refuse(fixture.vocab_path, merges, merges + ":3: the merged token \"h\xC3\xA9\" is not in " + fixture.vocab_path);
  write_file(merges, "#version: 0.2\nh e\n\xE2\x82\xAC e\n");
  refuse(fixture.vocab_path, merges, merges + ":3: the left token \"\xE2\x82\xAC\" is not in");
  write_file(merges, "#version: 0.2\nh e\nl l\nh e\n");
  refuse(fixture.vocab_path, merges, merges + ":4: repeats the merge \"h e\" of line 2");
  // Blank lines, CRLF and a missing "#version" line are fine.
  write_file(merges, "h e\r\n\r\nl l\n\n");
  const Gpt2Tokenizer lenient(fixture.vocab_path, merges);
  CHECK(lenient.encode("hell") == std::vector<int64_t>{fixture.id("he"), fixture.id("ll")});
}

TEST_CASE("make_tokenizer wires gpt2 to its two files and refuses them with byte", "[tokenizer]") {
  using megaplan::exec::make_tokenizer;
  using megaplan::exec::TokenizerOptions;
  const ScratchDirectory scratch;
  const Fixture fixture(scratch);
  const auto gpt2 = make_tokenizer(TokenizerOptions{"gpt2", fixture.vocab_path, fixture.merges_path, "", ""});
  CHECK(gpt2->vocab_size() == 269);
  CHECK(gpt2->encode(" the") == std::vector<int64_t>{fixture.id(" the")});
  CHECK_THROWS_WITH(make_tokenizer(TokenizerOptions{"gpt2", "", fixture.merges_path, "", ""}),
                    Contains("--vocab-file: --tokenizer gpt2 needs its vocab.json"));
  CHECK_THROWS_WITH(make_tokenizer(TokenizerOptions{"gpt2", fixture.vocab_path, "", "", ""}),
                    Contains("--merge-file: --tokenizer gpt2 needs its merges.txt"));
  CHECK_THROWS_WITH(
      make_tokenizer(TokenizerOptions{"byte", fixture.vocab_path, "", "", ""}),
      Contains("--vocab-file: --tokenizer byte does not read its vocab.json (--tokenizer gpt2 does); drop it"));
  CHECK_THROWS_WITH(
      make_tokenizer(TokenizerOptions{"byte", "", fixture.merges_path, "", ""}),
      Contains("--merge-file: --tokenizer byte does not read its merges.txt (--tokenizer gpt2 does); drop it"));
  CHECK_THROWS_WITH(make_tokenizer(TokenizerOptions{"wordpiece", "", "", "", ""}),
                    Contains("(known: byte, gpt2, hf, sentencepiece)"));
  CHECK(make_tokenizer(TokenizerOptions{})->vocab_size() == 257);
}
