// The sample indexes cached on disk (executor/data/gpt_sample_index.h, index_cache.h) against the
// in-memory indexes they replace, kept here as the reference: equal entry for entry, on one thread
// and several, in every width; built once and reused, rebuilt when stale, one building rank while
// the others wait; damaged files and unwritable folders refused in one line.
#include <catch2/catch.hpp>

#include <linux/capability.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "executor/data/blended_samples.h"
#include "executor/data/data_blend.h"
#include "executor/data/gpt_dataset.h"
#include "executor/data/index_cache.h"
#include "executor/data/index_file.h"
#include "executor/data/indexed_dataset.h"
#include "tests/executor/train/training_fixtures.h"

using Catch::Matchers::Contains;
using megaplan::exec::DocumentRange;
using megaplan::exec::GptSamples;
using megaplan::exec::GptSampleSpec;
using megaplan::exec::IndexCache;
using megaplan::exec::IndexedDataset;
using megaplan::exec::IndexedDatasetWriter;
using megaplan::exec::TokenType;
using megaplan::test::ScratchDirectory;

namespace {

// The indexes as GptSamples held them in memory before they were cached, written as plainly as
// then: every epoch's order shuffled in turn, the stream walked sample by sample, then the shuffle.
struct ReferenceIndex {
  int64_t epochs = 0;
  std::vector<int32_t> documents;              // sequences, epoch after epoch
  std::vector<std::array<int64_t, 2>> starts;  // per sample: position in documents, token offset
  std::vector<int64_t> shuffle;
};

uint64_t reference_below(std::mt19937_64& generator, uint64_t bound) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t draw = generator();
  while (draw >= limit) draw = generator();
  return draw % bound;
}

template <typename T>
void reference_shuffle(std::vector<T>& values, std::mt19937_64& generator) {
  for (std::size_t i = values.size(); i > 1; --i) {
    std::swap(values[i - 1], values[static_cast<std::size_t>(reference_below(generator, i))]);
  }
}

ReferenceIndex reference_index(const IndexedDataset& dataset, DocumentRange documents, int64_t seq_length,
                               int64_t num_samples, uint64_t seed) {
  ReferenceIndex index;
  const int64_t first = dataset.document_start(static_cast<std::size_t>(documents.begin));
  const int64_t last = dataset.document_start(static_cast<std::size_t>(documents.end));
  int64_t tokens_per_epoch = 0;
  for (int64_t s = first; s < last; ++s) tokens_per_epoch += dataset.sequence_length(static_cast<std::size_t>(s));
  index.epochs = 1;
  while ((index.epochs * tokens_per_epoch - 1) / seq_length < num_samples) ++index.epochs;
  std::mt19937_64 generator(seed);
  for (int64_t epoch = 0; epoch < index.epochs; ++epoch) {
    std::vector<int32_t> order;
    for (int64_t s = first; s < last; ++s) order.push_back(static_cast<int32_t>(s));
    reference_shuffle(order, generator);
    index.documents.insert(index.documents.end(), order.begin(), order.end());
  }
  std::size_t position = 0;
  int64_t offset = 0;
  for (int64_t sample = 0; sample < num_samples; ++sample) {
    index.starts.push_back({static_cast<int64_t>(position), offset});
    int64_t remaining = seq_length;
    while (remaining > 0) {
      const int64_t length = dataset.sequence_length(static_cast<std::size_t>(index.documents[position]));
      if (offset + remaining < length) {
        offset += remaining;
        remaining = 0;
      } else {
        remaining -= length - offset;
        offset = 0;
        ++position;
      }
    }
  }
  index.shuffle.resize(index.starts.size());
  for (std::size_t i = 0; i < index.shuffle.size(); ++i) index.shuffle[i] = static_cast<int64_t>(i);
  reference_shuffle(index.shuffle, generator);
  return index;
}

