// The simulator behind core's StepTimeEstimator: estimate() runs the whole simulate_plan; the lower
// bound costs one transformer layer (cached) and reasons about the pipeline without a schedule.
#pragma once

#include <map>
#include <mutex>
#include <tuple>

#include "core/cluster_spec.h"
#include "core/model_spec.h"
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
  // transformer layers on the fastest groups' routes. Embedding, output layer, transfers, the
  // gradient reduction and the optimizer step only add to the simulated time. Where the backward
  // is not split (1f1b, interleaved, gpipe) the last microbatch's backward then passes the pp - 1
  // stages below: + (pp - 1) B.
  double lower_bound_s(const ParallelPlan& plan) const override;
  StepEstimate estimate(const ParallelPlan& plan) const override;

 private:
  // What one layer's cost depends on: tp, cp, mbs, sequence parallelism and recomputation.
  using LayerKey = std::tuple<int64_t, int64_t, int64_t, bool, RecomputeGranularity>;
  LayerCosts layer_costs(const ParallelPlan& plan) const;

  ModelSpec model_;
  ClusterSpec cluster_;
  Profile profile_;
  Topology topology_;
  mutable std::mutex cache_mutex_;
  mutable std::map<LayerKey, LayerCosts> layer_cache_;
};

}  // namespace megaplan::sim
