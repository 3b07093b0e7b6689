#include "executor/train/checkpoint_state_file.h"

#include <algorithm>
#include <filesystem>

#include "core/json_io.h"
#include "core/text_file.h"
#include "executor/train/checkpoint_format.h"
#include "executor/train/parallel_groups.h"

namespace megaplan::exec::checkpoint_format {

namespace {

// The tokenizer as state.json holds it: train's flag names with underscores, files as absolute
// paths (convert runs from anywhere), the flags not given left out.
nlohmann::json tokenizer_json(const TokenizerOptions& tokenizer) {
  nlohmann::json json = {{"kind", tokenizer.kind}};
  const std::pair<const char*, const std::string*> files[] = {{"vocab_file", &tokenizer.vocab_file},
                                                              {"merge_file", &tokenizer.merge_file},
                                                              {"tokenizer_file", &tokenizer.tokenizer_file},
                                                              {"tokenizer_model", &tokenizer.tokenizer_model}};
  for (const auto& [key, path] : files) {
    if (path->empty()) continue;
    std::error_code error;
    const std::filesystem::path absolute = std::filesystem::absolute(*path, error);
    json[key] = error ? *path : absolute.lexically_normal().string();
  }
  return json;
}

TokenizerOptions tokenizer_from_json(const nlohmann::json& json, const std::string& source) {
  JsonFieldReader fields(json, source);
  TokenizerOptions tokenizer;
  fields.require("kind", tokenizer.kind);
  fields.read("vocab_file", tokenizer.vocab_file);
  fields.read("merge_file", tokenizer.merge_file);
  fields.read("tokenizer_file", tokenizer.tokenizer_file);
  fields.read("tokenizer_model", tokenizer.tokenizer_model);
  fields.reject_unknown_keys();
  return tokenizer;  // whether its files still read is the reader's concern (convert says so)
}

// The iteration latest_checkpointed_iteration.txt names: decimal digits and a newline, as saved.
int64_t read_latest(const std::string& latest) {
  std::string text = read_file_contents(latest, kMaxIterationDigits + 1);
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (text.empty() || text.size() > kMaxIterationDigits || text.find_first_not_of("0123456789") != std::string::npos) {
    refuse_load(latest + " must hold an iteration number (up to " + std::to_string(kMaxIterationDigits) +
                " digits), and holds " +
                nlohmann::json(text.substr(0, 20)).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace));
  }
  return std::stoll(text);
}

// The iteration directories in `directory` (iter_ and digits; a .tmp staging directory is not
// one), newest first.
std::vector<int64_t> iteration_directories(const std::string& directory) {
  std::vector<int64_t> iterations;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    const std::string name = entry.path().filename().string();
    const std::string digits = name.size() > 5 ? name.substr(5) : "";
    if (name.rfind("iter_", 0) != 0 || digits.empty() || digits.size() > kMaxIterationDigits ||
        digits.find_first_not_of("0123456789") != std::string::npos || !entry.is_directory(error)) {
      continue;
    }
    iterations.push_back(std::stoll(digits));
  }
  if (error) refuse_load(directory + ": " + error.message());
  std::sort(iterations.rbegin(), iterations.rend());
  return iterations;
}

// Why the iteration directory `path` is not a whole save ("" when it is): its state.json, or a
// manifest.json or model.bin of a rank directory it lists, missing. A save renames its directory
// into place once every file in it is synced, so only a hand (a copy cut short, a deletion) leaves
// one incomplete. A state.json that does not parse is damage, not incompleteness: the load says so.
std::string incompleteness(const std::string& path) {
  if (!checkpoint_path_exists(path + "/state.json")) return "no state.json";
  const std::optional<nlohmann::json> meta = try_parse_json(read_checkpoint_json_text(path + "/state.json"));
  if (!meta || !meta->is_object() || !meta->contains("directories") || !(*meta)["directories"].is_array()) return "";
  for (const nlohmann::json& name : (*meta)["directories"]) {
    if (!name.is_string()) return "";
    for (const char* file : {"manifest.json", "model.bin"}) {
      const std::string rank_file = name.get<std::string>() + "/" + file;
      if (!checkpoint_path_exists(path + "/" + rank_file)) return "no " + rank_file;
    }
  }
  return "";
}

}  // namespace

nlohmann::json checkpoint_meta(const TrainingState& state, const ModelSpec& model, const ParallelPlan& plan) {
  nlohmann::json directories = nlohmann::json::array();
  for (const RankPlace& writer : checkpoint_writers(model, plan)) {
    directories.push_back(rank_directory(writer.tensor_parallel_rank, writer.pipeline_rank, plan.pipeline_parallel_size,
                                         writer.expert_parallel_rank, plan.expert_model_parallel_size));
  }
  nlohmann::json meta = {{"format", kFormat},
                         {"iteration", state.iteration},
                         {"consumed_samples", state.consumed_samples},
                         {"seed", state.seed},
                         {"model", model.name},
                         {"model_spec", model_spec_to_json(model)},
                         {"plan", parallel_plan_to_json(plan)},
                         {"directories", directories}};
  if (state.tokenizer) meta["tokenizer"] = tokenizer_json(*state.tokenizer);
  if (state.skipped_iterations > 0) {
    meta["skipped_iterations"] = state.skipped_iterations;
    meta["skipped_samples"] = state.skipped_samples;
  }
  if (state.loss_scaler) {
    meta["loss_scaler"] = {{"scale", state.loss_scaler->scale},
                           {"growth_tracker", state.loss_scaler->growth_tracker},
                           {"hysteresis_tracker", state.loss_scaler->hysteresis_tracker}};
  }
  if (!state.expert_biases.empty()) {
    nlohmann::json biases = nlohmann::json::object();
    for (const auto& [layer, values] : state.expert_biases) biases[std::to_string(layer)] = values;
    meta["expert_biases"] = std::move(biases);
  }
  meta["fnv1a64"] = json_checksum(meta);
  return meta;
}