// A dataset of one document per length; token 1000 x document + position.
std::string write_dataset(const std::string& prefix, const std::vector<int64_t>& lengths) {
  IndexedDatasetWriter writer(prefix, TokenType::kInt32);
  for (std::size_t d = 0; d < lengths.size(); ++d) {
    std::vector<int64_t> tokens;
    for (int64_t p = 0; p < lengths[d]; ++p) tokens.push_back(1000 * static_cast<int64_t>(d) + p);
    writer.add_document(tokens);
  }
  writer.finish();
  return prefix;
}

GptSampleSpec spec(DocumentRange documents, int64_t seq_length, int64_t num_samples, uint64_t seed) {
  return GptSampleSpec{documents, "train", seq_length, num_samples, seed};
}

void check_equal(const GptSamples& cached, const ReferenceIndex& reference, const IndexedDataset& dataset) {
  REQUIRE(cached.size() == static_cast<int64_t>(reference.shuffle.size()));
  REQUIRE(cached.epochs() == reference.epochs);
  REQUIRE(cached.document_index_size() == static_cast<int64_t>(reference.documents.size()));
  bool documents_equal = true;
  for (std::size_t p = 0; p < reference.documents.size(); ++p) {
    documents_equal = documents_equal && cached.document(static_cast<int64_t>(p)) == reference.documents[p];
  }
  CHECK(documents_equal);
  bool starts_equal = true;
  bool shuffle_equal = true;
  for (std::size_t k = 0; k < reference.starts.size(); ++k) {
    const GptSamples::Start start = cached.start(static_cast<int64_t>(k));
    starts_equal = starts_equal && start.position == reference.starts[k][0] && start.offset == reference.starts[k][1];
    shuffle_equal = shuffle_equal && cached.shuffled(static_cast<int64_t>(k)) == reference.shuffle[k];
  }
  CHECK(starts_equal);
  CHECK(shuffle_equal);
  // And the tokens: the first samples read through the indexes are the reference's windows.
  const int64_t seq = cached.seq_length();
  for (int64_t i = 0; i < std::min<int64_t>(cached.size(), 50); ++i) {
    std::vector<int64_t> tokens(static_cast<std::size_t>(seq + 1));
    cached.sample(i, tokens.data());
    std::vector<int64_t> expected;
    auto position = static_cast<std::size_t>(reference.starts[static_cast<std::size_t>(reference.shuffle[i])][0]);
    int64_t offset = reference.starts[static_cast<std::size_t>(reference.shuffle[i])][1];
    while (static_cast<int64_t>(expected.size()) < seq + 1) {
      const std::vector<int64_t> sequence = dataset.sequence(static_cast<std::size_t>(reference.documents[position++]));
      for (auto t = static_cast<std::size_t>(offset);
           t < sequence.size() && static_cast<int64_t>(expected.size()) < seq + 1; ++t) {
        expected.push_back(sequence[t]);
      }
      offset = 0;
    }
    CHECK(tokens == expected);
  }
}

// Takes from the calling thread (capabilities are per thread) root's power to override file
// permissions, as access() judges them: from the permitted set too, for good.
void drop_permission_override() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  REQUIRE(::syscall(SYS_capget, &header, data) == 0);
  const uint32_t override_bits = (1u << CAP_DAC_OVERRIDE) | (1u << CAP_DAC_READ_SEARCH);
  data[0].effective &= ~override_bits;
  data[0].permitted &= ~override_bits;
  REQUIRE(::syscall(SYS_capset, &header, data) == 0);
}

std::vector<std::string> files_in(const std::string& folder) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) names.push_back(entry.path().string());
  return names;
}

}  // namespace

