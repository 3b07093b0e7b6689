// Virtual stage layout.
#include "core/pipeline_layout.h"

#include <algorithm>

namespace megaplan {

int64_t layers_per_virtual_stage(const ModelSpec& model, const ParallelPlan& plan) {
  return model.num_layers / plan.num_virtual_stages();
}

std::vector<int64_t> stages_of_pipeline_rank(int64_t pipeline_rank, const ParallelPlan& plan) {
  const StagePlacement placement = stage_placement(plan.schedule);
  std::vector<int64_t> stages;
  for (int64_t stage = 0; stage < plan.num_virtual_stages(); ++stage) {
    if (pipeline_rank_of_stage(stage, plan.pipeline_parallel_size, placement) == pipeline_rank) {
      stages.push_back(stage);
    }
  }
  return stages;
}

int64_t first_layer_of_stage(int64_t stage, const ModelSpec& model, const ParallelPlan& plan) {
  return stage * layers_per_virtual_stage(model, plan);
}

}  // namespace megaplan

namespace megaplan {

StageLayers stage_layers(int64_t stage, const ModelSpec& model, const ParallelPlan& plan) {
  StageLayers layers;
  layers.first_layer = first_layer_of_stage(stage, model, plan);
  layers.num_layers = layers_per_virtual_stage(model, plan);
  layers.has_embedding = stage == 0;
  layers.has_output_layer = stage == plan.num_virtual_stages() - 1;
  return layers;
}

}  // namespace megaplan

namespace megaplan {

std::vector<LayerGroup> recompute_groups(const ModelSpec& model, const ParallelPlan& plan) {
  const int64_t layers = layers_per_virtual_stage(model, plan);
  const bool full = plan.recompute_granularity == RecomputeGranularity::kFull;
  const int64_t n = plan.recompute_num_layers;
  std::vector<LayerGroup> groups;
  for (int64_t l = 0; l < layers;) {
    LayerGroup group;
    group.first_layer = l;
    if (full && plan.recompute_method == RecomputeMethod::kUniform) {
      group.num_layers = std::min(n, layers - l);
      group.recomputed = true;
    } else {
      group.recomputed = full && l < n;  // block: the first N alone
    }
    l += group.num_layers;
    groups.push_back(group);
  }
  return groups;
}

std::vector<LayerKeep> layer_keeps(const ParallelPlan& plan, const std::vector<LayerGroup>& groups) {
  std::vector<LayerKeep> keeps;
  for (const LayerGroup& group : groups) {
    for (int64_t l = 0; l < group.num_layers; ++l) {
      if (group.recomputed) {
        keeps.push_back(l == 0 ? LayerKeep::kInput : LayerKeep::kNothing);
      } else {
        keeps.push_back(plan.recompute_granularity == RecomputeGranularity::kSelective ? LayerKeep::kAllButAttention
                                                                                       : LayerKeep::kAll);
      }
    }
  }
  return keeps;
}

}  // namespace megaplan
