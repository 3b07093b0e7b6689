#include "executor/data/prepare.h"

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <exception>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>
#include <system_error>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/input_limits.h"
#include "core/json_io.h"
#include "executor/data/indexed_dataset.h"
#include "executor/data/input_reader.h"

namespace megaplan::exec {

namespace {

// Records read ahead per worker before they are tokenized together: enough text that a batch
// outweighs starting its threads, little enough to bound the memory its tokens take.
constexpr int64_t kBatchBytesPerWorker = int64_t{4} << 20;
constexpr std::size_t kBatchRecordsPerWorker = 4096;

// The folders above the output that did not exist, created; removed again (those still empty)
// unless kept, so a failed run leaves no folder behind either.
class OutputFolders {
 public:
  explicit OutputFolders(const std::string& output_prefix) {
    std::vector<std::filesystem::path> missing;
    std::error_code error;
    for (std::filesystem::path folder = std::filesystem::path(output_prefix).parent_path();
         !folder.empty() && !std::filesystem::exists(folder, error); folder = folder.parent_path()) {
      missing.push_back(folder);
      if (folder == folder.parent_path()) break;
    }
    for (auto folder = missing.rbegin(); folder != missing.rend(); ++folder) {
      if (!std::filesystem::create_directory(*folder, error) && error) {
        throw SpecError("--output-prefix", folder->string() + ": cannot create the folder: " + error.message());
      }
      created_.push_back(*folder);
    }
  }
  ~OutputFolders() {
    for (auto folder = created_.rbegin(); folder != created_.rend(); ++folder) {
      std::error_code ignored;
      std::filesystem::remove(*folder, ignored);  // only an empty folder goes
    }
  }
  OutputFolders(const OutputFolders&) = delete;
  OutputFolders& operator=(const OutputFolders&) = delete;
  void keep() { created_.clear(); }