TEST_CASE("the cached sample index equals the in-memory one", "[data][index]") {
  const ScratchDirectory scratch;
  struct Case {
    std::vector<int64_t> lengths;
    DocumentRange documents;
    int64_t seq_length;
    int64_t samples;
  };
  std::vector<Case> cases = {
      {{5, 1, 9, 3, 7}, {0, 5}, 4, 30},           // samples across documents and epochs
      {{5, 1, 9, 3, 7}, {1, 4}, 1, 12},           // a split in the middle; samples of two tokens
      {{0, 4, 0, 0, 6, 2, 0}, {0, 7}, 3, 40},     // empty sequences, also at an epoch's end
      {{6, 6, 6, 6}, {0, 4}, 6, 23},              // samples ending exactly at sequence ends
      {{12}, {0, 1}, 5, 2},                       // one epoch of one sequence
      {{3, 8, 2, 9, 4, 1, 7}, {0, 7}, 8, 70000},  // 16-bit no more: a shuffle of 4-byte entries
      {{1, 2, 1}, {0, 3}, 1, 1500000},            // 1.1 M document entries: two chunks of epochs
  };
  // 70000 sequences of 1 to 3 tokens: slots of 4 bytes.
  std::vector<int64_t> many(70000);
  for (std::size_t i = 0; i < many.size(); ++i) many[i] = 1 + static_cast<int64_t>(i % 3);
  cases.push_back({many, {0, 70000}, 64, 4000});
  for (std::size_t c = 0; c < cases.size(); ++c) {
    const Case& test = cases[c];
    const IndexedDataset dataset(write_dataset(scratch.file("case" + std::to_string(c)), test.lengths));
    for (const uint64_t seed : c == 0 ? std::vector<uint64_t>{1234, 7} : std::vector<uint64_t>{1234}) {
      const ReferenceIndex reference = reference_index(dataset, test.documents, test.seq_length, test.samples, seed);
      for (const int64_t threads : {int64_t{1}, int64_t{3}}) {
        INFO("case " << c << ", seed " << seed << ", " << threads << " thread(s)");
        // Each build in a folder of its own: the second thread count builds rather than loads.
        const IndexCache cache{
            scratch.file("cache" + std::to_string(c) + "-" + std::to_string(seed) + "-" + std::to_string(threads)),
            threads, nullptr};
        const GptSamples cached(dataset, spec(test.documents, test.seq_length, test.samples, seed), cache);
        check_equal(cached, reference, dataset);
      }
    }
  }
}

TEST_CASE("a sample index is built once, beside the data, and reused", "[data][index]") {
  const ScratchDirectory scratch;
  const std::string prefix = write_dataset(scratch.file("corpus"), {5, 1, 9, 3, 7});
  const IndexedDataset dataset(prefix);
  std::ostringstream log;
  const IndexCache beside{std::nullopt, 2, &log};
  const GptSamples built(dataset, spec({0, 5}, 4, 30, 1234), beside);
  // Megatron's folder and naming: PREFIX/cache/GPTDataset_indices/<hash>-GPTDataset-train-...
  const std::string folder = prefix + "/cache/GPTDataset_indices";
  const std::vector<std::string> files = files_in(folder);
  REQUIRE(files.size() == 1);
  CHECK(std::regex_match(files[0], std::regex(".*/[0-9a-f]{16}-GPTDataset-train-indices\\.bin")));
  CHECK_THAT(log.str(), Contains("built the index of the train samples of " + prefix));
  struct stat before {};
  REQUIRE(::stat(files[0].c_str(), &before) == 0);

  log.str("");
  const GptSamples loaded(dataset, spec({0, 5}, 4, 30, 1234), beside);
  CHECK_THAT(log.str(), Contains("loaded the index of the train samples of " + prefix + ": " + files[0]));
  struct stat after {};
  REQUIRE(::stat(files[0].c_str(), &after) == 0);
  CHECK(after.st_ino == before.st_ino);
  std::vector<int64_t> a(5), b(5);
  for (int64_t i = 0; i < 30; ++i) {
    built.sample(i, a.data());
    loaded.sample(i, b.data());
    CHECK(a == b);
  }
  // Another seed, length or sample count is another file; --data-cache-path is used as given.
  const GptSamples reseeded(dataset, spec({0, 5}, 4, 30, 99), beside);
  const GptSamples longer(dataset, spec({0, 5}, 5, 30, 1234), beside);
  CHECK(files_in(folder).size() == 3);
  const IndexCache elsewhere{scratch.file("shared/cache"), 1, nullptr};
  const GptSamples there(dataset, spec({0, 5}, 4, 30, 1234), elsewhere);
  CHECK(files_in(scratch.file("shared/cache")).size() == 1);
}

