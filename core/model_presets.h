// Named model presets (GPT-2 family, GPT-3, the PTD-P paper's 1T model, Llama 2/3/3.1), each with
// the parameter count its authors published, so tests can check our formulas against it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/model_spec.h"

namespace megaplan {

struct ModelPreset {
  ModelSpec spec;               // spec.name is the preset's name
  double published_parameters;  // as the citation states it
  std::string citation;
};

const std::vector<ModelPreset>& model_presets();

// Throws SpecError("--model", ...) listing the known names, and the nearest one when `name` looks
// like a typo of it (nearest_model_preset).
ModelSpec model_preset(const std::string& name);

// The preset `name` is a likely typo of: the one fewest edits away (Levenshtein, ignoring case),
// when at most a quarter of the name's characters (at least one) differ; nullopt otherwise.
std::optional<std::string> nearest_model_preset(const std::string& name);

}  // namespace megaplan
