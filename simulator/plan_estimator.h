// The simulator behind core's StepTimeEstimator: estimate() runs the engine on the plan's lowered
// schedule; the lower bound costs one transformer layer (cached) and reasons about the pipeline
// without a schedule.
#pragma once

#include <tuple>
#include <utility>
#include <vector>

#include "core/cluster_spec.h"
#include "core/formulas.h"
#include "core/model_spec.h"
#include "core/shared_by_key.h"
#include "core/step_time_estimator.h"
#include "simulator/profile.h"
#include "simulator/stage_costs.h"
#include "simulator/topology.h"

namespace megaplan::sim {

class SimulatorEstimator final : public StepTimeEstimator {
 public:
  // `cluster` is the job's GPUs (select_gpus); `profile` is for its GPU type.
  SimulatorEstimator(ModelSpec model, ClusterSpec cluster, Profile profile);

  // The last pipeline rank cannot start before the forward of the microbatch it first runs has
  // passed every stage below it, and then computes all of its stages' work for every microbatch
  // back to back at best: (pp - 1) F + M * vpp * (F + B + W), with F, B, W one virtual stage's
  // transformer layers on the fastest groups' routes, plus M times the output layer where the last
  // stage is that rank's (loop placement; in a V it is rank 0's, which gives a second bound).
  // Where the backward is not split (core's schedule_traits: 1f1b, interleaved, gpipe) the last
  // microbatch's backward then passes the pp - 1 stages below: + (pp - 1) B. OPTIM follows all of
  // the rank's work: + its step.
  // The embedding, transfers and the gradient reduction only add to the simulated time.
  double lower_bound_s(const ParallelPlan& plan) const override;
  using StepTimeEstimator::estimate;
  // The engine's run (simulate_lowered); memory is the planner's own.
  StepEstimate estimate(const ParallelPlan& plan, const PipelineSchedule& lowered) const override;

 private:
  // What one layer's cost depends on: tp, cp, mbs, sequence parallelism, recomputation and ep.
  using LayerKey = std::tuple<int64_t, int64_t, int64_t, bool, RecomputeGranularity, int64_t, int64_t>;
  struct Costs {
    LayerCosts layer;
    LayerCosts output_layer;
  };
  Costs layer_costs(const ParallelPlan& plan) const;  // cached
  Costs make_layer_costs(const ParallelPlan& plan) const;
  // OPTIM's time on pipeline rank `rank` (on the fastest data-parallel route).
  double optimizer_seconds(const ParallelPlan& plan, int64_t rank) const;
  // The ring route of global ranks 0, stride, 2 stride, ... (`members` of them): rank 0's group of a
  // kind, each kind striding by the sizes Megatron's order puts before it. Cached.
  Route strided_route(int64_t stride, int64_t members) const;

  ModelSpec model_;
  ClusterSpec cluster_;
  Profile profile_;
  Topology topology_;
  // layer_costs' answers: a search's threads bound neighbouring plans, which share layers, at once.
  mutable SharedByKey<LayerKey, Costs> layer_cache_;
  ParametersPerGpuCache parameters_{model_};
  // strided_route's answers, by stride and members.
  mutable SharedByKey<std::pair<int64_t, int64_t>, Route> route_cache_;
};

}  // namespace megaplan::sim