TEST_CASE("a stale sample index is rebuilt, a damaged one refused", "[data][index]") {
  const ScratchDirectory scratch;
  const std::string prefix = write_dataset(scratch.file("corpus"), {5, 1, 9, 3, 7});
  std::ostringstream log;
  const IndexCache cache{scratch.file("cache"), 1, &log};
  std::string file;
  {
    const IndexedDataset dataset(prefix);
    const GptSamples samples(dataset, spec({0, 5}, 4, 30, 1234), cache);
    file = files_in(scratch.file("cache")).at(0);
  }
  // The data prepared again under the same prefix: the index it recorded no longer holds.
  write_dataset(prefix, {5, 1, 9, 3, 8});
  {
    const IndexedDataset dataset(prefix);
    log.str("");
    const GptSamples samples(dataset, spec({0, 5}, 4, 30, 1234), cache);
    CHECK_THAT(log.str(), Contains("rebuilt the index of the train samples of " + prefix + " (stale: " + prefix +
                                   ".bin's size or modification time changed since it was built) in "));
    check_equal(samples, reference_index(dataset, {0, 5}, 4, 30, 1234), dataset);
  }
  const IndexedDataset dataset(prefix);
  const auto damage = [&](std::streamoff at, const std::string& bytes) {
    std::fstream stream(file, std::ios::in | std::ios::out | std::ios::binary);
    stream.seekp(at);
    stream.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  };
  const std::string damaged = "--data-cache-path: " + file + ": ";
  const std::string advice = ": the cached index is damaged; delete it to build it again";
  // A header byte changed.
  damage(40, "X");
  CHECK_THROWS_WITH(GptSamples(dataset, spec({0, 5}, 4, 30, 1234), cache),
                    Contains(damaged + "its header fails its checksum" + advice));
  GptSamples(dataset, spec({0, 5}, 4, 30, 99), cache);  // another request is not stopped by it
  std::filesystem::remove(file);
  { const GptSamples rebuilt(dataset, spec({0, 5}, 4, 30, 1234), cache); }
  // A header's size below its own framing.
  damage(8, std::string(8, '\0'));
  CHECK_THROWS_WITH(GptSamples(dataset, spec({0, 5}, 4, 30, 1234), cache),
                    Contains(damaged + "its header's sizes (0 bytes, "));
  std::filesystem::remove(file);
  { const GptSamples rebuilt(dataset, spec({0, 5}, 4, 30, 1234), cache); }
  // Cut short.
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 1);
  CHECK_THROWS_WITH(GptSamples(dataset, spec({0, 5}, 4, 30, 1234), cache), Contains(damaged + "truncated: "));
  std::filesystem::remove(file);
  // An entry out of range is refused when it is read, never followed.
  const GptSamples rebuilt(dataset, spec({0, 5}, 4, 30, 1234), cache);
  const std::string header(4096, '\0');
  std::ifstream(file, std::ios::binary).read(const_cast<char*>(header.data()), 4096);
  const std::smatch found = [&] {
    std::smatch match;
    std::regex_search(header, match, std::regex("\"name\":\"shuffle_index\",\"offset\":([0-9]+)"));
    return match;
  }();
  REQUIRE(found.size() == 2);
  damage(std::stoll(found[1].str()), std::string(2, '\xff'));  // entry 0: 65535, beyond 30 samples
  std::vector<int64_t> tokens(5);
  CHECK_THROWS_WITH(rebuilt.sample(0, tokens.data()),
                    Contains(damaged + "shuffle entry 0 is 65535, not one of the 30 samples" + advice));
}

