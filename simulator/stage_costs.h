// The cost model: how long each action of a plan's schedule takes on one GPU, built from the
// kernels of a transformer layer (GEMMs, flash attention, element-wise passes), the embedding
// and the output layer, and the collectives a layout adds — tensor-parallel all-reduces (or
// all-gathers and reduce-scatters with sequence parallelism) on the critical path inside each
// layer, context-parallel K/V exchange overlapping attention, pipeline transfers between stages,
// data-parallel gradient reduction in Megatron's buckets, and the optimizer step.
#pragma once

#include <cstdint>

#include "core/model_spec.h"
#include "core/parallel_plan.h"
#include "simulator/engine.h"
#include "simulator/profile.h"
#include "simulator/topology.h"

namespace megaplan::sim {

// Megatron's default DDP bucket: max(40M, 1M x dp) parameters.
int64_t gradient_bucket_parameters(int64_t data_parallel_size);

// What a layer costs, split as the simulator needs it (seconds, one microbatch, one GPU).
struct LayerCosts {
  double forward = 0;
  double backward_input = 0;   // with recomputation
  double backward_weight = 0;
  double forward_collectives = 0;
  double backward_collectives = 0;
};

// The routes a layout's groups communicate over, for pipeline rank 0's representative GPU (global
// rank of tp, cp and dp index 0): tensor-, context- and data-parallel (dp x cp) rings. Every
// pipeline rank's groups are alike when tp x cp x dp fills whole nodes or divides one.
struct GroupRoutes {
  Route tensor;
  Route context;
  Route data;
};
GroupRoutes plan_group_routes(const ParallelPlan& plan, const Topology& topology);

// One transformer layer. REQUIRES: validate_plan(model, plan) passed.
LayerCosts transformer_layer_costs(const ModelSpec& model, const ParallelPlan& plan, const Profile& profile,
                                   const GroupRoutes& routes, CostSources& sources);

// Every stage and every pipeline rank of the plan on `topology` (the job's GPUs).
// REQUIRES: validate_plan(model, plan) passed; topology.num_gpus() == plan.world_size().
ActionCosts plan_action_costs(const ModelSpec& model, const ParallelPlan& plan, const Profile& profile,
                              const Topology& topology, CostSources& sources);

}  // namespace megaplan::sim
