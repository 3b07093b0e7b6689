// What megaplan's executor cannot run yet, in one home: `train` refuses it before starting, the
// planner refuses to search such a model under --implementation megaplan, and `simulate` notes it. Each is the
// SpecError the trainer throws: the flag and what is missing.
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

// A layout the executor cannot run a model with experts on yet (issue 40: MoE layers train with
// any ep, tp with sequence parallelism (not with --tp-comm-overlap; seq_aux_loss where tp divides
// the micro-batch size), any cp (not with seq_aux_loss), any recomputation, without a schedule that
// splits the backward).
std::optional<SpecError> executor_moe_refusal(const ModelSpec& model, const ParallelPlan& plan);

// Under --implementation megaplan, notes (core/notes.h) each refusal of `model` and `plan`: a plan
// `simulate` costs all the same (it is legal), but megaplan's own executor would refuse to train it.
void note_executor_refusals(const ModelSpec& model, const ParallelPlan& plan);

}  // namespace megaplan
