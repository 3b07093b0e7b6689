// The data pipeline. Megatron's indexed dataset: .idx files whose bytes are written here by hand,
// in Megatron's layout, read back exactly; every dtype code; the writer's round trip; broken files
// refused with one line naming the file and the rule. Then data prepare, --split, GPT samples and
// Megatron's blends of datasets.
#include <catch2/catch.hpp>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "executor/data/blended_samples.h"
#include "executor/data/data_blend.h"
#include "executor/data/gpt_dataset.h"
#include "executor/data/indexed_dataset.h"
#include "executor/data/prepare.h"
#include "executor/data/vocabulary.h"
#include "tests/executor/train/training_fixtures.h"

using Catch::Matchers::Contains;
using megaplan::exec::DocumentRange;
using megaplan::exec::IndexedDataset;
using megaplan::exec::IndexedDatasetWriter;
using megaplan::exec::TokenType;

namespace {

using megaplan::test::ScratchDirectory;

// Little-endian bytes of a value, appended.
template <typename T>
void put(std::string& bytes, T value) {
  char raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));
  bytes.append(raw, sizeof(T));
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Whether anything in `folder` has a name starting with `stem`: a dataset, a staged temporary
// file or a folder a failed run left behind.
bool anything_named(const std::string& folder, const std::string& stem) {
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    if (entry.path().filename().string().rfind(stem, 0) == 0) return true;
  }
  return false;
}

// An .idx in Megatron's layout for sequences of the given lengths laid back to back.
std::string index_bytes(uint8_t code, std::size_t width, const std::vector<int32_t>& lengths,
                        const std::vector<int64_t>& documents) {
  std::string bytes("MMIDIDX\0\0", 9);
  put<uint64_t>(bytes, 1);
  put<uint8_t>(bytes, code);
  put<uint64_t>(bytes, lengths.size());
  put<uint64_t>(bytes, documents.size());
  for (int32_t length : lengths) put<int32_t>(bytes, length);
  int64_t pointer = 0;
  for (int32_t length : lengths) {
    put<int64_t>(bytes, pointer);
    pointer += length * static_cast<int64_t>(width);
  }
  for (int64_t document : documents) put<int64_t>(bytes, document);
  return bytes;
}

}  // namespace

TEST_CASE("an .idx written byte by byte in Megatron's layout reads back", "[data]") {
  const ScratchDirectory scratch;
  const std::string prefix = scratch.file("corpus");
  // Three sequences (uint16 tokens) in two documents: {0, 1}, {2} -> document indices 0, 2, 3.
  std::string bin;
  for (int token : {7, 8, 9, 50000, 65535, 1}) put<uint16_t>(bin, static_cast<uint16_t>(token));
  write_bytes(prefix + ".bin", bin);
  write_bytes(prefix + ".idx", index_bytes(8, 2, {3, 2, 1}, {0, 2, 3}));
  const IndexedDataset dataset(prefix);
  CHECK(dataset.token_type() == TokenType::kUint16);
  CHECK(dataset.num_sequences() == 3);
  CHECK(dataset.num_documents() == 2);
  CHECK(dataset.document_start(1) == 2);
  CHECK(dataset.sequence(0) == std::vector<int64_t>{7, 8, 9});
  CHECK(dataset.sequence(1) == std::vector<int64_t>{50000, 65535});
  CHECK(dataset.sequence(2) == std::vector<int64_t>{1});
  int64_t middle[2];
  dataset.read(0, 1, 2, middle);
  CHECK(middle[0] == 8);
  CHECK(middle[1] == 9);
}