std::optional<Newest> find_newest(const std::string& directory) {
  const std::string latest = directory + "/latest_checkpointed_iteration.txt";
  int64_t iteration = 0;
  Newest newest;
  if (checkpoint_path_exists(latest)) {
    iteration = read_latest(latest);
  } else {
    // A save killed between its rename and `latest`, or `latest` deleted: the newest whole one.
    const std::vector<int64_t> iterations = iteration_directories(directory);
    if (iterations.empty()) return std::nullopt;
    for (const int64_t candidate : iterations) {
      const std::string reason = incompleteness(directory + "/" + iteration_directory(candidate));
      if (reason.empty()) {
        iteration = candidate;
        break;
      }
      newest.incomplete.push_back(iteration_directory(candidate) + " (" + reason + ")");
    }
    if (newest.incomplete.size() == iterations.size()) {
      std::string listed;
      for (const std::string& skipped : newest.incomplete) listed += (listed.empty() ? "" : ", ") + skipped;
      refuse_load(directory + " holds no complete checkpoint, and no latest_checkpointed_iteration.txt: " + listed);
    }
  }
  newest.path = directory + "/" + iteration_directory(iteration);
  const std::string& path = newest.path;
  std::error_code error;
  if (!std::filesystem::is_directory(path, error)) {
    refuse_load(latest + " names iteration " + std::to_string(iteration) + " but " + path +
                (error && error != std::errc::no_such_file_or_directory ? ": " + error.message() : " does not exist"));
  }
  const std::string state_path = path + "/state.json";
  newest.meta = try_parse_json(read_checkpoint_json_text(state_path)).value_or(nlohmann::json());
  const nlohmann::json& meta = newest.meta;
  if (!meta.is_object() || !known_format(meta.value("format", "")) || !meta.contains("directories") ||
      !meta["directories"].is_array()) {
    const bool named = meta.is_object() && meta.contains("format");
    refuse_load(
        state_path + " is not a " + std::string(kFormat) + " checkpoint" +
        (named ? " (its format is " +
                     meta["format"].dump(-1, ' ', true, nlohmann::json::error_handler_t::replace).substr(0, 40) + ")"
               : ""));
  }
  verify_json_checksum(meta, state_path);
  TrainingState& state = newest.state;
  JsonFieldReader fields(meta, state_path);
  fields.require("iteration", state.iteration);
  fields.require("consumed_samples", state.consumed_samples);
  fields.require("seed", state.seed);
  if (state.consumed_samples < 0) {
    refuse_load(fields.field("consumed_samples") + ": must be non-negative, got " +
                std::to_string(state.consumed_samples));
  }
  if (const nlohmann::json* tokenizer = fields.read_object("tokenizer")) {
    state.tokenizer = tokenizer_from_json(*tokenizer, fields.field("tokenizer"));
  }
  fields.read("skipped_iterations", state.skipped_iterations);
  fields.read("skipped_samples", state.skipped_samples);
  if (state.skipped_iterations < 0 || state.skipped_iterations > state.iteration || state.skipped_samples < 0 ||
      state.skipped_samples > state.consumed_samples) {
    refuse_load(fields.field("skipped_iterations") + ": must lie between 0 and the iterations (and samples) done");
  }
  if (const nlohmann::json* scaler = fields.read_object("loss_scaler")) {
    JsonFieldReader scaler_fields(*scaler, fields.field("loss_scaler"));
    LossScalerState loaded;
    scaler_fields.require("scale", loaded.scale);
    scaler_fields.require("growth_tracker", loaded.growth_tracker);
    scaler_fields.require("hysteresis_tracker", loaded.hysteresis_tracker);
    scaler_fields.reject_unknown_keys();  // as the tokenizer's object beside it
    if (!(loaded.scale > 0) || !std::isfinite(loaded.scale) || loaded.growth_tracker < 0) {
      refuse_load(scaler_fields.field("scale") + ": must be a finite positive scale with a non-negative tracker");
    }
    state.loss_scaler = loaded;
  }
  if (const nlohmann::json* biases = fields.read_object("expert_biases")) {
    // Checked against the model where it is set (restore_expert_biases); here only its form.
    const std::string field = fields.field("expert_biases");
    for (const auto& [key, values] : biases->items()) {
      if (key.empty() || key.size() > 9 || key.find_first_not_of("0123456789") != std::string::npos) {
        const nlohmann::json named = key.substr(0, 40);  // quoted and escaped: one line whatever it holds
        refuse_load(field + ": " + named.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace) +
                    " is not a layer index");
      }
      if (!values.is_array()) refuse_load(field + "." + key + ": must be a list of numbers");
      std::vector<float>& bias = state.expert_biases[std::stoll(key)];
      for (const nlohmann::json& value : values) {
        if (!value.is_number()) refuse_load(field + "." + key + ": must be a list of numbers");
        bias.push_back(value.get<float>());
      }
    }
  }
  if (state.iteration != iteration) {
    refuse_load(path + "/state.json says iteration " + std::to_string(state.iteration) + " but " + latest + " says " +
                std::to_string(iteration));
  }
  for (const nlohmann::json& name : meta["directories"]) {
    if (!name.is_string()) refuse_load(path + "/state.json: \"directories\" holds a non-string");
    read_manifest(path, RankBinding{iteration, name.get<std::string>(), meta.value("plan", nlohmann::json())},
                  newest.saved);
  }
  return newest;
}

}  // namespace megaplan::exec::checkpoint_format
