// The layouts a search considers: every legal combination of tp, pp, cp, dp, vpp, mbs,
// recomputation, sequence parallelism, distributed optimizer and pipeline schedule for a model on
// a number of GPUs at a global batch size, narrowed by what the user pins or lists.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "core/parallel_plan.h"

namespace megaplan::planner {

// Each list holds the values a dimension may take; an empty list leaves it free (every legal value).
struct SearchSpace {
  std::vector<int64_t> tensor_parallel;
  std::vector<int64_t> pipeline_parallel;
  std::vector<int64_t> context_parallel;
  std::vector<int64_t> expert_parallel;  // models with experts: of the sizes dividing them
  // Models with experts: the routed experts' tensor-parallel sizes; free: tp and 1 (whole experts),
  // what megaplan's executor runs.
  std::vector<int64_t> expert_tensor_parallel;
  std::vector<int64_t> virtual_pipeline;
  std::vector<int64_t> layers_per_virtual_stage;  // Megatron's --num-layers-per-virtual-pipeline-stage
  std::vector<int64_t> micro_batch;
  std::vector<RecomputeGranularity> recompute;
  std::vector<bool> sequence_parallel;
  std::vector<bool> distributed_optimizer;
  std::vector<ScheduleKind> schedules;  // of 1f1b, interleaved, zb-h1, zbv, dualpipev (and gpipe if listed)
  bool allow_cross_node_tensor_parallel = false;
  double moe_imbalance = 1.0;  // the routed load every plan of a model with experts is costed at
  Implementation implementation = Implementation::kMegaplan;  // of every plan, with these options
  ImplementationOptions options = default_implementation_options(Implementation::kMegaplan);
};

struct SearchProblem {
  ModelSpec model;
  int64_t gpus = 1;
  int64_t gpus_per_node = 1;
  int64_t global_batch_size = 1;
  SearchSpace space;
};

// Throws SpecError naming the flag for a model megaplan's executor cannot train under
// --implementation megaplan, for a model with experts under Megatron-LM's (whose MoE layers are not
// costed: core/kernel_list.h's require_costed_layers), for a schedule a Megatron-LM implementation does not have, for a
// pin no layout can satisfy on its own (tp 3 with 32 heads, pp that does not divide the layers, a GPU count no pinned
// tp x pp x cp divides, ...) and for a global batch size that no data-parallel size of the remaining layouts divides.
// REQUIRES: validate_model_spec(problem.model) passed.
void validate_search_problem(const SearchProblem& problem);

// Every legal plan (validate_plan passes for each) that the implementation runs, in a fixed order:
// tp, pp, cp, ep, vpp, mbs, recompute, sequence parallel, distributed optimizer, schedule. A model
// with experts takes every ep dividing its experts and cp x dp (those listed), each plan at the
// stated imbalance, and under megaplan's implementation only what its executor runs
// (core/executor_support.h's executor_moe_refusal). With pp = 1
// only 1f1b is listed (the other schedules degenerate to it); gpipe only when listed; under a
// Megatron-LM implementation only its own schedules. Sequence parallelism is off where tp = 1, and
// the distributed optimizer off where dp x cp = 1 (it would shard over nothing). Validated on
// `threads` threads (planner/workers.h); the list does not depend on their count.
std::vector<ParallelPlan> enumerate_plans(const SearchProblem& problem, int64_t threads = 1);

// enumerate_plans' plans that `keep` accepts, in its order, and how many legal plans it met. `keep`
// is asked on the pool as each plan is made (concurrently from `threads` threads), so that a search
// holds only the plans it may rank: most of a large one's are over the memory limit on model state.
struct KeptPlans {
  std::vector<ParallelPlan> plans;
  int64_t legal = 0;
};
KeptPlans enumerate_kept_plans(const SearchProblem& problem, int64_t threads,
                               const std::function<bool(const ParallelPlan&)>& keep);

}  // namespace megaplan::planner