TEST_CASE("a cache folder that cannot be written is refused where an index must be built", "[data][index]") {
  const ScratchDirectory scratch;
  const std::string prefix = write_dataset(scratch.file("corpus"), {5, 1, 9, 3, 7});
  const IndexedDataset dataset(prefix);
  std::ofstream(scratch.file("plain")) << "a file, not a folder";
  const IndexCache under_a_file{scratch.file("plain/cache"), 1, nullptr};
  CHECK_THROWS_WITH(GptSamples(dataset, spec({0, 5}, 4, 30, 1234), under_a_file),
                    Contains("--data-cache-path: " + scratch.file("plain/cache") +
                             ": cannot create the cache folder (Not a directory): give --data-cache-path a writable "
                             "folder"));
  // The default folder beside the data: named by --data-path.
  const std::string readonly = scratch.file("readonly");
  std::filesystem::create_directories(readonly);
  const IndexCache cache{readonly, 1, nullptr};
  const GptSamples built(dataset, spec({0, 5}, 4, 30, 1234), cache);
  ::chmod(readonly.c_str(), 0555);
  // On a thread that file permissions bind, even where the tests run as root.
  std::thread([&] {
    drop_permission_override();
    const GptSamples reused(dataset, spec({0, 5}, 4, 30, 1234), cache);  // a current index is only read
    CHECK(reused.size() == 30);
    CHECK_THROWS_WITH(GptSamples(dataset, spec({0, 5}, 4, 31, 1234), cache),
                      Contains("--data-cache-path: " + readonly +
                               " is not writable (Permission denied) and the index of the train samples of " + prefix +
                               " must be built; give --data-cache-path a writable folder"));
  }).join();
  ::chmod(readonly.c_str(), 0755);
}

TEST_CASE("ranks sharing a cache folder build an index once", "[data][index]") {
  const ScratchDirectory scratch;
  const std::string prefix = write_dataset(scratch.file("corpus"), {3, 8, 2, 9, 4, 1, 7});
  const IndexedDataset dataset(prefix);
  // Threads stand in for a machine's ranks: each opens the folder on its own, so their locks
  // exclude each other as processes' do.
  constexpr int kRanks = 4;
  std::vector<std::ostringstream> logs(kRanks);
  std::vector<std::vector<int64_t>> firsts(kRanks, std::vector<int64_t>(9));
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < kRanks; ++rank) {
    ranks.emplace_back([&, rank] {
      const IndexCache cache{scratch.file("cache"), 1, &logs[static_cast<std::size_t>(rank)]};
      const GptSamples samples(dataset, spec({0, 7}, 8, 200000, 1234), cache);
      samples.sample(0, firsts[static_cast<std::size_t>(rank)].data());
    });
  }
  for (std::thread& rank : ranks) rank.join();
  int built = 0;
  for (const std::ostringstream& log : logs) built += log.str().find("built the index") != std::string::npos ? 1 : 0;
  CHECK(built == 1);
  for (int rank = 1; rank < kRanks; ++rank) CHECK(firsts[static_cast<std::size_t>(rank)] == firsts[0]);
  CHECK(files_in(scratch.file("cache")).size() == 1);  // and no temporary file left
}

