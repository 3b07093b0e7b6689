// A plan as torchtitan's TOML job config: the parallelism degrees, the pipeline schedule (torch's
// class name), microbatch size, layers per stage, batch sizes and activation checkpointing — what
// `search --emit torchtitan` prints for a torchtitan user to paste.
#pragma once

#include <string>

#include "core/model_spec.h"
#include "core/parallel_plan.h"

namespace megaplan::planner {

// The [model], [training], [parallelism] and [activation_checkpoint] tables. torchtitan names
// its model shapes by flavour: the Llama 3 presets map to theirs; any other model gets a comment
// saying which dimensions a flavour needs. What torchtitan cannot express (megaplan's exact order
// as a CSV, an uneven split it has no knob for) is said in comments.
std::string torchtitan_config(const ModelSpec& model, const ParallelPlan& plan);
// Throws SpecError("--emit", ...) for a model torchtitan_config cannot describe (one with experts).
void require_torchtitan_model(const ModelSpec& model);

}  // namespace megaplan::planner
