#include "simulator/plan_estimator.h"

#include <numeric>
#include <utility>
#include <vector>

#include "core/job_spec.h"
#include "simulator/simulate_plan.h"

namespace megaplan::sim {

SimulatorEstimator::SimulatorEstimator(ModelSpec model, ClusterSpec cluster, Profile profile)
    : model_(std::move(model)), cluster_(std::move(cluster)), profile_(std::move(profile)), topology_(cluster_) {}

LayerCosts SimulatorEstimator::layer_costs(const ParallelPlan& plan) const {
  const LayerKey key{plan.tensor_parallel_size, plan.context_parallel_size, plan.micro_batch_size,
                     plan.sequence_parallel, plan.recompute_granularity};
  {
    const std::lock_guard<std::mutex> lock(cache_mutex_);
    if (const auto found = layer_cache_.find(key); found != layer_cache_.end()) return found->second;
  }
  // Global rank 0's tensor- and context-parallel groups (Megatron's order puts tp fastest, then
  // cp): no group of either kind routes faster, so the layer is never cheaper than this.
  std::vector<int64_t> tensor_group(static_cast<std::size_t>(plan.tensor_parallel_size));
  std::iota(tensor_group.begin(), tensor_group.end(), 0);
  std::vector<int64_t> context_group;
  for (int64_t member = 0; member < plan.context_parallel_size; ++member) {
    context_group.push_back(member * plan.tensor_parallel_size);
  }
  const GroupRoutes routes{topology_.ring_route(tensor_group), topology_.ring_route(context_group),
                           topology_.ring_route({0})};
  CostSources sources;
  const LayerCosts costs = transformer_layer_costs(model_, plan, profile_, routes, sources);
  const std::lock_guard<std::mutex> lock(cache_mutex_);
  layer_cache_.emplace(key, costs);
  return costs;
}

double SimulatorEstimator::lower_bound_s(const ParallelPlan& plan) const {
  const LayerCosts layer = layer_costs(plan);
  const double layers_per_stage =
      static_cast<double>(model_.num_layers) / static_cast<double>(plan.num_virtual_stages());
  const double forward = layers_per_stage * layer.forward;
  const double backward = layers_per_stage * (layer.backward_input + layer.backward_weight);
  const double below = static_cast<double>(plan.pipeline_parallel_size - 1);
  double bound = below * forward +
                 static_cast<double>(plan.num_microbatches() * plan.virtual_pipeline_parallel_size) * (forward + backward);
  // Where the backward is not split, the last rank's last computation is its first stage's
  // backward of the last microbatch, and that microbatch's backward still has every stage below
  // to pass: (M + pp - 1)(F + B) for 1F1B, exactly its classic time without communication.
  const bool fused_backward = plan.schedule == ScheduleKind::kOneFOneB || plan.schedule == ScheduleKind::kInterleaved ||
                              plan.schedule == ScheduleKind::kGPipe;
  if (fused_backward) bound += below * backward;
  return bound;
}

StepEstimate SimulatorEstimator::estimate(const ParallelPlan& plan) const {
  const JobSpec job{model_, cluster_, plan};
  const PlanSimulation simulation = simulate_plan(job, profile_, topology_, false);
  StepEstimate estimate;
  estimate.iteration_time_s = simulation.result.iteration_time_s;
  estimate.model_tflops_per_gpu = simulation.model_tflops_per_gpu;
  estimate.mfu = simulation.mfu;
  estimate.bubble_fraction = simulation.result.bubble_fraction;
  const double ranks = static_cast<double>(simulation.result.ranks.size());
  for (const RankSimulation& rank : simulation.result.ranks) {
    estimate.compute_s += rank.compute_s / ranks;
    estimate.tensor_comm_s += rank.collective_s / ranks;
    estimate.pipeline_comm_s += rank.pipeline_comm_s / ranks;
    estimate.data_parallel_comm_s += rank.data_parallel_comm_s / ranks;
    estimate.idle_s += rank.idle_s / ranks;
  }
  return estimate;
}

}  // namespace megaplan::sim
