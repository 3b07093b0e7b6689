// `megaplan data prepare`: text files to Megatron's indexed datasets (.bin/.idx), as Megatron-LM's
// tools/preprocess_data.py makes them.
#include "cli/data_command.h"

#include <charconv>
#include <functional>
#include <memory>
#include <system_error>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "executor/data/prepare.h"
#include "executor/data/tokenizer.h"

namespace megaplan::cli {
namespace {

struct DataPrepareOptions {
  exec::PrepareOptions prepare;
  exec::TokenizerOptions tokenizer;
};

int run_data_prepare(const DataPrepareOptions& options, std::ostream& out) {
  // The flags first, then the tokenizer's files, then the inputs.
  exec::check_prepare_options(options.prepare);
  const std::unique_ptr<exec::Tokenizer> tokenizer = exec::make_tokenizer(options.tokenizer);
  const exec::PrepareSummary summary = exec::prepare_dataset(options.prepare, *tokenizer);
  for (const exec::PreparedDataset& dataset : summary.datasets) {
    out << "wrote " << dataset.prefix << ".bin and .idx: " << dataset.documents << " documents, " << dataset.tokens
        << " tokens (vocabulary " << tokenizer->vocab_size() << ") from " << summary.bytes_read << " bytes\n";
  }
  return 0;
}

// A CLI11 check from a rule that throws SpecError: its rule is the message, after the flag's name.
CLI::Validator rule_of(std::function<void(const std::string&)> rule) {
  return CLI::Validator(
      [rule = std::move(rule)](std::string& value) -> std::string {
        try {
          rule(value);
        } catch (const SpecError& error) {
          return error.rule();
        }
        return "";
      },
      "", "");
}

}  // namespace

void add_tokenizer_options(CLI::App& command, exec::TokenizerOptions& options) {
  const std::string group = "Tokenizer";
  command
      .add_option("--tokenizer", options.kind,
                  "byte, gpt2 (GPT-2's vocab.json + merges.txt), hf (a Hugging Face byte-level BPE "
                  "tokenizer.json: GPT-2, Llama 3, Qwen2) or sentencepiece (a tokenizer.model: Llama 2, Mistral)")
      ->group(group);
  command
      .add_option("--tokenizer-type", options.megatron_type,
                  "Megatron-LM's name: GPT2BPETokenizer (gpt2), HuggingFaceTokenizer (hf, its tokenizer.json or "
                  "folder as --tokenizer-model), SentencePieceTokenizer, GPTSentencePieceTokenizer or "
                  "Llama2Tokenizer (sentencepiece)")
      ->check(rule_of([](const std::string& type) { exec::check_megatron_tokenizer_type(type); }))
      ->group(group);
  command.add_option("--vocab-file", options.vocab_file, "GPT-2's vocab.json (with --tokenizer gpt2)")->group(group);
  command.add_option("--merge-file", options.merge_file, "GPT-2's merges.txt (with --tokenizer gpt2)")->group(group);
  command
      .add_option(
          "--tokenizer-file", options.tokenizer_file,
          "A Hugging Face tokenizer.json (with --tokenizer hf); eos_token from a tokenizer_config.json beside it")
      ->group(group);
  command
      .add_option("--tokenizer-model", options.tokenizer_model,
                  "A SentencePiece tokenizer.model (with --tokenizer sentencepiece), or HuggingFaceTokenizer's "
                  "tokenizer.json or its folder")
      ->group(group);
}

void setup_data_command(CLI::App& app, CommandContext& context) {
  CLI::App* data = app.add_subcommand("data", "Training data: Megatron's indexed datasets");
  data->require_subcommand(1);
  auto options = std::make_shared<DataPrepareOptions>();
  CLI::App* prepare =
      data->add_subcommand("prepare",
                           "Tokenize text into Megatron's indexed datasets, as Megatron-LM's tools/preprocess_data.py: "
                           "PREFIX_<key>_document.bin and .idx per --json-keys key");
  prepare
      ->add_option("--input", options->prepare.inputs,
                   "Input files (JSON lines, whatever the name: a document per line; any other file: one document), "
                   "or directories (their files, recursively)")
      ->required();
  prepare
      ->add_option("--output-prefix", options->prepare.output_prefix,
                   "Writes PREFIX_<key>_document.bin and .idx for each key (its folder created if missing)")
      ->required();
  options->tokenizer.kind.clear();  // none given: --tokenizer-type's, else byte
  add_tokenizer_options(*prepare, options->tokenizer);
  prepare->get_option("--tokenizer")
      ->description(prepare->get_option("--tokenizer")->get_description() +
                    " (default: --tokenizer-type's, else byte)");
  // Each --json-keys replaces the one before, as argparse takes a repeated flag's last value.
  prepare
      ->add_option_function<std::vector<std::string>>(
          "--json-keys", [options](const std::vector<std::string>& keys) { options->prepare.json_keys = keys; },
          "The fields of each JSON line to read, a dataset each (default: text)")
      ->trigger_on_parse();
  prepare->add_option("--workers", options->prepare.workers, "Threads that tokenize (the output is the same for any)")
      ->capture_default_str();
  prepare->add_flag("--append-eod", options->prepare.append_end_of_document,
                    "End every document with the tokenizer's end-of-document token (hf: tokenizer_config.json's "
                    "eos_token, else <|endoftext|>, <|end_of_text|> or </s>; sentencepiece: eos_id)");
  // What one flag alone must satisfy is checked as the flag is read, so errors come in the command
  // line's order, as argparse gives Megatron-LM's preprocess_data.py's; the rules that join flags,
  // and the files, come after.
  prepare->get_option("--workers")->check(rule_of([](const std::string& text) {
    int64_t workers = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), workers);
    // Not a decimal integer: the strict number check (cli/strict_numbers.h) says so.
    if (error == std::errc() && end == text.data() + text.size()) exec::check_workers(workers);
  }));
  for (CLI::Option* option : prepare->get_options()) {
    // Each flag checked as it is read; a repeated flag's last value kept, as argparse keeps it.
    if (option != prepare->get_help_ptr()) option->trigger_on_parse();
  }
  prepare->callback([options, &context] { context.exit_code = run_data_prepare(*options, context.out); });
}

}  // namespace megaplan::cli