TEST_CASE("every dtype code reads its tokens", "[data]") {
  const ScratchDirectory scratch;
  struct Case {
    TokenType type;
    std::vector<int64_t> tokens;
  };
  const std::vector<Case> cases = {{TokenType::kUint8, {0, 255, 3}},
                                   {TokenType::kInt8, {-128, 127, 0}},
                                   {TokenType::kInt16, {-32768, 32767, 5}},
                                   {TokenType::kInt32, {-7, 2147483647, 0}},
                                   {TokenType::kInt64, {-1, int64_t{1} << 40, 9}},
                                   {TokenType::kFloat64, {3, 1 << 30, 0}},
                                   {TokenType::kFloat32, {3, 1 << 20, 0}},
                                   {TokenType::kUint16, {65535, 0, 1}}};
  for (const Case& entry : cases) {
    const std::string prefix = scratch.file("dtype" + std::to_string(static_cast<int>(entry.type)));
    IndexedDatasetWriter writer(prefix, entry.type);
    writer.add_document(entry.tokens);
    writer.add_document({entry.tokens[2]});
    writer.finish();
    const IndexedDataset dataset(prefix);
    CHECK(dataset.token_type() == entry.type);
    CHECK(dataset.sequence(0) == entry.tokens);
    CHECK(dataset.sequence(1) == std::vector<int64_t>{entry.tokens[2]});
    CHECK(dataset.num_documents() == 2);
    const auto [smallest, largest] = dataset.token_range();
    CHECK(smallest == *std::min_element(entry.tokens.begin(), entry.tokens.end()));
    CHECK(largest == *std::max_element(entry.tokens.begin(), entry.tokens.end()));
  }
  // A float dataset's NaN, infinity or value beyond int64 reads as INT64_MIN (no vocabulary holds
  // it, so a run refuses the file), never as undefined behaviour.
  {
    const std::string prefix = scratch.file("nonfinite");
    IndexedDatasetWriter writer(prefix, TokenType::kFloat32);
    writer.add_document({1, 2, 3, 4});
    writer.finish();
    const float bad[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity(), 1e30f};
    std::fstream bin(prefix + ".bin", std::ios::in | std::ios::out | std::ios::binary);
    bin.write(reinterpret_cast<const char*>(bad), sizeof bad);
  }
  const IndexedDataset nonfinite(scratch.file("nonfinite"));
  const int64_t lowest = std::numeric_limits<int64_t>::min();
  CHECK(nonfinite.sequence(0) == std::vector<int64_t>{lowest, lowest, lowest, 4});
  CHECK(nonfinite.token_range() == std::pair<int64_t, int64_t>{lowest, 4});
  IndexedDatasetWriter narrow(scratch.file("narrow"), TokenType::kUint16);
  CHECK_THROWS_WITH(narrow.add_document({70000}), Contains("token 70000 does not fit dtype code 8"));
  CHECK(megaplan::exec::token_type_for_vocabulary(50257) == TokenType::kUint16);
  CHECK(megaplan::exec::token_type_for_vocabulary(128256) == TokenType::kInt32);
}

TEST_CASE("train's vocabulary: given, else the tokenizer's, else the data's largest id plus one", "[data]") {
  using megaplan::exec::Vocabulary;
  const ScratchDirectory scratch;
  const std::string prefix = scratch.file("corpus");
  IndexedDatasetWriter writer(prefix, TokenType::kUint16);
  writer.add_document({5, 300, 7});
  writer.add_document({299});
  writer.finish();
  const Vocabulary from_data = megaplan::exec::training_vocabulary(std::nullopt, std::nullopt, prefix);
  CHECK(from_data.size == 301);
  CHECK_THAT(from_data.source, Contains("the data (the largest token id in " + prefix + ".bin, plus one"));
  megaplan::exec::TokenizerOptions byte;  // --tokenizer byte: 257 tokens, fewer than the data's ids
  CHECK_THROWS_WITH(megaplan::exec::training_vocabulary(std::nullopt, byte, prefix),
                    Contains("--vocab-size: " + prefix +
                             ".bin holds the token id 300, outside the vocabulary of 257 "
                             "from the tokenizer (byte): give a vocabulary of at least 301"));
  const Vocabulary given = megaplan::exec::training_vocabulary(Vocabulary{50257, "--vocab-size"}, byte, prefix);
  CHECK(given.size == 50257);  // a stated size wins over the tokenizer's
  CHECK(given.source == "--vocab-size");
  CHECK_THROWS_WITH(megaplan::exec::training_vocabulary(Vocabulary{300, "--vocab-size"}, std::nullopt, prefix),
                    Contains("outside the vocabulary of 300 from --vocab-size"));
  IndexedDatasetWriter negative(scratch.file("negative"), TokenType::kInt32);
  negative.add_document({3, -2});
  negative.finish();
  CHECK_THROWS_WITH(megaplan::exec::training_vocabulary(std::nullopt, std::nullopt, scratch.file("negative")),
                    Contains("negative.bin holds the token id -2: token ids must be >= 0"));
  // A blend's vocabulary covers every dataset, and names the one holding the largest id.
  IndexedDatasetWriter other(scratch.file("other"), TokenType::kUint16);
  other.add_document({400});
  other.finish();
  megaplan::exec::DataBlend blend;
  blend.prefixes = {prefix, scratch.file("other")};
  const Vocabulary blended = megaplan::exec::training_vocabulary(std::nullopt, std::nullopt, blend);
  CHECK(blended.size == 401);
  CHECK_THAT(blended.source, Contains("other.bin, plus one"));
}

