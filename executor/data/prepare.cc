#include "executor/data/prepare.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/input_limits.h"
#include "core/json_io.h"
#include "core/text_file.h"
#include "executor/data/indexed_dataset.h"

namespace megaplan::exec {

namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The files to read: each input file, and each directory's regular files, recursively, in path
// order (a fixed order makes the same dataset twice).
std::vector<std::string> input_files(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    std::error_code error;
    if (!std::filesystem::is_directory(input, error)) {
      files.push_back(input);
      continue;
    }
    std::vector<std::string> found;
    for (std::filesystem::recursive_directory_iterator it(input, error), end; !error && it != end; it.increment(error)) {
      if (it->is_regular_file(error)) found.push_back(it->path().string());
    }
    if (error) throw SpecError("--input", input + ": cannot list the directory: " + error.message());
    if (found.empty()) throw SpecError("--input", input + " is a directory without files");
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

// The next line of `file` into `line` (without its newline); false at the end. A line longer than
// kMaxDocumentBytes is refused as it is read, before it is held whole.
bool read_bounded_line(std::istream& file, std::string& line, const std::string& path, std::size_t line_number) {
  line.clear();
  std::streambuf& buffer = *file.rdbuf();
  for (int c = buffer.sbumpc(); c != std::char_traits<char>::eof(); c = buffer.sbumpc()) {
    if (c == '\n') return true;
    line.push_back(static_cast<char>(c));
    if (static_cast<int64_t>(line.size()) > kMaxDocumentBytes.most) {
      require_at_most(static_cast<int64_t>(line.size()), kMaxDocumentBytes,
                      "--input " + path + ":" + std::to_string(line_number) + " (bytes of one line, one document)");
    }
  }
  return !line.empty();
}

}  // namespace

PrepareSummary prepare_dataset(const PrepareOptions& options, const Tokenizer& tokenizer) {
  if (options.inputs.empty()) throw SpecError("--input", "at least one input file is needed");
  if (options.output_prefix.empty()) throw SpecError("--output-prefix", "must not be empty");
  // Asked before anything is written, so a tokenizer without one fails with no output.
  const int64_t end_of_document = options.append_end_of_document ? tokenizer.end_of_document() : -1;
  IndexedDatasetWriter writer(options.output_prefix, token_type_for_vocabulary(tokenizer.vocab_size()));
  PrepareSummary summary;
  // A document without text adds nothing (not even its end-of-document token), as an empty line
  // would not.
  const auto add = [&](std::string_view text) {
    std::vector<int64_t> tokens = tokenizer.encode(text);
    if (tokens.empty()) return;
    if (options.append_end_of_document) tokens.push_back(end_of_document);
    summary.tokens += static_cast<int64_t>(tokens.size());
    ++summary.documents;
    writer.add_document(tokens);
  };
  const std::vector<std::string> files = input_files(options.inputs);
  for (const std::string& path : files) {
    if (!ends_with(path, ".jsonl")) {
      // A text file is one document, tokenized whole.
      std::error_code error;
      const std::uintmax_t size = std::filesystem::file_size(path, error);
      if (!error) require_at_most(static_cast<int64_t>(size), kMaxDocumentBytes, "--input " + path + " (bytes of one document)");
      std::string contents;
      try {
        contents = read_text_file(path);
      } catch (const SpecError& failure) {
        throw SpecError("--input", failure.what());
      }
      summary.bytes_read += static_cast<int64_t>(contents.size());
      add(contents);
      continue;
    }
    // JSON Lines, a document per line, read a line at a time: a file of any size, a line bounded.
    std::ifstream file(path, std::ios::binary);
    if (!file) throw SpecError("--input", path + ": cannot read file: " + std::strerror(errno));
    note_input_file(path);
    std::size_t line_number = 0;
    std::string line;
    while (read_bounded_line(file, line, path, line_number + 1)) {
      ++line_number;
      summary.bytes_read += static_cast<int64_t>(line.size()) + 1;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = path + ":" + std::to_string(line_number);
      const std::optional<nlohmann::json> record = try_parse_json(line);
      if (!record) throw SpecError("--input", where + ": malformed JSON");
      if (!record->is_object() || !record->contains(options.json_key) || !(*record)[options.json_key].is_string()) {
        throw SpecError("--input", where + ": no string field \"" + options.json_key + "\"");
      }
      add((*record)[options.json_key].get<std::string>());
    }
    if (file.bad()) throw SpecError("--input", path + ": cannot read file: " + std::strerror(errno));
  }
  if (summary.documents == 0) {
    throw SpecError("--input", "no text in " + std::to_string(files.size()) + " file(s): an empty dataset is not written");
  }
  writer.finish();
  return summary;
}

}  // namespace megaplan::exec
