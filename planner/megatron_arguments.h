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

// Whether a run of the plan passes --overlap-grad-reduce (Megatron-LM's and megaplan train's flag):
// where the plan's implementation overlaps it (the simulator then costs each gradient bucket's
// reduction from the moment the backward fills it) and there is a data-parallel reduction.
inline bool overlaps_gradient_reduction(const ParallelPlan& plan) {
  return plan.options.overlap_grad_reduce && plan.data_parallel_size > 1;
}

}  // namespace megaplan::planner
