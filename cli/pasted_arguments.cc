#include "cli/pasted_arguments.h"

#include <algorithm>
#include <fstream>
#include <map>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/notes.h"
#include "cli/shared_options.h"
#include "core/error.h"

namespace megaplan::cli {

namespace {

constexpr int64_t kGpt2Vocabulary = 50257;  // GPT2BPETokenizer's vocab.json

// Megatron's flags that name files or directories: recorded, not opened.
bool names_a_path(const std::string& flag) {
  static const char* const kPaths[] = {"--data-path", "--train-data-path", "--valid-data-path", "--test-data-path",
                                       "--vocab-file", "--merge-file", "--tokenizer-model", "--save", "--load",
                                       "--tensorboard-dir", "--data-cache-path", "--wandb-save-dir"};
  return std::find(std::begin(kPaths), std::end(kPaths), flag) != std::end(kPaths);
}

// Levenshtein distance, for telling a typo of a flag megaplan models from a flag it does not.
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The command's flag `flag` is a likely typo of, if any — two edits from a long name, one from a
// middling one, none for short names (--lr is no typo of --tp): a typo would otherwise be accepted
// as a flag megaplan does not model, silently changing the plan.
std::optional<std::string> near_flag(const CLI::App& command, const std::string& flag) {
  for (const CLI::Option* option : command.get_options()) {
    for (const std::string& name : option->get_lnames()) {
      const std::string known = "--" + name;
      const std::size_t allowed = known.size() >= 14 ? 2 : known.size() >= 9 ? 1 : 0;
      if (allowed > 0 && edit_distance(flag, known) <= allowed) return known;
    }
  }
  return std::nullopt;
}

std::string joined(const std::vector<std::string>& words) {
  std::string text;
  for (const std::string& word : words) text += (text.empty() ? "" : ", ") + word;
  return text;
}

}  // namespace

void accept_megatron_arguments(CLI::App& command) {
  command.allow_extras();
  for (CLI::Option* option : command.get_options()) {
    if (option->get_items_expected_max() == 1) option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
}

PastedArguments read_pasted_arguments(const CLI::App& command) {
  PastedArguments pasted;
  std::map<std::string, std::vector<std::string>> values;  // the last occurrence's values, by flag
  std::string flag;
  for (const std::string& word : command.remaining()) {
    if (word.rfind("--", 0) == 0) {
      flag = word.substr(0, word.find('='));
      if (const std::optional<std::string> near = near_flag(command, flag)) {
        throw SpecError(flag, "is not a flag megaplan knows; did you mean " + *near + "?");
      }
      values[flag].clear();
      if (word.find('=') != std::string::npos) values[flag].push_back(word.substr(word.find('=') + 1));
      if (std::find(pasted.not_modelled.begin(), pasted.not_modelled.end(), flag) == pasted.not_modelled.end()) {
        pasted.not_modelled.push_back(flag);
      }
      continue;
    }
    if (flag.empty()) throw SpecError(word, "is not an argument megaplan knows (a flag's value without its flag?)");
    values[flag].push_back(word);
  }
  for (const auto& [name, given] : values) {
    if (names_a_path(name) && !given.empty()) pasted.paths.push_back(name + " " + given.back());
  }
  const auto value_of = [&](const std::string& name) -> std::optional<std::string> {
    const auto found = values.find(name);
    if (found == values.end() || found->second.empty()) return std::nullopt;
    return found->second.back();
  };
  const std::optional<std::string> type = value_of("--tokenizer-type");
  const std::optional<std::string> vocab_file = value_of("--vocab-file");
  if (type == "GPT2BPETokenizer" || (!type && vocab_file && value_of("--merge-file"))) {
    pasted.vocab_size = kGpt2Vocabulary;
    pasted.vocab_source = "GPT2BPETokenizer's";
    if (vocab_file) {
      std::ifstream file(*vocab_file);
      const nlohmann::json vocabulary = nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
      if (file && vocabulary.is_object() && !vocabulary.empty()) {
        pasted.vocab_size = static_cast<int64_t>(vocabulary.size());
        pasted.vocab_source = *vocab_file + "'s";
      }
    }
  }
  // The ramp shortens the first iterations; the iteration these commands cost is the one after it.
  if (values.count("--rampup-batch-size") > 0) {
    std::erase(pasted.not_modelled, std::string("--rampup-batch-size"));
    note("--rampup-batch-size: the iteration costed runs the full global batch, as every iteration after the ramp does "
         "(train runs the ramp)");
  }
  if (!pasted.not_modelled.empty()) note("not modelled (accepted as Megatron-LM spells them): " + joined(pasted.not_modelled));
  if (!pasted.paths.empty()) note("recorded, not opened: " + joined(pasted.paths));
  return pasted;
}

void infer_megatron_implementation(const CLI::App& command, ImplementationFlags& flags) {
  if (command.count("--implementation") > 0) return;
  if (!flags.fp16 && !flags.bf16 && !flags.transformer_impl) return;
  flags.implementation = flags.transformer_impl == "local" ? "megatron-local" : "megatron-core";
  note("implementation " + flags.implementation + ": the precision and transformer flags are Megatron-LM's "
       "(--implementation sets it)");
}

void apply_pasted_vocabulary(const PastedArguments& pasted, ModelOptions& model) {
  if (model.vocab_size || !pasted.vocab_size) return;
  model.vocab_size = pasted.vocab_size;
  note("the vocabulary " + std::to_string(*pasted.vocab_size) + " is " + pasted.vocab_source +
       " (from the tokenizer flags; --vocab-size sets it)");
}

}  // namespace megaplan::cli
