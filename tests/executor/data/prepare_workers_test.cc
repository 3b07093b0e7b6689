// data prepare as Megatron-LM's tools/preprocess_data.py runs it: --workers threads that tokenize
// while the output stays byte for byte that of one worker (GPT-2's BPE on tests/data/gpt2_tiny,
// whose piece cache the workers share, and bytes), refusals reported for the first bad record in
// input order whatever the workers; and Megatron's --tokenizer-type names mapped onto megaplan's.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "executor/data/prepare.h"
#include "executor/data/tokenizer.h"
#include "tests/executor/train/training_fixtures.h"

using Catch::Matchers::Contains;
using megaplan::test::ScratchDirectory;

namespace {

const std::string kData = MEGAPLAN_TEST_DATA_DIR;

std::string contents_of(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary).write(text.data(), static_cast<std::streamsize>(text.size()));
}

// Enough JSON lines for several batches of two and three workers, of varied lengths and bytes,
// some empty, plus a whole text file between two JSON-lines files.
std::vector<std::string> corpus(const ScratchDirectory& scratch) {
  std::mt19937 generator(11);
  const std::vector<std::string> words = {"hello", "the", "world", "!", "\\n", "caf\\u00e9", "1234", " ", "\\t"};
  for (const char* name : {"a.jsonl", "c.json"}) {
    std::string lines;
    for (int line = 0; line < 13000; ++line) {
      std::string text;
      const auto count = generator() % 12;
      for (unsigned w = 0; w < count; ++w) text += words[generator() % words.size()] + (generator() % 2 ? " " : "");
      lines += "{\"text\": \"" + text + "\", \"title\": \"" + words[generator() % 4] + "\"}\n";
    }
    write_text(scratch.file(name), lines);
  }
  write_text(scratch.file("b.txt"), "a whole file, one document\nof two lines");
  return {scratch.file("a.jsonl"), scratch.file("b.txt"), scratch.file("c.json")};
}

}  // namespace

TEST_CASE("--workers 2 and 3 write the bytes --workers 1 writes", "[tokenizer]") {
  const ScratchDirectory scratch;
  megaplan::exec::TokenizerOptions gpt2;
  gpt2.kind = "gpt2";
  gpt2.vocab_file = kData + "/gpt2_tiny/vocab.json";
  gpt2.merge_file = kData + "/gpt2_tiny/merges.txt";
  for (const megaplan::exec::TokenizerOptions& tokenizer_options : {gpt2, megaplan::exec::TokenizerOptions{}}) {
    const auto tokenizer = megaplan::exec::make_tokenizer(tokenizer_options);
    megaplan::exec::PrepareOptions options;
    options.inputs = corpus(scratch);
    options.append_end_of_document = true;
    options.json_keys = {"text"};
    std::vector<std::string> outputs;
    for (const int64_t workers : {1, 2, 3}) {
      options.workers = workers;
      options.output_prefix = scratch.file("out" + std::to_string(workers));
      const megaplan::exec::PrepareSummary summary = megaplan::exec::prepare_dataset(options, *tokenizer);
      CHECK(summary.datasets.at(0).documents > 20000);
      outputs.push_back(summary.datasets.at(0).prefix);
    }
    for (const char* suffix : {".bin", ".idx"}) {
      const std::string one = contents_of(outputs[0] + suffix);
      CHECK(!one.empty());
      CHECK(contents_of(outputs[1] + suffix) == one);
      CHECK(contents_of(outputs[2] + suffix) == one);
    }
  }
}

TEST_CASE("--workers refuse the first bad record in input order", "[tokenizer]") {
  const ScratchDirectory scratch;
  std::vector<std::string> inputs = corpus(scratch);
  // Two bad lines far apart in a.jsonl, and an unreadable file after it.
  std::string lines = contents_of(inputs[0]);
  const std::size_t middle = lines.find('\n', lines.size() / 2) + 1;
  const auto bad_line = std::count(lines.begin(), lines.begin() + static_cast<std::ptrdiff_t>(middle), '\n') + 1;
  lines.insert(middle, "{\"text\": 3}\n");
  lines += "{\"text\": \n";
  write_text(inputs[0], lines);
  inputs.insert(inputs.begin() + 1, scratch.file("missing.txt"));
  const megaplan::exec::ByteTokenizer bytes;
  megaplan::exec::PrepareOptions options;
  options.inputs = inputs;
  options.output_prefix = scratch.file("never");
  std::string first_error;
  for (const int64_t workers : {1, 2, 3}) {
    options.workers = workers;
    try {
      megaplan::exec::prepare_dataset(options, bytes);
      FAIL("a bad line was accepted");
    } catch (const megaplan::SpecError& error) {
      if (first_error.empty()) first_error = error.what();
      CHECK(error.what() == first_error);
    }
  }
  CHECK_THAT(first_error, Contains("a.jsonl:" + std::to_string(bad_line) + ": no string field \"text\""));
  CHECK(!std::filesystem::exists(scratch.file("never_text_document.bin")));
}

