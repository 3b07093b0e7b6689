#include "simulator/plan_estimator.h"

#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

#include "core/formulas.h"
#include "core/job_spec.h"
#include "core/schedule/schedule_traits.h"
#include "simulator/simulate_plan.h"

namespace megaplan::sim {

SimulatorEstimator::SimulatorEstimator(ModelSpec model, ClusterSpec cluster, Profile profile)
    : model_(std::move(model)), cluster_(std::move(cluster)), profile_(std::move(profile)), topology_(cluster_) {}

SimulatorEstimator::Costs SimulatorEstimator::layer_costs(const ParallelPlan& plan) const {
  const LayerKey key{plan.tensor_parallel_size, plan.context_parallel_size, plan.micro_batch_size,
                     plan.sequence_parallel,    plan.recompute_granularity, plan.expert_model_parallel_size};
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
  // Its expert-parallel group (the expert layers' order tp-ep-dp-pp: ep strides by tp).
  std::vector<int64_t> expert_group;
  for (int64_t member = 0; member < plan.expert_model_parallel_size; ++member) {
    expert_group.push_back(member * plan.tensor_parallel_size);
  }
  const Route alone = topology_.ring_route({0});
  const GroupRoutes routes{topology_.ring_route(tensor_group), topology_.ring_route(context_group), alone,
                           topology_.ring_route(expert_group), alone};
  CostSources sources;
  Costs costs{{}, output_layer_costs(model_, plan, profile_, routes.tensor, sources)};
  // With experts, each part at the cheaper of the model's kinds of layer, a bound on any layer.
  const int64_t moe_layers = model_.moe.moe_layers(0, model_.num_layers);
  const bool dense_layers = moe_layers < model_.num_layers;
  if (dense_layers) costs.layer = transformer_layer_costs(model_, plan, profile_, routes, sources);
  if (moe_layers > 0) {
    const LayerCosts moe = transformer_layer_costs(model_, plan, profile_, routes, sources, true);
    if (!dense_layers) {
      costs.layer = moe;
    } else {
      for (const auto part :
           {&LayerCosts::forward, &LayerCosts::backward, &LayerCosts::backward_input, &LayerCosts::backward_weight,
            &LayerCosts::forward_collectives, &LayerCosts::backward_collectives}) {
        costs.layer.*part = std::min(costs.layer.*part, moe.*part);
      }
    }
  }
  const std::lock_guard<std::mutex> lock(cache_mutex_);
  layer_cache_.emplace(key, costs);
  return costs;
}

double SimulatorEstimator::optimizer_seconds(const ParallelPlan& plan, int64_t rank) const {
  const int64_t parameters_per_gpu = parameters_.per_pipeline_rank(plan)[static_cast<std::size_t>(rank)];
  const int64_t replicas = plan.gradient_group_size();
  const auto route_key = std::pair(plan.tensor_parallel_size, replicas);
  std::unique_lock<std::mutex> lock(cache_mutex_);
  auto route = data_route_cache_.find(route_key);
  if (route == data_route_cache_.end()) {
    std::vector<int64_t> group;  // Megatron's order tp-cp-ep-dp-pp: rank 0's dp x cp group strides by tp
    for (int64_t member = 0; member < replicas; ++member) group.push_back(member * plan.tensor_parallel_size);
    route = data_route_cache_.emplace(route_key, topology_.ring_route(group)).first;
  }
  const Route data_route = route->second;
  lock.unlock();
  CostSources sources;
  if (!model_.moe.enabled()) return optimizer_step_seconds(plan, parameters_per_gpu, profile_, data_route, sources);
  // The routed experts' share, apart (their gradients norm and shard over expert dp): global rank
  // 0's expert data-parallel group (the expert layers' order tp-ep-dp-pp strides it by tp x ep).
  const int64_t experts = parameters_per_pipeline_rank(model_, plan)[static_cast<std::size_t>(rank)].expert_per_gpu;
  std::vector<int64_t> expert_replicas;
  for (int64_t member = 0; member < plan.expert_data_parallel_size(); ++member) {
    expert_replicas.push_back(member * plan.tensor_parallel_size * plan.expert_model_parallel_size);
  }
  const Route expert_data_route = topology_.ring_route(expert_replicas);
  return optimizer_step_seconds(plan, parameters_per_gpu, profile_, data_route, sources, experts, &expert_data_route);
}

double SimulatorEstimator::lower_bound_s(const ParallelPlan& plan) const {
  const Costs costs = layer_costs(plan);
  const LayerCosts& layer = costs.layer;
  const LayerCosts& head = costs.output_layer;
  const double layers_per_stage =
      static_cast<double>(model_.num_layers) / static_cast<double>(plan.num_virtual_stages());
  const double forward = layers_per_stage * layer.forward;
  const double backward = layers_per_stage * layer.backward;  // B: never more than I + W
  const auto microbatches = static_cast<double>(plan.num_microbatches());
  const double rank_work =
      microbatches * static_cast<double>(plan.virtual_pipeline_parallel_size) * (forward + backward);
  const double head_work = microbatches * (head.forward + head.backward);
  const double below = static_cast<double>(plan.pipeline_parallel_size - 1);
  const bool v_placement = stage_placement(plan.schedule) == StagePlacement::kV;
  const int64_t last = plan.pipeline_parallel_size - 1;
  double last_rank = below * forward + rank_work + (v_placement ? 0 : head_work) + optimizer_seconds(plan, last);
  if (!schedule_traits(plan.schedule).splits_backward) last_rank += below * backward;
  const double first_rank = v_placement ? rank_work + head_work + optimizer_seconds(plan, 0) : 0;
  return std::max(last_rank, first_rank);
}

StepEstimate SimulatorEstimator::estimate(const ParallelPlan& plan, const PipelineSchedule& lowered) const {
  const JobSpec job{model_, cluster_, plan};
  CostSources sources;
  const SimulationResult result = simulate_lowered(job, profile_, topology_, lowered, false, sources);
  const ThroughputRates rates = throughput_rates(job, result.iteration_time_s);
  StepEstimate estimate;
  estimate.iteration_time_s = result.iteration_time_s;
  estimate.model_tflops_per_gpu = rates.model_tflops_per_gpu;
  estimate.mfu = rates.mfu;
  estimate.bubble_fraction = result.bubble_fraction;
  const double ranks = static_cast<double>(result.ranks.size());
  for (const RankSimulation& rank : result.ranks) {
    estimate.compute_s += rank.compute_s / ranks;
    estimate.tensor_comm_s += rank.collective_s / ranks;
    estimate.pipeline_comm_s += rank.pipeline_comm_s / ranks;
    estimate.data_parallel_comm_s += rank.data_parallel_comm_s / ranks;
    estimate.idle_s += rank.idle_s / ranks;
  }
  return estimate;
}

}  // namespace megaplan::sim
