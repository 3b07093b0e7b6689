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
