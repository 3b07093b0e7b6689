#include "cli/data_command.h"

#include <memory>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "executor/data/tokenizer.h"

namespace megaplan::cli {

int run_data_prepare(const DataPrepareOptions& options, std::ostream& out) {
  const std::unique_ptr<exec::Tokenizer> tokenizer = exec::make_tokenizer(options.tokenizer);
  const exec::PrepareSummary summary = exec::prepare_dataset(options.prepare, *tokenizer);
  out << "wrote " << options.prepare.output_prefix << ".bin and .idx: " << summary.documents << " documents, "
      << summary.tokens << " tokens (vocabulary " << tokenizer->vocab_size() << ") from " << summary.bytes_read
      << " bytes\n";
  return 0;
}

void setup_data_command(CLI::App& app, CommandContext& context) {
  CLI::App* data = app.add_subcommand("data", "Training data: Megatron's indexed datasets");
  data->require_subcommand(1);
  auto options = std::make_shared<DataPrepareOptions>();
  CLI::App* prepare = data->add_subcommand(
      "prepare", "Tokenize text files (.jsonl: one document per line) into PREFIX.bin and PREFIX.idx");
  prepare->add_option("--input", options->prepare.inputs, "Input files")->required();
  prepare->add_option("--output-prefix", options->prepare.output_prefix, "Writes PREFIX.bin and PREFIX.idx")->required();
  prepare->add_option("--tokenizer", options->tokenizer.kind, "byte or gpt2 (GPT-2's byte-level BPE)")
      ->capture_default_str();
  prepare->add_option("--vocab-file", options->tokenizer.vocab_file, "GPT-2's vocab.json (with --tokenizer gpt2)");
  prepare->add_option("--merge-file", options->tokenizer.merge_file, "GPT-2's merges.txt (with --tokenizer gpt2)");
  prepare->add_option("--json-keys", options->prepare.json_key, "The field of each .jsonl line to read")
      ->capture_default_str();
  prepare->add_flag("--append-eod", options->prepare.append_end_of_document,
                    "End every document with the end-of-document token");
  prepare->callback([options, &context] { context.exit_code = run_data_prepare(*options, context.out); });
}

}  // namespace megaplan::cli
