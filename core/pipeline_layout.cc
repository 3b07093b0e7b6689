// Virtual stage layout.
#include "core/pipeline_layout.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace megaplan {

namespace {

// Layers per pipeline rank under --decoder-first/last-pipeline-num-layers.
std::vector<int64_t> first_last_rank_layers(const ModelSpec& model, const ParallelPlan& plan) {
  const PipelineSplit& split = plan.pipeline_split;
  const int64_t pp = plan.pipeline_parallel_size;
  const char* flag =
      split.first_stage_layers > 0 ? "--decoder-first-pipeline-num-layers" : "--decoder-last-pipeline-num-layers";
  if (split.account_for_embedding || split.account_for_loss) {
    throw SpecError(flag,
                    "cannot be combined with --account-for-embedding-in-pipeline-split or "
                    "--account-for-loss-in-pipeline-split");
  }
  if (pp < 2) throw SpecError(flag, "needs --pipeline-model-parallel-size > 1");
  if (split.first_stage_layers < 0 || split.last_stage_layers < 0) throw SpecError(flag, "must be positive");
  std::vector<int64_t> ranks(static_cast<std::size_t>(pp), 0);
  int64_t rest = model.num_layers - split.first_stage_layers - split.last_stage_layers;
  int64_t sharing = pp - (split.first_stage_layers > 0 ? 1 : 0) - (split.last_stage_layers > 0 ? 1 : 0);
  if (rest < 0 || (sharing == 0 && rest != 0) || (sharing > 0 && rest % sharing != 0)) {
    throw SpecError(flag, "leaves " + std::to_string(rest) + " of the " + std::to_string(model.num_layers) +
                              " layers to the other " + std::to_string(sharing) +
                              " pipeline rank(s), which cannot share them evenly");
  }
  for (int64_t rank = 0; rank < pp; ++rank) ranks[static_cast<std::size_t>(rank)] = sharing > 0 ? rest / sharing : 0;
  if (split.first_stage_layers > 0) ranks.front() = split.first_stage_layers;
  if (split.last_stage_layers > 0) ranks.back() = split.last_stage_layers;
  return ranks;
}

// Each pipeline rank's layers split evenly over its virtual stages.
void require_split_over_virtual_stages(const std::vector<int64_t>& ranks, int64_t vpp) {
  for (std::size_t rank = 0; rank < ranks.size(); ++rank) {
    if (ranks[rank] % vpp != 0) {
      throw SpecError("--virtual-pipeline-model-parallel-size",
                      "must divide the " + std::to_string(ranks[rank]) + " layers of pipeline rank " +
                          std::to_string(rank) + " (layers per rank " + std::to_string(ranks.front()) + ", ..., " +
                          std::to_string(ranks.back()) + ")");
    }
  }
}

}  // namespace

std::vector<int64_t> stage_layer_counts(const ModelSpec& model, const ParallelPlan& plan) {
  const PipelineSplit& split = plan.pipeline_split;
  const int64_t pp = plan.pipeline_parallel_size;
  const int64_t vpp = plan.virtual_pipeline_parallel_size;
  const int64_t stages = plan.num_virtual_stages();
  std::vector<int64_t> counts(static_cast<std::size_t>(stages), 0);
  if (split.first_stage_layers != 0 || split.last_stage_layers != 0) {
    const std::vector<int64_t> ranks = first_last_rank_layers(model, plan);
    const StagePlacement placement = stage_placement(plan.schedule);
    require_split_over_virtual_stages(ranks, vpp);
    for (int64_t stage = 0; stage < stages; ++stage) {
      counts[static_cast<std::size_t>(stage)] =
          ranks[static_cast<std::size_t>(pipeline_rank_of_stage(stage, pp, placement))] / vpp;
    }
  } else {
    // The embedding and the loss, where they count, as one layer each.
    const int64_t units = model.num_layers + (split.account_for_embedding ? 1 : 0) + (split.account_for_loss ? 1 : 0);
    if (units % stages != 0) {
      const std::string counted =
          split.even() ? "" : " (with the embedding or loss counted as layers: " + std::to_string(units) + ")";
      throw SpecError("--num-layers", std::to_string(model.num_layers) + counted +
                                          " must be divisible by pp*vpp = " + std::to_string(pp) + "*" +
                                          std::to_string(vpp) + " = " + std::to_string(stages) +
                                          "; uneven stages: --decoder-first-pipeline-num-layers, "
                                          "--decoder-last-pipeline-num-layers");
    }
    std::fill(counts.begin(), counts.end(), units / stages);
    if (split.account_for_embedding) --counts.front();
    if (split.account_for_loss) --counts.back();
  }
  for (int64_t stage = 0; stage < stages; ++stage) {
    if (counts[static_cast<std::size_t>(stage)] < 1) {
      throw SpecError(split.even() ? "--num-layers" : "--pipeline-model-parallel-size",
                      "leaves virtual stage " + std::to_string(stage) + " without a transformer layer");
    }
  }
  return counts;
}

int64_t most_stage_layers(const ModelSpec& model, const ParallelPlan& plan) {
  const PipelineSplit& split = plan.pipeline_split;
  const int64_t stages = plan.num_virtual_stages();
  const int64_t vpp = plan.virtual_pipeline_parallel_size;
  if (split.even() && stages > 0 && model.num_layers % stages == 0 && model.num_layers >= stages) {
    return model.num_layers / stages;
  }
  if (split.first_stage_layers != 0 || split.last_stage_layers != 0) {
    // Every stage holds its rank's layers over vpp: the ranks alone, without the stages.
    const std::vector<int64_t> ranks = first_last_rank_layers(model, plan);
    require_split_over_virtual_stages(ranks, vpp);
    if (*std::min_element(ranks.begin(), ranks.end()) >= vpp)
      return *std::max_element(ranks.begin(), ranks.end()) / vpp;
  }
  const std::vector<int64_t> counts = stage_layer_counts(model, plan);  // throws where the layers do not split
  return *std::max_element(counts.begin(), counts.end());
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

}  // namespace megaplan

namespace megaplan {

StageLayers stage_layers(int64_t stage, const ModelSpec& model, const ParallelPlan& plan) {
  StageLayers layers;
  if (plan.pipeline_split.even()) {  // the common case without a vector: the simulator asks often
    layers.num_layers = model.num_layers / plan.num_virtual_stages();
    layers.first_layer = stage * layers.num_layers;
  } else {
    const std::vector<int64_t> counts = stage_layer_counts(model, plan);
    for (int64_t s = 0; s < stage; ++s) layers.first_layer += counts[static_cast<std::size_t>(s)];
    layers.num_layers = counts[static_cast<std::size_t>(stage)];
  }
  layers.has_embedding = stage == 0;
  layers.has_output_layer = stage == plan.num_virtual_stages() - 1;
  return layers;
}

}  // namespace megaplan

namespace megaplan {

std::vector<LayerGroup> recompute_groups(const ParallelPlan& plan, int64_t num_layers) {
  const bool full = plan.recompute_granularity == RecomputeGranularity::kFull;
  const int64_t n = plan.recompute_num_layers;
  std::vector<LayerGroup> groups;
  for (int64_t l = 0; l < num_layers;) {
    LayerGroup group;
    group.first_layer = l;
    if (full && plan.recompute_method == RecomputeMethod::kUniform) {
      group.num_layers = std::min(n, num_layers - l);
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
