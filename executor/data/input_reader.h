// The inputs of `megaplan data prepare`, read in order as records. A file is JSON lines when its
// first non-blank line parses as a JSON object, whatever its name (Megatron-LM's convention is a
// `.json` file of one object per line): each non-blank line is then a record. Any other file is
// one record, its whole text (a `.json` or `.jsonl` file that is not JSON lines is refused). A
// directory stands for its regular files, recursively, in path order (the same dataset twice).
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace megaplan::exec {

struct InputRecord {
  std::string text;   // the JSON line, or the file's contents
  bool json = false;  // a line of a JSON-lines file
  std::string path;
  std::size_t line = 0;  // JSON lines: the line's number, from 1
  // "FILE" or "FILE:LINE", for messages.
  std::string where() const { return json ? path + ":" + std::to_string(line) : path; }
};

class InputReader {
 public:
  // Lists the files and notes each as an input of this command (core/text_file.h), so that no
  // output replaces one. Throws SpecError("--input", ...) for no inputs, or a directory that cannot
  // be listed or holds no files.
  explicit InputReader(const std::vector<std::string>& inputs);
  InputReader(const InputReader&) = delete;
  InputReader& operator=(const InputReader&) = delete;

  std::size_t file_count() const { return files_.size(); }
  // Bytes of the records read so far, blank lines included.
  int64_t bytes_read() const { return bytes_read_; }
  // The next record into `record`; false after the last. Throws SpecError("--input", ...) naming
  // the file (and line) for an unreadable file, a line or a whole file longer than
  // kMaxDocumentBytes (core/input_limits.h), and a `.json`/`.jsonl` file that is not JSON lines.
  bool next(InputRecord& record);

 private:
  // Opens the next file and decides its kind; false when no file is left.
  bool open_next_file(InputRecord& first);
  bool read_line(std::string& line);

  std::vector<std::string> files_;
  std::size_t next_file_ = 0;
  std::ifstream file_;  // the JSON-lines file being read, if any
  std::string path_;
  std::size_t line_number_ = 0;
  int64_t bytes_read_ = 0;
};

}  // namespace megaplan::exec