 private:
  std::vector<std::filesystem::path> created_;
};

// One record's documents, a token list per key (empty: no text), or why the record is refused.
struct EncodedRecord {
  std::vector<std::vector<int64_t>> documents;
  std::exception_ptr error;
};

void encode_record(const InputRecord& record, const std::vector<std::string>& keys, const Tokenizer& tokenizer,
                   std::optional<int64_t> end_of_document, EncodedRecord& out) {
  out.documents.assign(keys.size(), {});
  const auto add = [&](std::size_t key, std::string_view text) {
    std::vector<int64_t> tokens = tokenizer.encode(text);
    // A document without text adds nothing, not even its end-of-document token.
    if (!tokens.empty() && end_of_document) tokens.push_back(*end_of_document);
    out.documents[key] = std::move(tokens);
  };
  if (!record.json) {
    const auto text_key = std::find(keys.begin(), keys.end(), "text");
    if (text_key == keys.end()) {
      throw SpecError("--input", record.where() +
                                     ": is not JSON lines, so its whole text is key \"text\", which "
                                     "--json-keys does not name");
    }
    add(static_cast<std::size_t>(text_key - keys.begin()), record.text);
    return;
  }
  const std::optional<nlohmann::json> parsed = try_parse_json(record.text);
  if (!parsed) throw SpecError("--input", record.where() + ": malformed JSON");
  if (!parsed->is_object()) throw SpecError("--input", record.where() + ": not a JSON object");
  for (std::size_t key = 0; key < keys.size(); ++key) {
    const auto field = parsed->find(keys[key]);
    if (field == parsed->end() || !field->is_string()) {
      throw SpecError("--input", record.where() + ": no string field \"" + keys[key] + "\"");
    }
    add(key, field->get_ref<const std::string&>());
  }
}

// Tokenizes `records` on `workers` threads (this one among them); each result lands at its
// record's index, so the order of the output never depends on the threads'.
void encode_batch(const std::vector<InputRecord>& records, const std::vector<std::string>& keys,
                  const Tokenizer& tokenizer, std::optional<int64_t> end_of_document, int64_t workers,
                  std::vector<EncodedRecord>& out) {
  out.resize(records.size());
  if (records.empty()) return;
  std::atomic<std::size_t> next{0};
  const auto work = [&] {
    for (std::size_t i = next++; i < records.size(); i = next++) {
      try {
        encode_record(records[i], keys, tokenizer, end_of_document, out[i]);
      } catch (...) {
        out[i].error = std::current_exception();
      }
    }
  };
  const auto helpers = static_cast<std::size_t>(std::min<int64_t>(workers, static_cast<int64_t>(records.size())) - 1);
  std::vector<std::thread> threads;
  std::exception_ptr spawn_error;  // raised once the threads that did start are joined
  try {
    for (std::size_t t = 0; t < helpers; ++t) threads.emplace_back(work);
  } catch (...) {
    spawn_error = std::current_exception();
  }
  work();
  for (std::thread& thread : threads) thread.join();
  if (spawn_error) std::rethrow_exception(spawn_error);
}

}  // namespace

std::string dataset_prefix(const std::string& output_prefix, const std::string& key) {
  return output_prefix + "_" + key + "_document";
}

void check_prepare_options(const PrepareOptions& options) {
  if (options.inputs.empty()) throw SpecError("--input", "at least one input file is needed");
  if (options.output_prefix.empty()) throw SpecError("--output-prefix", "must not be empty");
  if (options.json_keys.empty()) throw SpecError("--json-keys", "needs at least one key");
  for (std::size_t i = 0; i < options.json_keys.size(); ++i) {
    const std::string& key = options.json_keys[i];
    if (key.empty()) throw SpecError("--json-keys", "a key must not be empty");
    // The key names a file (PREFIX_<key>_document.bin): no folder, no second dataset of one name.
    if (key.find('/') != std::string::npos) throw SpecError("--json-keys", "\"" + key + "\" must not hold a '/'");
    if (std::find(options.json_keys.begin(), options.json_keys.begin() + static_cast<std::ptrdiff_t>(i), key) !=
        options.json_keys.begin() + static_cast<std::ptrdiff_t>(i)) {
      throw SpecError("--json-keys", "\"" + key + "\" is given twice");
    }
  }
  check_workers(options.workers);
}

void check_workers(int64_t workers) {
  if (workers < 1) throw SpecError("--workers", "must be at least 1, got " + std::to_string(workers));
  require_at_most(workers, kMaxThreads, "--workers");
}

PrepareSummary prepare_dataset(const PrepareOptions& options, const Tokenizer& tokenizer) {
  check_prepare_options(options);
  // Asked before anything is written, so a tokenizer without one fails with no output.
  const std::optional<int64_t> end_of_document =
      options.append_end_of_document ? std::optional(tokenizer.end_of_document()) : std::nullopt;
  InputReader reader(options.inputs);
  OutputFolders folders(options.output_prefix);
  PrepareSummary summary;
  std::vector<std::unique_ptr<IndexedDatasetWriter>> writers;
  const TokenType type = token_type_for_vocabulary(tokenizer.vocab_size());
  for (const std::string& key : options.json_keys) {
    summary.datasets.push_back(PreparedDataset{key, dataset_prefix(options.output_prefix, key), 0, 0});
    writers.push_back(std::make_unique<IndexedDatasetWriter>(summary.datasets.back().prefix, type));
  }
  // The workers tokenize one batch while this thread reads the next and writes the one before, as
  // Megatron's worker processes tokenize while its main process reads and writes.
  std::exception_ptr reader_error;  // raised after the records read before it, to keep input order
  const auto read_batch = [&](std::vector<InputRecord>& batch) {
    batch.clear();
    int64_t batch_bytes = 0;
    InputRecord record;
    while (!reader_error && batch_bytes < kBatchBytesPerWorker * options.workers &&
           batch.size() < kBatchRecordsPerWorker * static_cast<std::size_t>(options.workers)) {
      try {
        if (!reader.next(record)) break;
      } catch (...) {
        reader_error = std::current_exception();
        break;
      }
      batch_bytes += static_cast<int64_t>(record.text.size());
      batch.push_back(std::move(record));
    }
  };
  const auto write_batch = [&](std::vector<EncodedRecord>& encoded) {
    for (EncodedRecord& result : encoded) {
      if (result.error) std::rethrow_exception(result.error);  // the first refused record, in input order
      for (std::size_t key = 0; key < writers.size(); ++key) {
        if (result.documents[key].empty()) continue;
        writers[key]->add_document(result.documents[key]);
        ++summary.datasets[key].documents;
        summary.datasets[key].tokens += static_cast<int64_t>(result.documents[key].size());
      }
    }
    encoded.clear();
  };
  std::vector<InputRecord> batches[2];
  std::vector<EncodedRecord> results[2];
  std::future<void> encoding;  // declared after what it uses: its destructor waits for it first
  const auto encode_in_background = [&](int which) {
    encoding = std::async(std::launch::async, [&, which] {
      encode_batch(batches[which], options.json_keys, tokenizer, end_of_document, options.workers, results[which]);
    });
  };
  read_batch(batches[0]);
  if (!batches[0].empty()) encode_in_background(0);
  for (int current = 0; encoding.valid(); current = 1 - current) {
    read_batch(batches[1 - current]);
    encoding.get();
    if (!batches[1 - current].empty()) encode_in_background(1 - current);
    write_batch(results[current]);
  }
  if (reader_error) std::rethrow_exception(reader_error);
  summary.bytes_read = reader.bytes_read();
  for (const PreparedDataset& dataset : summary.datasets) {
    if (dataset.documents > 0) continue;
    throw SpecError("--input", "no text" + (writers.size() > 1 ? " under \"" + dataset.key + "\"" : std::string()) +
                                   " in " + std::to_string(reader.file_count()) +
                                   " file(s): an empty dataset is not written");
  }
  // Every dataset complete before any is renamed in; one that cannot be takes the others back out.
  for (const std::unique_ptr<IndexedDatasetWriter>& writer : writers) writer->seal();
  std::size_t committed = 0;
  try {
    for (; committed < writers.size(); ++committed) writers[committed]->commit();
  } catch (...) {
    for (std::size_t key = 0; key < committed; ++key) {
      ::unlink((summary.datasets[key].prefix + ".bin").c_str());
      ::unlink((summary.datasets[key].prefix + ".idx").c_str());
    }
    throw;
  }
  folders.keep();
  return summary;
}

}  // namespace megaplan::exec