TEST_CASE("--tokenizer-type takes Megatron-LM's names", "[tokenizer]") {
  using megaplan::exec::make_tokenizer;
  using megaplan::exec::resolve_tokenizer;
  using megaplan::exec::TokenizerOptions;
  TokenizerOptions options;
  options.kind.clear();
  CHECK(resolve_tokenizer(options).kind == "byte");
  options.megatron_type = "GPT2BPETokenizer";
  CHECK(resolve_tokenizer(options).kind == "gpt2");
  CHECK_THROWS_WITH(make_tokenizer(options),
                    Contains("--vocab-file: --tokenizer-type GPT2BPETokenizer needs its vocab.json"));
  options.vocab_file = kData + "/gpt2_tiny/vocab.json";
  options.merge_file = kData + "/gpt2_tiny/merges.txt";
  CHECK(make_tokenizer(options)->vocab_size() == 268);
  options.kind = "gpt2";  // both, agreeing
  CHECK(make_tokenizer(options)->vocab_size() == 268);
  options.kind = "hf";
  CHECK_THROWS_WITH(make_tokenizer(options),
                    Contains("--tokenizer-type: GPT2BPETokenizer is megaplan's --tokenizer gpt2, not --tokenizer hf"));

  // HuggingFaceTokenizer: the tokenizer.json, or its folder, as --tokenizer-model.
  TokenizerOptions hf;
  hf.kind.clear();
  hf.megatron_type = "HuggingFaceTokenizer";
  CHECK_THROWS_WITH(make_tokenizer(hf),
                    Contains("--tokenizer-model: --tokenizer-type HuggingFaceTokenizer needs its tokenizer.json"));
  hf.tokenizer_model = kData + "/hf_tiny/llama3-style";
  CHECK(resolve_tokenizer(hf).tokenizer_file == kData + "/hf_tiny/llama3-style/tokenizer.json");
  CHECK(make_tokenizer(hf)->end_of_document() == 265);  // tokenizer_config.json beside it read too
  hf.tokenizer_model = kData + "/hf_tiny/gpt2-style/tokenizer.json";
  CHECK(make_tokenizer(hf)->vocab_size() == 267);
  hf.tokenizer_model = kData + "/hf_tiny/nowhere";
  CHECK_THROWS_WITH(make_tokenizer(hf), Contains("--tokenizer-model: "));
  hf.tokenizer_file = kData + "/hf_tiny/gpt2-style/tokenizer.json";
  CHECK_THROWS_WITH(make_tokenizer(hf), Contains("--tokenizer-model: and --tokenizer-file both name"));

  TokenizerOptions spm;
  spm.kind.clear();
  for (const char* name : {"SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"}) {
    spm.megatron_type = name;
    CHECK(resolve_tokenizer(spm).kind == "sentencepiece");
  }
  for (const char* name : {"BertWordPieceLowerCase", "BertWordPieceCase", "TikTokenizer", "NullTokenizer",
                           "MultimodalTokenizer", "NullMultimodalTokenizer", "SFTTokenizer"}) {
    spm.megatron_type = name;
    CHECK_THROWS_WITH(resolve_tokenizer(spm),
                      Contains("--tokenizer-type: \"" + std::string(name) +
                               "\" is Megatron-LM's but not built in megaplan (supported: GPT2BPETokenizer, "
                               "HuggingFaceTokenizer, SentencePieceTokenizer, GPTSentencePieceTokenizer, "
                               "Llama2Tokenizer)"));
  }
  spm.megatron_type = "gpt2";
  CHECK_THROWS_WITH(resolve_tokenizer(spm), Contains("\"gpt2\" is no Megatron-LM tokenizer type"));
}
