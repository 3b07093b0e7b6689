// What megaplan's executor cannot run yet, in one home: `train` refuses it before starting, the
// planner leaves such plans out under --implementation megaplan (saying how many and why), and
// `simulate` notes it. Each is the SpecError the trainer throws: the flag and what is missing.
// And what the executor runs but megaplan does not plan yet: the planner leaves it out too.
#pragma once

#include <optional>

#include "core/error.h"
#include "core/model_spec.h"
#include "core/parallel_plan.h"

namespace megaplan {

// A model the executor cannot build, whatever the layout (GELU without biases, ...).
std::optional<SpecError> executor_model_refusal(const ModelSpec& model);

// A layout the executor cannot run, whatever the model (Megatron-LM's code).
std::optional<SpecError> executor_plan_refusal(const ParallelPlan& plan);

// A layout the executor runs but megaplan does not plan under its own implementation yet: context
// parallelism, whose ring attention the simulator does not yet cost as the executor runs it (each
// step's blocks beside its key-value exchange; issue 39). From the only field it reads, for the
// planner, which asks once per grid of hundreds of thousands of plans.
std::optional<SpecError> unplanned_layout(int64_t context_parallel_size);

// Under --implementation megaplan, notes (core/notes.h) each refusal of `model` and `plan`, and a
// layout not planned yet: a plan `simulate` costs all the same (it is legal), but megaplan's own
// executor would refuse to train it, or runs it otherwise than simulated.
void note_executor_refusals(const ModelSpec& model, const ParallelPlan& plan);

}  // namespace megaplan