TEST_CASE("broken datasets are refused naming the file and the rule", "[data]") {
  const ScratchDirectory scratch;
  const std::string prefix = scratch.file("broken");
  std::string bin;
  for (int token : {1, 2, 3, 4}) put<uint16_t>(bin, static_cast<uint16_t>(token));
  const std::string good_index = index_bytes(8, 2, {3, 1}, {0, 1, 2});

  CHECK_THROWS_WITH(IndexedDataset(prefix), Contains("--data-path: " + prefix + ".idx: cannot open"));

  write_bytes(prefix + ".bin", bin);
  write_bytes(prefix + ".idx", good_index.substr(0, good_index.size() - 5));
  CHECK_THROWS_WITH(IndexedDataset(prefix), Contains(".idx: truncated") && Contains("promises 2 sequences"));

  write_bytes(prefix + ".idx", good_index);
  write_bytes(prefix + ".bin", bin.substr(0, 6));
  CHECK_THROWS_WITH(IndexedDataset(prefix), Contains(".bin: truncated: sequence 1"));

  write_bytes(prefix + ".bin", bin);
  std::string bad_magic = good_index;
  bad_magic[0] = 'X';
  write_bytes(prefix + ".idx", bad_magic);
  CHECK_THROWS_WITH(IndexedDataset(prefix), Contains("no MMIDIDX magic"));

  std::string bad_version = good_index;
  bad_version[9] = 2;
  write_bytes(prefix + ".idx", bad_version);
  CHECK_THROWS_WITH(IndexedDataset(prefix), Contains("index version 2"));

  std::string bad_code = good_index;
  bad_code[17] = 9;
  write_bytes(prefix + ".idx", bad_code);
  CHECK_THROWS_WITH(IndexedDataset(prefix), Contains("unknown dtype code 9"));

  write_bytes(prefix + ".idx", index_bytes(8, 2, {3, 1}, {0, 2, 1}));
  CHECK_THROWS_WITH(IndexedDataset(prefix), Contains("document indices must run from 0 to the sequence count 2"));

  write_bytes(prefix + ".idx", good_index);
  CHECK_NOTHROW(IndexedDataset(prefix));
}

TEST_CASE("prepare turns JSON lines and whole files into documents", "[data]") {
  const ScratchDirectory scratch;
  write_bytes(scratch.file("a.jsonl"), "{\"text\": \"ab\"}\n\n{\"text\": \"c\", \"id\": 3}\n");
  write_bytes(scratch.file("b.txt"), "xyz");
  megaplan::exec::PrepareOptions options;
  options.inputs = {scratch.file("a.jsonl"), scratch.file("b.txt")};
  options.output_prefix = scratch.file("out");
  options.append_end_of_document = true;
  const megaplan::exec::ByteTokenizer bytes;
  const megaplan::exec::PrepareSummary summary = megaplan::exec::prepare_dataset(options, bytes);
  REQUIRE(summary.datasets.size() == 1);
  CHECK(summary.datasets[0].prefix == scratch.file("out_text_document"));  // Megatron's name
  CHECK(summary.datasets[0].documents == 3);
  CHECK(summary.datasets[0].tokens == 3 + 2 + 4);
  CHECK(!std::filesystem::exists(scratch.file("out.bin")));
  const IndexedDataset dataset(scratch.file("out_text_document"));
  CHECK(dataset.token_type() == TokenType::kUint16);
  CHECK(dataset.sequence(0) == std::vector<int64_t>{'a', 'b', 256});
  CHECK(dataset.sequence(1) == std::vector<int64_t>{'c', 256});
  CHECK(dataset.sequence(2) == std::vector<int64_t>{'x', 'y', 'z', 256});

  write_bytes(scratch.file("c.jsonl"), "{\"body\": \"ab\"}\n");
  options.inputs = {scratch.file("c.jsonl")};
  options.output_prefix = scratch.file("never");
  CHECK_THROWS_WITH(megaplan::exec::prepare_dataset(options, bytes), Contains("c.jsonl:1: no string field \"text\""));
  CHECK(!anything_named(scratch.file(""), "never"));
}

