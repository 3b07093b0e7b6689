// `megaplan data prepare`: text in, Megatron's .bin/.idx out, as Megatron-LM's
// tools/preprocess_data.py makes them: each record of the inputs (executor/data/input_reader.h: a
// line of a JSON-lines file, or a whole other file) is a document; each --json-keys key is a
// dataset of its own, OUTPUT_PREFIX_<key>_document.bin/.idx (a whole file's text is key "text");
// one sequence per document, with the end-of-document token appended when asked (--append-eod).
// Documents are tokenized on --workers threads and written in input order, so the output is the
// same byte for byte whatever the number of workers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "executor/data/tokenizer.h"

namespace megaplan::exec {

struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string output_prefix;
  std::vector<std::string> json_keys = {"text"};
  bool append_end_of_document = false;
  int64_t workers = 1;
};

// Megatron's name of a key's dataset: OUTPUT_PREFIX_<key>_document.
std::string dataset_prefix(const std::string& output_prefix, const std::string& key);

struct PreparedDataset {
  std::string key;
  std::string prefix;  // what train --data-path takes
  int64_t documents = 0;
  int64_t tokens = 0;
};

struct PrepareSummary {
  std::vector<PreparedDataset> datasets;  // in --json-keys order
  int64_t bytes_read = 0;
};

// Throws SpecError naming the flag when the options break a rule: no input, an empty output
// prefix, an empty, repeated or path-like (a '/') json key, or check_workers'.
void check_prepare_options(const PrepareOptions& options);
// Throws SpecError("--workers", ...) for workers outside 1-1024 (core/input_limits.h's threads).
void check_workers(int64_t workers);

// Writes every key's dataset atomically, creating the output folder where it is missing; on any
// error nothing is left behind (no dataset, no folder it created). Documents without text are
// skipped. Throws check_prepare_options' errors, SpecError("--input", "<file>[:<line>]: ...") for
// an unreadable file, a malformed JSON line, a line without a string field of every key, a whole
// file where "text" is not a key, or a key without any text; the tokenizer's errors.
PrepareSummary prepare_dataset(const PrepareOptions& options, const Tokenizer& tokenizer);

}  // namespace megaplan::exec
