// `megaplan data prepare`: text in, Megatron's .bin/.idx out, as Megatron-LM's
// tools/preprocess_data.py does: each line of a .jsonl file is a document (its "text" field, or
// the --json-keys field), any other file is one document (a directory: its files); one sequence per document, with the
// end-of-document token appended when asked (--append-eod).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "executor/data/tokenizer.h"

namespace megaplan::exec {

struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string output_prefix;
  std::string json_key = "text";
  bool append_end_of_document = false;
};

struct PrepareSummary {
  int64_t documents = 0;
  int64_t tokens = 0;
  int64_t bytes_read = 0;
};

// A directory among the inputs stands for its files, recursively, in path order; documents without
// text are skipped. Throws SpecError("--input", "<file>:<line>: ...") for an unreadable file, a
// malformed JSON line or a line without the key, a directory without files, or inputs without any
// text; nothing is written then.
PrepareSummary prepare_dataset(const PrepareOptions& options, const Tokenizer& tokenizer);

}  // namespace megaplan::exec