TEST_CASE("prepare reads a directory's files in path order and never writes an empty dataset", "[data]") {
  const ScratchDirectory scratch;
  std::filesystem::create_directories(scratch.file("corpus/deeper"));
  write_bytes(scratch.file("corpus/b.txt"), "b");
  write_bytes(scratch.file("corpus/deeper/a.txt"), "a");
  write_bytes(scratch.file("corpus/empty.txt"), "");
  megaplan::exec::PrepareOptions options;
  options.inputs = {scratch.file("corpus")};
  options.output_prefix = scratch.file("out");
  const megaplan::exec::ByteTokenizer bytes;
  const megaplan::exec::PrepareSummary summary = megaplan::exec::prepare_dataset(options, bytes);
  CHECK(summary.datasets.at(0).documents == 2);  // the empty file adds no document
  const IndexedDataset dataset(summary.datasets.at(0).prefix);
  CHECK(dataset.sequence(0) == std::vector<int64_t>{'b'});  // corpus/b.txt before corpus/deeper/a.txt
  CHECK(dataset.sequence(1) == std::vector<int64_t>{'a'});

  std::filesystem::create_directories(scratch.file("nothing"));
  options.inputs = {scratch.file("nothing")};
  options.output_prefix = scratch.file("never");
  CHECK_THROWS_WITH(megaplan::exec::prepare_dataset(options, bytes), Contains("is a directory without files"));
  options.inputs = {scratch.file("corpus/empty.txt")};
  options.append_end_of_document = true;
  CHECK_THROWS_WITH(megaplan::exec::prepare_dataset(options, bytes),
                    Contains("--input: no text in 1 file(s): an empty dataset is not written"));
  CHECK(!anything_named(scratch.file(""), "never"));
}

TEST_CASE("--split follows Megatron's rounding", "[data]") {
  using megaplan::exec::split_documents;
  const auto thousand = split_documents("949,50,1", 1000);
  CHECK(thousand[0].begin == 0);
  CHECK(thousand[0].end == 949);
  CHECK(thousand[1].end == 999);
  CHECK(thousand[2].end == 1000);
  // Python rounds 0.5 to 0 and 9.49 to 9; the missing document goes to every boundary.
  const auto ten = split_documents("949,50,1", 10);
  CHECK(ten[0].size() == 10);
  CHECK(ten[1].size() == 0);
  CHECK(ten[2].size() == 0);
  const auto halves = split_documents("1,1", 7);
  CHECK(halves[0].size() + halves[1].size() == 7);
  CHECK(halves[2].size() == 0);
  for (const char* bad : {"a,b", "0,0", "1,2,3,4", "-1", "1,,2", ""}) {
    CHECK_THROWS_WITH(split_documents(bad, 10), Contains("--split"));
  }
}

TEST_CASE("GPT samples are overlapping windows of the shuffled document stream", "[data]") {
  const ScratchDirectory scratch;
  const std::string prefix = scratch.file("stream");
  // Token 1000 * document + position: any window shows where it came from.
  IndexedDatasetWriter writer(prefix, TokenType::kInt32);
  const std::vector<int64_t> lengths = {5, 1, 9, 3, 7};
  for (std::size_t d = 0; d < lengths.size(); ++d) {
    std::vector<int64_t> tokens;
    for (int64_t p = 0; p < lengths[d]; ++p) tokens.push_back(1000 * static_cast<int64_t>(d) + p);
    writer.add_document(tokens);
  }
  writer.finish();
  const IndexedDataset dataset(prefix);
  const int64_t seq = 4;
  const megaplan::exec::IndexCache cache{scratch.file("cache"), 1, nullptr};
  const auto spec = [&](DocumentRange documents, int64_t samples, uint64_t seed) {
    return megaplan::exec::GptSampleSpec{documents, "train", seq, samples, seed};
  };
  const megaplan::exec::GptSamples samples(dataset, spec({0, 5}, 30, 1234), cache);
  REQUIRE(samples.size() == 30);
  CHECK(samples.epochs() == 5);  // 25 tokens per epoch: (5 * 25 - 1) / 4 = 31 >= 30 samples
  std::vector<std::vector<int64_t>> seen;
  for (int64_t i = 0; i < samples.size(); ++i) {
    std::vector<int64_t> tokens(static_cast<std::size_t>(seq + 1));
    samples.sample(i, tokens.data());
    // Within a document positions count up by one; a new document starts at position 0.
    for (std::size_t k = 1; k < tokens.size(); ++k) {
      const bool next_in_document = tokens[k] == tokens[k - 1] + 1 && tokens[k] / 1000 == tokens[k - 1] / 1000;
      const bool document_ends = tokens[k - 1] % 1000 == lengths[static_cast<std::size_t>(tokens[k - 1] / 1000)] - 1;
      CHECK((next_in_document || (document_ends && tokens[k] % 1000 == 0)));
    }
    seen.push_back(tokens);
  }
  // Same seed, same samples; another seed, another order.
  const megaplan::exec::GptSamples again(dataset, spec({0, 5}, 30, 1234), cache);
  const megaplan::exec::GptSamples other(dataset, spec({0, 5}, 30, 99), cache);
  bool differs = false;
  for (int64_t i = 0; i < 30; ++i) {
    std::vector<int64_t> a(static_cast<std::size_t>(seq + 1)), b(static_cast<std::size_t>(seq + 1));
    again.sample(i, a.data());
    other.sample(i, b.data());
    CHECK(a == seen[static_cast<std::size_t>(i)]);
    differs = differs || b != seen[static_cast<std::size_t>(i)];
  }
  CHECK(differs);
  CHECK_THROWS_WITH(megaplan::exec::GptSamples(dataset, spec({1, 2}, 3, 1), cache), Contains("too few for any sample"));
}

