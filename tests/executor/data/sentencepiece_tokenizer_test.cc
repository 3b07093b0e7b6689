// SentencePiece through libsentencepiece against tests/data/sentencepiece_tiny/tiny.model; the
// expected ids are spm_encode's (Debian's reference CLI, `spm_encode --model=tiny.model
// --output_format=id`), run when the fixture was made.
#include <catch2/catch.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "executor/data/sentencepiece_tokenizer.h"
#include "tests/executor/train/training_fixtures.h"

using Catch::Matchers::Contains;
using megaplan::exec::SentencePieceTokenizer;
using megaplan::test::ScratchDirectory;
using Ids = std::vector<int64_t>;

namespace {
const std::string kModel = std::string(MEGAPLAN_TEST_DATA_DIR) + "/sentencepiece_tiny/tiny.model";
}  // namespace

TEST_CASE("SentencePiece ids are spm_encode's", "[tokenizer]") {
  const SentencePieceTokenizer tokenizer(kModel);
  CHECK(tokenizer.vocab_size() == 500);
  CHECK(tokenizer.end_of_document() == 2);  // </s>
  CHECK(tokenizer.encode("hello world") == Ids{372, 261, 383, 383, 378, 274, 267, 383, 381});
  CHECK(tokenizer.encode("  two  spaces\tand tab") ==
        Ids{260, 259, 392, 378, 260, 376, 386, 285, 280, 12, 375, 281, 259, 375, 393});
  // Ω is not in the model: byte fallback gives <0xCE> <0xA9>; digits are split.
  CHECK(tokenizer.encode("Café 中文 😀 Ω 12345") ==
        Ids{372, 426, 375, 388, 441, 372, 492, 448, 372, 499, 372, 209, 172, 372, 413, 408, 425, 430, 451});
  CHECK(tokenizer.encode("").empty());
}

TEST_CASE("a missing or corrupt SentencePiece model is one line naming the file", "[tokenizer]") {
  const ScratchDirectory scratch;
  CHECK_THROWS_WITH(SentencePieceTokenizer(scratch.file("none.model")),
                    Contains("--tokenizer-model: " + scratch.file("none.model") + ": cannot read file"));
  for (const std::string& contents :
       {std::string("not a model at all\n"), std::string(), std::string("\x0a\x05\x0a\x01")}) {
    std::ofstream(scratch.file("bad.model"), std::ios::binary) << contents;
    CHECK_THROWS_WITH(SentencePieceTokenizer(scratch.file("bad.model")),
                      Contains("--tokenizer-model: " + scratch.file("bad.model") + ": not a SentencePiece model"));
  }
}