TEST_CASE("the blend's cached index draws as Megatron's helper does", "[data][index]") {
  const ScratchDirectory scratch;
  const std::string a = write_dataset(scratch.file("A"), {5, 1, 9, 3, 7});
  const std::string b = write_dataset(scratch.file("B"), {4, 4, 4, 4});
  const megaplan::exec::DataBlend blend = megaplan::exec::parse_data_blend({"1", a, "3", b});
  const auto datasets = megaplan::exec::open_datasets(blend);
  std::ostringstream log;
  const IndexCache cache{std::nullopt, 2, &log};
  const megaplan::exec::BlendedSamples samples(blend, datasets, "1", 0, 4, 70000, 1234, cache);
  // The blend's file sits beside the first dataset, the parts' beside their own.
  CHECK(files_in(a + "/cache/BlendedDataset_indices").size() == 1);
  CHECK(files_in(b + "/cache/GPTDataset_indices").size() == 1);
  CHECK_THAT(log.str(), Contains("built the index of the train samples of " + b));
  CHECK_THAT(log.str(), Contains("built the index of the training blend of 2 datasets"));
  std::vector<int64_t> drawn(2, 0);
  std::vector<std::array<int64_t, 2>> reference;
  megaplan::exec::blend_samples(blend.weights, 70000, [&](std::size_t dataset, int64_t index) {
    reference.push_back({static_cast<int64_t>(dataset), index});
    ++drawn[dataset];
  });
  REQUIRE(samples.size() == 70000);
  CHECK(samples.samples_per_dataset() == drawn);
  // Sample k is sample reference[k] of its dataset: each builds ceil(N w x 1.005) samples.
  const GptSamples part_a(*datasets[0], spec({0, 5}, 4, 17588, 1234), IndexCache{std::nullopt, 1, nullptr});
  std::ostringstream parts_log;
  const GptSamples part_b(*datasets[1], spec({0, 4}, 4, 52763, 1234), IndexCache{std::nullopt, 1, &parts_log});
  CHECK_THAT(parts_log.str(), Contains("loaded"));  // the blend's own part
  bool equal = true;
  std::vector<int64_t> tokens(5), expected(5);
  for (std::size_t k = 0; k < reference.size(); k += 97) {
    samples.sample(static_cast<int64_t>(k), tokens.data());
    (reference[k][0] == 0 ? part_a : part_b).sample(reference[k][1], expected.data());
    equal = equal && tokens == expected;
  }
  CHECK(equal);
}

TEST_CASE("beyond 2^32 samples the indexes widen to 64 bits", "[data][index]") {
  using megaplan::exec::index_width;
  CHECK(index_width(65535) == 2);
  CHECK(index_width(65536) == 4);
  CHECK(index_width(UINT32_MAX) == 4);
  CHECK(index_width(uint64_t{1} << 32) == 8);

  // A section of 8-byte entries, written from narrower and wider values, read back whole.
  const ScratchDirectory scratch;
  const std::string path = scratch.file("wide.bin");
  megaplan::exec::IndexFileWriter writer(path,
                                         {{"description", {}}, {"inputs", nlohmann::json::array()}, {"facts", {}}},
                                         {{"narrow", 2, 3}, {"wide", index_width(uint64_t{5} << 32), 3}});
  const std::vector<uint32_t> narrow = {1, 65535, 7};
  const std::vector<uint64_t> wide = {uint64_t{5} << 32, 3, (uint64_t{5} << 32) + 1};
  writer.write(0, 0, narrow.data(), narrow.size());
  writer.write(1, 0, wide.data(), wide.size());
  writer.commit();
  const megaplan::exec::MappedIndexFile file(path, "--data-cache-path");
  const megaplan::exec::PackedArray read_narrow = file.section("narrow");
  const megaplan::exec::PackedArray read_wide = file.section("wide");
  REQUIRE(read_wide.width() == 8);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(read_narrow[i] == narrow[i]);
    CHECK(read_wide[i] == wide[i]);
  }

  // 2^34 samples of 8192 tokens over a million-token split: each sample's epoch holds its start.
  megaplan::exec::EpochLayout layout;
  layout.sequences = 1000;
  layout.tokens_per_epoch = 1000003;
  layout.seq_length = 8192;
  layout.samples = int64_t{1} << 34;
  layout.epochs = (layout.samples * layout.seq_length + layout.tokens_per_epoch) / layout.tokens_per_epoch;
  for (const int64_t k : {int64_t{0}, int64_t{1}, int64_t{1} << 32, (int64_t{1} << 32) + 1, layout.samples - 1}) {
    const int64_t epoch = layout.epoch_of(k);
    INFO("sample " << k << ", epoch " << epoch);
    CHECK(layout.first_sample(epoch) <= k);
    CHECK(k < layout.first_sample(epoch + 1));
    CHECK(epoch < layout.epochs);
  }
}
