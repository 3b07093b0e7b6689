// A Megatron-LM launch script's arguments pasted as they are (its GPT_MODEL_ARGS, TRAINING_ARGS,
// MODEL_PARALLEL_ARGS, DATA_ARGS, EVAL_AND_LOGGING_ARGS): a repeated flag takes its last value, as
// argparse does; the flags the command defines take effect; every other word is looked up in
// core's table of Megatron-LM's arguments (core/megatron_arguments.h) and refused where it would
// change what the command computes without megaplan implementing it, or accepted and named once in
// a note where it changes nothing the command computes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/job_options.h"

namespace megaplan {

// What the command computes, which decides whether a flag it lacks matters to it.
enum class Computes {
  kCost,  // simulate, search, describe: an iteration's time and memory
  kRun,   // train: the training run itself
};

struct PastedArguments {
  std::vector<std::string> paths;  // "--data-path P", "--vocab-file F", ...: recorded, not opened
  // The vocabulary the tokenizer flags imply: GPT2BPETokenizer (or --vocab-file with --merge-file):
  // the vocab file's entries where it is a readable JSON object, else GPT-2's 50257.
  std::optional<int64_t> vocab_size;
  std::string vocab_source;
};

// `remaining`: what was given beyond the command's options, in order; `own`: the command's long flags
// (for did-you-mean). Checked against Megatron-LM's table and noted (core/notes.h). Throws
// SpecError for a word that follows no flag, a flag Megatron-LM does not have (with a
// did-you-mean), a flag given the wrong number of values, a value megaplan does not run, and a
// flag that changes what the command computes and is refused.
PastedArguments read_pasted_arguments(const std::vector<std::string>& remaining, const std::vector<std::string>& own,
                                      Computes computes);

// Without --vocab-size, the vocabulary the pasted tokenizer flags imply (noted).
void apply_pasted_vocabulary(const PastedArguments& pasted, ModelOptions& model);

}  // namespace megaplan
