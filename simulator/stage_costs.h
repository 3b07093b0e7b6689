// The cost model: how long each action of a plan's schedule takes on one GPU, built from the
// kernels megaplan's executor launches (core/kernel_list.h: every GEMM in its layout and
// epilogue, flash attention, each memory-bound kernel) costed by the profile, and the collectives
// a layout adds — tensor-parallel all-reduces (or all-gathers and reduce-scatters with sequence
// parallelism) on the critical path inside each layer, context-parallel K/V exchange overlapping
// attention, pipeline transfers between stages, data-parallel gradient reduction in Megatron's
// buckets, and the optimizer step.
#pragma once

#include <cstdint>
#include <vector>

#include "core/model_spec.h"
#include "core/parallel_plan.h"
#include "simulator/engine.h"
#include "simulator/profile.h"
#include "simulator/topology.h"

namespace megaplan::sim {

// What a layer costs, split as the simulator needs it (seconds, one microbatch, one GPU).
struct LayerCosts {
  double forward = 0;
  double backward = 0;         // B: input and weight gradients, with recomputation
  double backward_input = 0;   // I, with recomputation
  double backward_weight = 0;  // W
  double forward_collectives = 0;
  double backward_collectives = 0;
};

// The routes a pipeline rank's groups communicate over: its tensor-, context- and data-parallel
// (dp x cp) rings, and with experts its expert-parallel, expert data-parallel and expert
// tensor-parallel (etp: the tensor-parallel ring where etp = tp) ones. Each is the
// slowest over all of that pipeline rank's groups of the kind (the replicas wait for the slowest),
// so a placement that puts some groups across nodes shows.
struct GroupRoutes {
  Route tensor;
  Route context;
  Route data;
  Route expert;
  Route expert_data;
  Route expert_tensor;
};
// One entry per pipeline rank, from Megatron's rank groups (order tp-cp-ep-dp-pp, global rank g on
// GPU g).
std::vector<GroupRoutes> pipeline_group_routes(const ParallelPlan& plan, const Topology& topology);

// One transformer layer; its forward is the cheaper of a stage's first layer and the later ones
// (whose input norm also adds the previous branch), so that stage costs are never below layers x
// these; `moe_layer`, an MoE layer's with its expert-parallel exchanges. REQUIRES:
// validate_plan(model, plan) passed; `moe_layer` only for a model with experts.
LayerCosts transformer_layer_costs(const ModelSpec& model, const ParallelPlan& plan, const Profile& profile,
                                   const GroupRoutes& routes, CostSources& sources, bool moe_layer = false);

// The output layer on the last stage, in the same split: final norm, the vocabulary-parallel
// projection (with its tensor-parallel gather and scatter) and the cross entropy.
LayerCosts output_layer_costs(const ModelSpec& model, const ParallelPlan& plan, const Profile& profile,
                              const Route& tensor_route, CostSources& sources);

// OPTIM on a pipeline rank holding `parameters_per_gpu` (`expert_parameters_per_gpu` of them routed
// experts'): the executor's optimizer kernels (the gradient norm, AdamW over its (shard of the)
// parameters, the gradient buffer zeroed) and with the distributed optimizer the all-gather of the
// updated parameters over dp x cp (the experts' over expert dp, on `expert_data_route`) and their
// compute copies.
double optimizer_step_seconds(const ParallelPlan& plan, int64_t parameters_per_gpu, const Profile& profile,
                              const Route& data_route, CostSources& sources, int64_t expert_parameters_per_gpu = 0,
                              const Route* expert_data_route = nullptr);

// Every stage and every pipeline rank of the plan on `topology` (the job's GPUs).
// REQUIRES: validate_plan(model, plan) passed; topology.num_gpus() == plan.world_size().
ActionCosts plan_action_costs(const ModelSpec& model, const ParallelPlan& plan, const Profile& profile,
                              const Topology& topology, CostSources& sources);

}  // namespace megaplan::sim
