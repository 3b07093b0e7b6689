// Named model presets (GPT-2 family, GPT-3, the PTD-P paper's 1T model, Llama 2/3/3.1), each with
// the parameter count its authors published, so tests can check our formulas against it.
#pragma once

#include <string>
#include <vector>

#include "core/model_spec.h"

namespace megaplan {

struct ModelPreset {
  ModelSpec spec;                // spec.name is the preset's name
  double published_parameters;   // as the citation states it
  std::string citation;
};

const std::vector<ModelPreset>& model_presets();

// Throws SpecError("--model", ...) listing the known names.
ModelSpec model_preset(const std::string& name);

}  // namespace megaplan