TEST_CASE("prepare recognises JSON lines by content, whatever the file's name", "[data]") {
  const ScratchDirectory scratch;
  write_bytes(scratch.file("lines.txt"), "\n{\"text\": \"ab\"}\n{\"text\": \"c\"}\n");  // JSON lines named .txt
  write_bytes(scratch.file("plain.json.txt"), "{ not JSON\nat all");                    // one document
  write_bytes(scratch.file("corpus.json"), "{\"text\": \"d\"}\n");                      // Megatron's naming
  megaplan::exec::PrepareOptions options;
  options.inputs = {scratch.file("lines.txt"), scratch.file("plain.json.txt"), scratch.file("corpus.json")};
  options.output_prefix = scratch.file("out");
  const megaplan::exec::ByteTokenizer bytes;
  const megaplan::exec::PrepareSummary summary = megaplan::exec::prepare_dataset(options, bytes);
  CHECK(summary.datasets.at(0).documents == 4);
  const IndexedDataset dataset(summary.datasets.at(0).prefix);
  CHECK(dataset.sequence(0) == std::vector<int64_t>{'a', 'b'});
  CHECK(dataset.sequence(1) == std::vector<int64_t>{'c'});
  CHECK(dataset.sequence(2).size() == std::string("{ not JSON\nat all").size());
  CHECK(dataset.sequence(3) == std::vector<int64_t>{'d'});

  // A .json or .jsonl file must be JSON lines: a pretty-printed object, or a list, is refused.
  options.output_prefix = scratch.file("never");
  write_bytes(scratch.file("pretty.json"), "\n{\n  \"text\": \"a\"\n}\n");
  options.inputs = {scratch.file("pretty.json")};
  CHECK_THROWS_WITH(megaplan::exec::prepare_dataset(options, bytes),
                    Contains("--input: " + scratch.file("pretty.json") +
                             ":2: malformed JSON: a .json or .jsonl file must hold one JSON object per line"));
  write_bytes(scratch.file("list.jsonl"), "[1, 2]\n");
  options.inputs = {scratch.file("list.jsonl")};
  CHECK_THROWS_WITH(megaplan::exec::prepare_dataset(options, bytes), Contains("list.jsonl:1: not a JSON object"));
  CHECK(!anything_named(scratch.file(""), "never"));
}

