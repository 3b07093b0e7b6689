// A Megatron-LM launch script's arguments pasted as they are (its GPT_MODEL_ARGS, TRAINING_ARGS,
// MODEL_PARALLEL_ARGS, DATA_ARGS, EVAL_AND_LOGGING_ARGS): a repeated flag takes its last value, as
// argparse does; the flags megaplan models take effect; the rest are accepted and listed once in a
// note as not modelled, with the data and tokenizer paths recorded there, not opened.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace megaplan::cli {

// Call after the command's options are added.
void accept_megatron_arguments(CLI::App& command);

struct PastedArguments {
  std::vector<std::string> not_modelled;  // the flags, each once, in order
  std::vector<std::string> paths;         // "--data-path P", "--vocab-file F", ...: recorded, not opened
  // The vocabulary the tokenizer flags imply: GPT2BPETokenizer (or --vocab-file with --merge-file):
  // the vocab file's entries where it is a readable JSON object, else GPT-2's 50257.
  std::optional<int64_t> vocab_size;
  std::string vocab_source;
};

// In the command's callback: what was pasted beyond the command's options, noted (cli/notes.h).
// Throws SpecError for a word that follows no flag, and for a flag two edits or fewer from one the
// command has (a typo: "did you mean ...?").
PastedArguments read_pasted_arguments(const CLI::App& command);

struct ModelOptions;
struct ImplementationFlags;
// Without --vocab-size, the vocabulary the pasted tokenizer flags imply (noted).
void apply_pasted_vocabulary(const PastedArguments& pasted, ModelOptions& model);
// Without --implementation, Megatron-LM's precision or transformer flags (--fp16, --bf16,
// --transformer-impl) say the plan runs Megatron-LM's code: megatron-core, or megatron-local with
// --transformer-impl local (noted).
void infer_megatron_implementation(const CLI::App& command, ImplementationFlags& flags);

}  // namespace megaplan::cli
