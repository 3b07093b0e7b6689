#include "executor/data/input_reader.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/input_limits.h"
#include "core/json_io.h"
#include "core/text_file.h"

namespace megaplan::exec {

namespace {

bool named_as_json(const std::string& path) {
  const std::string extension = std::filesystem::path(path).extension().string();
  return extension == ".json" || extension == ".jsonl";
}

bool blank(const std::string& line) { return line.find_first_not_of(" \t\r") == std::string::npos; }

}  // namespace

InputReader::InputReader(const std::vector<std::string>& inputs) {
  if (inputs.empty()) throw SpecError("--input", "at least one input file is needed");
  for (const std::string& input : inputs) {
    std::error_code error;
    if (!std::filesystem::is_directory(input, error)) {
      files_.push_back(input);
      continue;
    }
    std::vector<std::string> found;
    for (std::filesystem::recursive_directory_iterator it(input, error), end; !error && it != end;
         it.increment(error)) {
      if (it->is_regular_file(error)) found.push_back(it->path().string());
    }
    if (error) throw SpecError("--input", input + ": cannot list the directory: " + error.message());
    if (found.empty()) throw SpecError("--input", input + " is a directory without files");
    std::sort(found.begin(), found.end());
    files_.insert(files_.end(), found.begin(), found.end());
  }
  for (const std::string& path : files_) note_input_file(path);
}

// A line longer than kMaxDocumentBytes is refused as it is read, before it is held whole.
bool InputReader::read_line(std::string& line) {
  line.clear();
  std::streambuf& buffer = *file_.rdbuf();
  const std::size_t number = line_number_ + 1;
  for (int c = buffer.sbumpc(); c != std::char_traits<char>::eof(); c = buffer.sbumpc()) {
    if (c == '\n') {
      ++line_number_;
      bytes_read_ += static_cast<int64_t>(line.size()) + 1;
      return true;
    }
    line.push_back(static_cast<char>(c));
    if (static_cast<int64_t>(line.size()) > kMaxDocumentBytes.most) {
      require_at_most(static_cast<int64_t>(line.size()), kMaxDocumentBytes,
                      "--input " + path_ + ":" + std::to_string(number) + " (bytes of one line, one document)");
    }
  }
  if (file_.bad()) throw SpecError("--input", path_ + ": cannot read file: " + std::strerror(errno));
  if (line.empty()) return false;
  ++line_number_;
  bytes_read_ += static_cast<int64_t>(line.size());
  return true;
}

bool InputReader::open_next_file(InputRecord& first) {
  while (next_file_ < files_.size()) {
    path_ = files_[next_file_++];
    line_number_ = 0;
    require_regular_file(path_, "--input");  // a FIFO would block the open
    file_ = std::ifstream(path_, std::ios::binary);
    if (!file_) throw SpecError("--input", path_ + ": cannot read file: " + std::strerror(errno));
    const int64_t bytes_before = bytes_read_;
    // The first non-blank line says what the file is.
    std::string line;
    bool found = false;
    while (!found && read_line(line)) found = !blank(line);
    if (found) {
      const std::optional<nlohmann::json> parsed = try_parse_json(line);
      if (parsed && parsed->is_object()) {
        first = InputRecord{std::move(line), true, path_, line_number_};
        return true;
      }
      if (named_as_json(path_)) {
        throw SpecError("--input", path_ + ":" + std::to_string(line_number_) + ": " +
                                       (parsed ? "not a JSON object" : "malformed JSON") +
                                       ": a .json or .jsonl file must hold one JSON object per line");
      }
    } else if (named_as_json(path_)) {
      file_.close();  // JSON lines without a line: no record
      continue;
    }
    // Any other file is one document, read whole.
    file_.close();
    bytes_read_ = bytes_before;
    std::error_code error;
    const std::uintmax_t size = std::filesystem::file_size(path_, error);
    if (!error)
      require_at_most(static_cast<int64_t>(size), kMaxDocumentBytes, "--input " + path_ + " (bytes of one document)");
    std::string contents;
    try {
      contents = read_text_file(path_);
    } catch (const SpecError& failure) {
      throw SpecError("--input", failure.what());
    }
    bytes_read_ += static_cast<int64_t>(contents.size());
    first = InputRecord{std::move(contents), false, path_, 0};
    return true;
  }
  return false;
}

bool InputReader::next(InputRecord& record) {
  if (file_.is_open()) {
    std::string line;
    while (read_line(line)) {
      if (blank(line)) continue;
      record = InputRecord{std::move(line), true, path_, line_number_};
      return true;
    }
    file_.close();
  }
  return open_next_file(record);
}

}  // namespace megaplan::exec
