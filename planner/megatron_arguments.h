// A plan as the Megatron-LM command-line arguments that run it.
#pragma once

#include <string>
#include <vector>

#include "core/model_spec.h"
#include "core/parallel_plan.h"

namespace megaplan::planner {

// "--tensor-model-parallel-size 8", "--pipeline-model-parallel-size 16", ... in pretrain_gpt.py's
// spelling, one argument (with its value) per entry. Megatron-LM has no zero-bubble or V schedule
// (torch.distributed.pipelining and torchtitan do): for those the last entry is a "# ..." note
// naming torchtitan's setting instead.
std::vector<std::string> megatron_arguments(const ModelSpec& model, const ParallelPlan& plan);

// Whether a run of the plan passes --overlap-grad-reduce (Megatron-LM's and megaplan train's flag):
// the simulator costs each gradient bucket's data-parallel reduction from the moment the backward
// fills it, so wherever there is a data-parallel reduction.
inline bool overlaps_gradient_reduction(const ParallelPlan& plan) { return plan.data_parallel_size > 1; }

}  // namespace megaplan::planner