TEST_CASE("prepare writes a dataset per --json-keys key, named as Megatron names them", "[data]") {
  const ScratchDirectory scratch;
  write_bytes(scratch.file("docs.jsonl"),
              "{\"title\": \"T\", \"text\": \"body\"}\n{\"title\": \"\", \"text\": \"x\"}\n");
  megaplan::exec::PrepareOptions options;
  options.inputs = {scratch.file("docs.jsonl")};
  options.output_prefix = scratch.file("made/deeper/out");  // its folders are created
  options.json_keys = {"title", "text"};
  const megaplan::exec::ByteTokenizer bytes;
  const megaplan::exec::PrepareSummary summary = megaplan::exec::prepare_dataset(options, bytes);
  REQUIRE(summary.datasets.size() == 2);
  CHECK(summary.datasets[0].prefix == scratch.file("made/deeper/out_title_document"));
  CHECK(summary.datasets[0].documents == 1);  // the empty title adds no document
  CHECK(summary.datasets[1].prefix == scratch.file("made/deeper/out_text_document"));
  CHECK(summary.datasets[1].documents == 2);
  CHECK(IndexedDataset(summary.datasets[0].prefix).sequence(0) == std::vector<int64_t>{'T'});
  CHECK(IndexedDataset(summary.datasets[1].prefix).sequence(1) == std::vector<int64_t>{'x'});

  // A whole file is key "text"; keys without it cannot take one. Nothing is written, not even the
  // folders the run made.
  write_bytes(scratch.file("whole.txt"), "words");
  options.inputs = {scratch.file("docs.jsonl"), scratch.file("whole.txt")};
  options.output_prefix = scratch.file("never/out");
  options.json_keys = {"title"};
  CHECK_THROWS_WITH(megaplan::exec::prepare_dataset(options, bytes),
                    Contains("whole.txt: is not JSON lines, so its whole text is key \"text\", which --json-keys does "
                             "not name"));
  options.inputs = {scratch.file("docs.jsonl")};
  options.json_keys = {"title", "summary"};
  CHECK_THROWS_WITH(megaplan::exec::prepare_dataset(options, bytes),
                    Contains("docs.jsonl:1: no string field \"summary\""));
  CHECK(!anything_named(scratch.file(""), "never"));

  using megaplan::exec::check_prepare_options;
  options.json_keys = {"text", "text"};
  CHECK_THROWS_WITH(check_prepare_options(options), Contains("--json-keys: \"text\" is given twice"));
  options.json_keys = {"a/b"};
  CHECK_THROWS_WITH(check_prepare_options(options), Contains("--json-keys: \"a/b\" must not hold a '/'"));
  options.json_keys = {""};
  CHECK_THROWS_WITH(check_prepare_options(options), Contains("--json-keys: a key must not be empty"));
  options.json_keys = {"text"};
  options.workers = 0;
  CHECK_THROWS_WITH(check_prepare_options(options), Contains("--workers: must be at least 1, got 0"));
  options.workers = 5000;
  CHECK_THROWS_WITH(check_prepare_options(options), Contains("--workers"));
}

TEST_CASE("--data-path reads Megatron's blends", "[data]") {
  using megaplan::exec::parse_data_blend;
  CHECK(parse_data_blend({"A"}).prefixes == std::vector<std::string>{"A"});
  CHECK(!parse_data_blend({"A"}).weighted());
  CHECK(parse_data_blend({" A ", "B"}).prefixes == std::vector<std::string>{"A", "B"});  // no numbers: all prefixes
  CHECK(parse_data_blend({"0.3", "A", "B"}).prefixes.size() == 3);                       // odd: all prefixes
  const megaplan::exec::DataBlend weighted = parse_data_blend({"3", "A", "7", "B"});
  CHECK(weighted.prefixes == std::vector<std::string>{"A", "B"});
  REQUIRE(weighted.weights.size() == 2);
  CHECK(weighted.weights[0] == Approx(0.3));
  CHECK(weighted.weights[1] == Approx(0.7));
  CHECK_THROWS_WITH(parse_data_blend({}), Contains("--data-path: needs a dataset prefix"));
  CHECK_THROWS_WITH(parse_data_blend({"0.3", "A", "B", "C"}),
                    Contains("--data-path: \"B\" (word 3) is no weight where other prefixes have one"));
  for (const char* bad : {"0", "-1", "inf", "nan"}) {
    CHECK_THROWS_WITH(parse_data_blend({bad, "A"}), Contains("must be a positive finite number"));
  }
  CHECK_THROWS_WITH(parse_data_blend({"1", " "}), Contains("a dataset prefix must not be empty"));
}

