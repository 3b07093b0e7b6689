// What megaplan's executor cannot run yet, in one home: `train` refuses it before starting, the
// planner leaves such plans out under --implementation megaplan (saying how many and why), and
// `simulate` notes it. Each is the SpecError the trainer throws: the flag and what is missing.
#pragma once

#include <optional>

#include "core/error.h"
#include "core/model_spec.h"
#include "core/parallel_plan.h"

namespace megaplan {

// A model the executor cannot build, whatever the layout (GELU without biases, ...).
std::optional<SpecError> executor_model_refusal(const ModelSpec& model);

// A layout the executor cannot run on GPUs, whatever the model (context parallelism, whose ring
// attention runs on the CPU backend only so far; Megatron-LM's code). `train --device cuda` refuses
// it, the planner and `simulate`, which plan GPU runs, leave it out or note it.
std::optional<SpecError> executor_plan_refusal(const ParallelPlan& plan);
// What no backend runs: Megatron-LM's code (the CPU backend refuses only this and the model's).
std::optional<SpecError> executor_implementation_refusal(Implementation implementation);
// The same from the only fields it reads, for the planner, which asks once per grid of hundreds of
// thousands of plans (building the refusal's message costs more than validating the plan).
std::optional<SpecError> executor_layout_refusal(int64_t context_parallel_size, Implementation implementation);

// Under --implementation megaplan, notes (core/notes.h) each refusal of `model` and `plan`: a plan
// `simulate` costs all the same (it is legal), but megaplan's own executor would refuse to train.
void note_executor_refusals(const ModelSpec& model, const ParallelPlan& plan);

}  // namespace megaplan
