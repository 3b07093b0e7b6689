// A plan as a torchtitan config module: what `search --emit torchtitan` prints for a torchtitan
// user to save and run. torchtitan (since mid-2026) takes no job files: a run names a Python
// module and a function in it that returns a Trainer.Config (`-m torchtitan.train --module M
// --config F`), so the plan is written as such a function. It starts from the registry config of
// the model's torchtitan flavour and sets the parallelism degrees, the pipeline schedule (torch's
// class name), microbatches, layers per stage, token counts, experts and activation checkpointing.
#pragma once

#include <string>

#include "core/model_spec.h"
#include "core/parallel_plan.h"

namespace megaplan::planner {

// The module's text. torchtitan names its model shapes by flavour: the Llama 3 and Qwen3 presets
// map to theirs; any other model gets a comment saying which dimensions a flavour needs. What
// torchtitan runs differently (megaplan's exact order as a CSV, an uneven split it has no knob
// for, another router balancing) is said in comments; what it cannot run at all is refused
// (SpecError "--emit"): require_torchtitan_model's models, fp16, and expert layouts other than
// torchtitan's two (experts cut over tp without expert parallelism; whole experts over an ep group
// drawn from the sharded data-parallel, cp and tp ranks).
std::string torchtitan_config(const ModelSpec& model, const ParallelPlan& plan);
// Throws SpecError("--emit", ...) for a model torchtitan has no model kind for: experts without
// Qwen3's query and key norms (Mixtral's kind), or query and key norms on a model that is not SwiGLU
// and RMSNorm. Checked before a search, so that the search is not run in vain.
void require_torchtitan_model(const ModelSpec& model);
// Throws SpecError("--emit", ...) for a plan torchtitan cannot run (torchtitan_config's refusals
// beyond the model's), naming the search flag that avoids it; checked before anything is written.
void require_torchtitan_plan(const ModelSpec& model, const ParallelPlan& plan);

}  // namespace megaplan::planner