TEST_CASE("a blend draws each dataset's share as Megatron's BlendedDataset does", "[data]") {
  // Megatron's build_blending_indices by hand: each sample from the dataset furthest behind.
  const auto blended = [](const std::vector<double>& weights, int64_t size) {
    std::pair<std::vector<std::size_t>, std::vector<int64_t>> index;
    megaplan::exec::blend_samples(weights, size, [&](std::size_t dataset, int64_t sample) {
      index.first.push_back(dataset);
      index.second.push_back(sample);
    });
    return index;
  };
  const auto index = blended({0.3, 0.7}, 10);
  CHECK(index.first == std::vector<std::size_t>{1, 0, 1, 1, 0, 1, 1, 0, 1, 1});
  CHECK(index.second == std::vector<int64_t>{0, 0, 1, 2, 1, 3, 4, 2, 5, 6});
  const auto three = blended({0.2, 0.5, 0.3}, 1000);
  for (std::size_t d = 0; d < 3; ++d) {
    const auto count = std::count(three.first.begin(), three.first.end(), d);
    CHECK(std::abs(static_cast<double>(count) - 1000 * std::vector<double>{0.2, 0.5, 0.3}[d]) <= 1);
  }

  // Two datasets whose tokens say where they come from: 1000 * document + position, plus 100000 in B.
  const ScratchDirectory scratch;
  for (const int64_t base : {int64_t{0}, int64_t{100000}}) {
    IndexedDatasetWriter writer(scratch.file(base == 0 ? "A" : "B"), TokenType::kInt32);
    for (int64_t d = 0; d < 20; ++d) {
      std::vector<int64_t> tokens;
      for (int64_t p = 0; p < 10 + d; ++p) tokens.push_back(base + 1000 * d + p);
      writer.add_document(tokens);
    }
    writer.finish();
  }
  megaplan::exec::DataBlend blend =
      megaplan::exec::parse_data_blend({"0.3", scratch.file("A"), "0.7", scratch.file("B")});
  const auto datasets = megaplan::exec::open_datasets(blend);
  const int64_t seq = 8;
  const megaplan::exec::IndexCache cache{scratch.file("cache"), 1, nullptr};
  const megaplan::exec::BlendedSamples samples(blend, datasets, "1", 0, seq, 400, 1234, cache);
  CHECK(samples.size() == 400);  // ceil(400 x 0.3) + ceil(400 x 0.7)
  const std::vector<int64_t> shares = samples.samples_per_dataset();
  CHECK(shares[0] + shares[1] == 400);
  CHECK(std::abs(shares[0] - 120) <= 1);  // each share within one sample of its weight's
  const megaplan::exec::BlendedSamples again(blend, datasets, "1", 0, seq, 400, 1234, cache);
  std::vector<int64_t> from(2, 0);
  for (int64_t i = 0; i < samples.size(); ++i) {
    std::vector<int64_t> tokens(seq + 1), repeated(seq + 1);
    samples.sample(i, tokens.data());
    again.sample(i, repeated.data());
    CHECK(tokens == repeated);  // deterministic
    ++from[tokens[0] >= 100000 ? 1 : 0];
    CHECK(std::all_of(tokens.begin(), tokens.end(), [&](int64_t t) { return (t >= 100000) == (tokens[0] >= 100000); }));
  }
  CHECK(from == shares);  // each sample read from the dataset its index names

  // Without weights, each dataset's share is the samples an epoch of it holds, and no more.
  blend = megaplan::exec::parse_data_blend({scratch.file("A"), scratch.file("B")});
  const megaplan::exec::BlendedSamples sized(blend, datasets, "1", 0, seq, 50, 7, cache);
  const std::vector<int64_t> drawn = sized.samples_per_dataset();
  CHECK(drawn[0] + drawn[1] == 50);
  CHECK(drawn[0] == 25);  // A and B hold the same tokens per epoch: (390 - 1) / 8 = 48 samples each
  CHECK_THROWS_WITH(megaplan::exec::BlendedSamples(blend, datasets, "1", 0, seq, 97, 7, cache),
                    Contains("--data-path: the 2 datasets given without weights hold 96 training samples of 9 tokens"));

  // One prefix without a weight is that dataset's samples, exactly.
  blend = megaplan::exec::DataBlend(scratch.file("A"));
  const std::vector<std::unique_ptr<IndexedDataset>> one = megaplan::exec::open_datasets(blend);
  const megaplan::exec::BlendedSamples single(blend, one, "1", 0, seq, 30, 1234, cache);
  const megaplan::exec::GptSamples direct(*one[0], {{0, 20}, "train", seq, 30, 1234}, cache);
  REQUIRE(single.size() == 30);
  for (int64_t i = 0; i < 30; ++i) {
    std::vector<int64_t> a(seq + 1), b(seq + 1);
    single.sample(i, a.data());
    direct.sample(i, b.data());
    CHECK(a == b);
  }
}
