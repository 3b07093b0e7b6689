#include "simulator/plan_estimator.h"

#include <algorithm>
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
  const LayerKey key{plan.tensor_parallel_size,    plan.context_parallel_size, plan.micro_batch_size,
                     plan.sequence_parallel,       plan.recompute_granularity, plan.expert_model_parallel_size,
                     plan.expert_tensor_parallel()};
  return *layer_cache_.get(key, [&] { return make_layer_costs(plan); });
}

SimulatorEstimator::Costs SimulatorEstimator::make_layer_costs(const ParallelPlan& plan) const {
  // Global rank 0's tensor-, context- and expert-parallel groups (Megatron's order puts tp fastest,
  // then cp; the expert layers' etp, then ep): no group of a kind routes faster, so the layer is
  // never cheaper than this.
  const int64_t tp = plan.tensor_parallel_size;
  const Route alone = strided_route(1, 1);
  const GroupRoutes routes{strided_route(1, tp),
                           strided_route(tp, plan.context_parallel_size),
                           alone,
                           strided_route(plan.expert_tensor_parallel(), plan.expert_model_parallel_size),
                           alone,
                           strided_route(1, plan.expert_tensor_parallel())};
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
  return costs;
}

Route SimulatorEstimator::strided_route(int64_t stride, int64_t members) const {
  return *route_cache_.get(std::pair(stride, members), [&] {
    std::vector<int64_t> group;
    for (int64_t member = 0; member < members; ++member) group.push_back(member * stride);
    return topology_.ring_route(group);
  });
}

double SimulatorEstimator::optimizer_seconds(const ParallelPlan& plan, int64_t rank) const {
  const auto index = static_cast<std::size_t>(rank);
  // Global rank 0's dp x cp group (Megatron's order tp-cp-ep-dp-pp strides it by tp) and, for the
  // routed experts' share, its expert data-parallel group (the expert layers' etp-ep-dp-pp: by etp
  // x ep), whose gradients norm and shard apart.
  const int64_t tp = plan.tensor_parallel_size;
  const Route data_route = strided_route(tp, plan.gradient_group_size());
  const Route expert_data_route =
      strided_route(plan.expert_tensor_parallel() * plan.expert_model_parallel_size, plan.expert_data_parallel_size());
  CostSources sources;
  return optimizer_step_seconds(plan, parameters_.per_pipeline_rank(plan)[index], profile_, data_route, sources,
                                parameters_.experts_per_pipeline_rank(plan)[index], &expert_data_route);
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
