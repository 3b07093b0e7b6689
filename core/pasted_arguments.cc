// Pasted Megatron-LM arguments checked against core's table of them.
#include "core/pasted_arguments.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_io.h"
#include "core/megatron_arguments.h"
#include "core/notes.h"
#include "core/text_file.h"

namespace megaplan {

namespace {

constexpr int64_t kGpt2Vocabulary = 50257;  // GPT2BPETokenizer's vocab.json

// Megatron's flags that name files or directories: recorded, not opened.
bool names_a_path(const std::string& flag) {
  static const char* const kPaths[] = {"--data-path",  "--train-data-path", "--valid-data-path", "--test-data-path",
                                       "--vocab-file", "--merge-file",      "--tokenizer-model", "--save",
                                       "--load",       "--tensorboard-dir", "--data-cache-path", "--wandb-save-dir"};
  return std::find(std::begin(kPaths), std::end(kPaths), flag) != std::end(kPaths);
}

// The tokens of a GPT-2 vocab.json (a JSON object of tokens to ids 0 .. n - 1), or one line naming
// --vocab-file and the rule it breaks. REQUIRES: the path exists.
int64_t gpt2_vocabulary_size(const std::string& path) {
  std::optional<nlohmann::json> vocabulary;
  try {
    vocabulary = try_parse_json(read_text_file(path));
  } catch (const SpecError& error) {  // unreadable, or no regular file (read_file_contents)
    throw SpecError("--vocab-file", error.what());
  }
  if (!vocabulary || !vocabulary->is_object() || vocabulary->empty()) {
    throw SpecError("--vocab-file", path + ": not a GPT-2 vocabulary (a JSON object of tokens to their ids)");
  }
  const auto size = static_cast<int64_t>(vocabulary->size());
  std::vector<bool> seen(static_cast<std::size_t>(size), false);
  for (const auto& [token, id] : vocabulary->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= size ||
        seen[static_cast<std::size_t>(id.get<int64_t>())]) {
      throw SpecError("--vocab-file", path + ": not a GPT-2 vocabulary: token " + nlohmann::json(token).dump() +
                                          " has id " + id.dump() + " (the ids must be 0 to " +
                                          std::to_string(size - 1) + ", each once)");
    }
    seen[static_cast<std::size_t>(id.get<int64_t>())] = true;
  }
  return size;
}

std::string comma_joined(const std::vector<std::string>& words) {
  std::string text;
  for (const std::string& word : words) text += (text.empty() ? "" : ", ") + word;
  return text;
}

bool matters(ArgumentEffect effect, Computes computes) {
  if (effect == ArgumentEffect::kRunAndCost) return true;
  return computes == Computes::kCost ? effect == ArgumentEffect::kCost : effect == ArgumentEffect::kRun;
}

std::string what_it_changes(ArgumentEffect effect) {
  switch (effect) {
    case ArgumentEffect::kRunAndCost: return "changes the model, the layout or its arithmetic";
    case ArgumentEffect::kRun: return "changes the training run";
    case ArgumentEffect::kCost: return "changes the iteration's time";
    case ArgumentEffect::kNothing: break;
  }
  return "changes nothing megaplan computes";
}

void check_arity(const MegatronArgument& argument, const std::string& flag, const std::vector<std::string>& values) {
  const std::size_t count = values.size();
  switch (argument.arity) {
    case ArgumentArity::kSwitch:
      if (count != 0) throw SpecError(flag, "takes no value (Megatron-LM's switch), got \"" + values.front() + "\"");
      return;
    case ArgumentArity::kOne:
      if (count != 1) throw SpecError(flag, "takes one value, got " + std::to_string(count));
      return;
    case ArgumentArity::kThree:
      if (count != 3) throw SpecError(flag, "takes three values, got " + std::to_string(count));
      return;
    case ArgumentArity::kList:
      if (count == 0) throw SpecError(flag, "takes one value or more, got none");
      return;
  }
}

// Refuses what the row and the command rule out; returns the row of a flag to accept.
const MegatronArgument& check_against_table(const std::string& flag, const std::vector<std::string>& values,
                                            Computes computes, const std::vector<std::string>& own) {
  const MegatronArgument* argument = find_megatron_argument(flag);
  if (argument == nullptr) {
    const std::optional<std::string> nearest = nearest_megatron_flag(flag, own);
    throw SpecError(flag, "is not an argument of this command nor of " + std::string(kMegatronArgumentsVersion) +
                              (nearest ? "; did you mean " + *nearest + "?" : ""));
  }
  check_arity(*argument, flag, values);
  for (const std::string& value : values) {
    if (!accepts_value(*argument, value)) {
      throw SpecError(flag, "megaplan runs only " + std::string(argument->accepted_values) + " (" +
                                std::string(argument->reason) + "), got \"" + value + "\"");
    }
  }
  if (!matters(argument->effect, computes)) return *argument;
  if (argument->support == ArgumentSupport::kRefused) {
    throw SpecError(flag, what_it_changes(argument->effect) +
                              ", and megaplan does not implement it: " + std::string(argument->reason));
  }
  if (argument->support == ArgumentSupport::kHonoured) {
    throw SpecError(flag, what_it_changes(argument->effect) + ", and this command does not take it");
  }
  return *argument;
}

}  // namespace

