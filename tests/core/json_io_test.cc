// JSON reading: syntax errors carry file, line and column; unreadable files say why.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "core/json_io.h"

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

TEST_CASE("malformed JSON names the file, line and column", "[json_io]") {
  const std::string text = "{\n  \"num_layers\": 12,\n  \"hidden_size\": 768\n  \"oops\": 1\n}\n";
  try {
    megaplan::parse_json_text(text, "model.json");
    FAIL("expected a SpecError");
  } catch (const megaplan::SpecError& error) {
    CHECK(error.field() == "model.json:4:8");  // the end of the unexpected token "oops"
    CHECK_THAT(error.rule(), StartsWith("malformed JSON: "));
  }
  CHECK_THROWS_WITH(megaplan::parse_json_text("", "empty.json"), StartsWith("empty.json:1:1: malformed JSON"));
  CHECK_THROWS_WITH(megaplan::parse_json_text("[1, 2", "cut.json"), StartsWith("cut.json:1:"));
}

TEST_CASE("an unreadable file names the path and the reason", "[json_io]") {
  CHECK_THROWS_WITH(megaplan::read_json_file("/nonexistent/model.json"),
                    "/nonexistent/model.json: cannot read file: No such file or directory");
}

TEST_CASE("the field reader rejects a non-object", "[json_io]") {
  const nlohmann::json array = nlohmann::json::array();
  CHECK_THROWS_WITH(megaplan::JsonFieldReader(array, "x.json"), "x.json: must be a JSON object, got array");
}

TEST_CASE("deep nesting and numbers beyond a double are refused with one line, nothing of the library's", "[json_io]") {
  // 100,000 levels would overflow a recursive walk's stack; the limit refuses them before parsing.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  CHECK_THROWS_WITH(megaplan::parse_json_text(deep, "deep.json"),
                    "deep.json:1:65: malformed JSON: arrays and objects nest deeper than 64 levels");
  CHECK_FALSE(megaplan::try_parse_json(deep));
  // Brackets inside strings, escaped quotes included, do not nest.
  const std::string bracketed = "{\"a\": \"" + std::string(100, '[') + "\\\"" + std::string(100, '{') + "\"}";
  CHECK(megaplan::parse_json_text(bracketed, "strings.json").at("a").get<std::string>().size() == 201);
  const std::string exactly = std::string(64, '[') + std::string(64, ']');
  CHECK_NOTHROW(megaplan::parse_json_text(exactly, "64.json"));

  CHECK_THROWS_WITH(megaplan::parse_json_text("{\"num_layers\": 1e999}", "model.json"),
                    "model.json: malformed JSON: the number '1e999' is beyond a double's range (1.8e308)");
  CHECK_FALSE(megaplan::try_parse_json("[1e999]"));
  // The library's exception names never reach a message.
  for (const std::string text : {"[1,", "{\"a\" 1}", "\"\\ud800\"", "[-1e999]", "nul"}) {
    INFO(text);
    try {
      megaplan::parse_json_text(text, "x.json");
      FAIL("parsed");
    } catch (const megaplan::SpecError& error) {
      CHECK(std::string(error.what()).find("json.exception") == std::string::npos);
    }
  }
}

TEST_CASE("the field reader shows a wrong value short, its control characters escaped", "[json_io]") {
  const nlohmann::json object = {
      {"name", 7}, {"shape", {1, "x"}}, {"seed", -3}, {"count", std::string(100, 'x') + "\n"}};
  megaplan::JsonFieldReader fields(object, "f.json");
  std::string name;
  CHECK_THROWS_WITH(fields.read("name", name), "f.json: name: must be a string, got number 7");
  std::vector<int64_t> shape;
  CHECK_THROWS_WITH(fields.read("shape", shape),
                    "f.json: shape: must be an array of 64-bit integers, and holds string \"x\"");
  uint64_t seed = 0;
  CHECK_THROWS_WITH(fields.read("seed", seed), "f.json: seed: must be a non-negative integer, got number -3");
  int64_t count = 0;
  try {
    fields.read("count", count);
    FAIL("read");
  } catch (const megaplan::SpecError& error) {
    const std::string message = error.what();
    CHECK(message.find('\n') == std::string::npos);
    CHECK(message.size() < 120);
    CHECK(message.find("...") != std::string::npos);
  }
}

TEST_CASE("an error line escapes the control characters a quoted name or value carries", "[json_io]") {
  CHECK(megaplan::printable_line("a\nb\tc\rd\x1b[31m\x7f") == "a\\nb\\tc\\rd\\x1b[31m\\x7f");
  CHECK(megaplan::printable_line("plain: ünïcode stays") == "plain: ünïcode stays");
}
