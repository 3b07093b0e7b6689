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

void add_tokenizer_options(CLI::App& command, exec::TokenizerOptions& options) {
  const std::string group = "Tokenizer";
  command
      .add_option("--tokenizer", options.kind,
                  "byte, gpt2 (GPT-2's vocab.json + merges.txt), hf (a Hugging Face byte-level BPE tokenizer.json: "
                  "GPT-2, Llama 3, Qwen2) or sentencepiece (a tokenizer.model: Llama 2, Mistral)")
      ->group(group);
  command.add_option("--vocab-file", options.vocab_file, "GPT-2's vocab.json (with --tokenizer gpt2)")->group(group);
  command.add_option("--merge-file", options.merge_file, "GPT-2's merges.txt (with --tokenizer gpt2)")->group(group);
  command
      .add_option("--tokenizer-file", options.tokenizer_file,
                  "A Hugging Face tokenizer.json (with --tokenizer hf); eos_token from a tokenizer_config.json beside it")
      ->group(group);
  command
      .add_option("--tokenizer-model", options.tokenizer_model,
                  "A SentencePiece tokenizer.model (with --tokenizer sentencepiece)")
      ->group(group);
}

void setup_data_command(CLI::App& app, CommandContext& context) {
  CLI::App* data = app.add_subcommand("data", "Training data: Megatron's indexed datasets");
  data->require_subcommand(1);
  auto options = std::make_shared<DataPrepareOptions>();
  CLI::App* prepare = data->add_subcommand(
      "prepare", "Tokenize text files (.jsonl: one document per line) into PREFIX.bin and PREFIX.idx");
  prepare->add_option("--input", options->prepare.inputs, "Input files, or directories (their files, recursively)")->required();
  prepare->add_option("--output-prefix", options->prepare.output_prefix, "Writes PREFIX.bin and PREFIX.idx")->required();
  add_tokenizer_options(*prepare, options->tokenizer);
  prepare->get_option("--tokenizer")->capture_default_str();
  prepare->add_option("--json-keys", options->prepare.json_key, "The field of each .jsonl line to read")
      ->capture_default_str();
  prepare->add_flag("--append-eod", options->prepare.append_end_of_document,
                    "End every document with the tokenizer's end-of-document token (hf: tokenizer_config.json's "
                    "eos_token, else <|endoftext|>, <|end_of_text|> or </s>; sentencepiece: eos_id)");
  prepare->callback([options, &context] { context.exit_code = run_data_prepare(*options, context.out); });
}

}  // namespace megaplan::cli