PastedArguments read_pasted_arguments(const std::vector<std::string>& remaining, const std::vector<std::string>& own,
                                      Computes computes) {
  PastedArguments pasted;
  // Each flag's last occurrence's values (argparse's rule), and the flags in the order given.
  std::map<std::string, std::vector<std::string>> values;
  std::vector<std::string> order;
  std::string flag;
  for (const std::string& word : remaining) {
    if (word.rfind("--", 0) == 0) {
      flag = word.substr(0, word.find('='));
      values[flag].clear();
      if (word.find('=') != std::string::npos) values[flag].push_back(word.substr(word.find('=') + 1));
      if (std::find(order.begin(), order.end(), flag) == order.end()) order.push_back(flag);
      continue;
    }
    if (flag.empty()) throw SpecError(word, "is not an argument megaplan knows (a flag's value without its flag?)");
    values[flag].push_back(word);
  }
  std::vector<std::string> training_only, cosmetic;
  for (const std::string& given : order) {
    const MegatronArgument& argument = check_against_table(given, values[given], computes, own);
    if (given == "--rampup-batch-size") continue;  // its own note, below
    (argument.effect == ArgumentEffect::kRun ? training_only : cosmetic).push_back(given);
  }
  const auto value_of = [&](const std::string& name) -> std::optional<std::string> {
    const auto found = values.find(name);
    if (found == values.end() || found->second.empty()) return std::nullopt;
    return found->second.back();
  };
  const std::optional<std::string> type = value_of("--tokenizer-type");
  const std::optional<std::string> vocab_file = value_of("--vocab-file");
  // GPT-2's tokenizer: its vocabulary is the vocab file's (opened and counted), or GPT-2's own.
  const bool gpt2 = type == "GPT2BPETokenizer" || (!type && vocab_file && value_of("--merge-file"));
  if (gpt2) {
    pasted.vocab_size = kGpt2Vocabulary;
    pasted.vocab_source = "GPT2BPETokenizer's";
    // A script pasted from a cluster names its files there: absent here, GPT-2's own is said.
    if (vocab_file && std::filesystem::exists(*vocab_file)) {
      pasted.vocab_size = gpt2_vocabulary_size(*vocab_file);
      pasted.vocab_source = *vocab_file + "'s";
    } else if (vocab_file) {
      pasted.vocab_source = "GPT2BPETokenizer's (--vocab-file " + *vocab_file + " is not on this machine)";
    }
  }
  for (const auto& [name, given] : values) {
    if (!names_a_path(name) || given.empty() || (gpt2 && name == "--vocab-file")) continue;
    std::string words = name;  // a blend's weights and prefixes, all of them
    for (const std::string& word : given) words += " " + word;
    pasted.paths.push_back(words);
  }
  // The ramp shortens the first iterations; the iteration these commands cost is the one after it.
  if (values.count("--rampup-batch-size") > 0) {
    note(
        "--rampup-batch-size: the iteration costed runs the full global batch, as every iteration after the ramp does "
        "(train runs the ramp)");
  }
  if (!training_only.empty()) note("training flags, no effect on the iteration's cost: " + comma_joined(training_only));
  if (!cosmetic.empty()) {
    note(std::string(computes == Computes::kCost ? "no effect on the iteration's cost" : "no effect on the run") +
         " (accepted as " + std::string(kMegatronArgumentsVersion) + " spells them): " + comma_joined(cosmetic));
  }
  if (!pasted.paths.empty()) note("recorded, not opened: " + comma_joined(pasted.paths));
  return pasted;
}

void apply_pasted_vocabulary(const PastedArguments& pasted, ModelOptions& model) {
  if (model.vocab_size || !pasted.vocab_size) return;
  model.vocab_size = pasted.vocab_size;
  note("the vocabulary " + std::to_string(*pasted.vocab_size) + " is " + pasted.vocab_source +
       " (from the tokenizer flags; --vocab-size sets it)");
}

}  // namespace megaplan
