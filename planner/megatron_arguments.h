// A plan as the Megatron-LM command-line arguments that run it.
#pragma once

#include <string>
#include <vector>

#include "core/model_spec.h"
#include "core/parallel_plan.h"

namespace megaplan::planner {

// "--tensor-model-parallel-size 8", "--pipeline-model-parallel-size 16", ... in pretrain_gpt.py's
// spelling, one argument (with its value) per entry: the layout, then the implementation options the
// simulation assumed (precision, transformer implementation, dropout, the fusions and overlaps that
// take effect). Megatron-LM has no zero-bubble or V schedule
// (torch.distributed.pipelining and torchtitan do): for those the last entry is a "# ..." note
// naming torchtitan's setting instead.
std::vector<std::string> megatron_arguments(const ModelSpec& model, const ParallelPlan& plan);

}  // namespace megaplan::planner
