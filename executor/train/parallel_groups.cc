#include "executor/train/parallel_groups.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "core/pipeline_layout.h"
#include "core/rank_groups.h"

namespace megaplan::exec {

namespace {

// The kind `label` of core's groups, with the one holding `rank` marked.
GroupKind kind_of(const RankGroups& groups, std::string_view label, int64_t rank) {
  GroupKind kind{std::string(label), groups.at(label), -1};
  for (std::size_t g = 0; g < kind.groups.size(); ++g) {
    if (std::find(kind.groups[g].begin(), kind.groups[g].end(), rank) != kind.groups[g].end()) {
      kind.mine = static_cast<int64_t>(g);
    }
  }
  if (kind.mine < 0) throw std::logic_error("rank " + std::to_string(rank) + " is in no " + kind.label + " group");
  return kind;
}

int64_t position_in(const GroupKind& kind, int64_t rank) {
  const std::vector<int64_t>& group = kind.groups[static_cast<std::size_t>(kind.mine)];
  return std::find(group.begin(), group.end(), rank) - group.begin();
}

RankGroups plan_rank_groups(const ParallelPlan& plan) {
  return megatron_rank_groups(plan.world_size(), plan.tensor_parallel_size, plan.pipeline_parallel_size,
                              plan.context_parallel_size, plan.expert_model_parallel_size,
                              std::string(kDefaultParallelOrder), plan.expert_tensor_parallel());
}

}  // namespace

bool needs_communicator(const GroupKind& kind) {
  return kind.mine >= 0 && kind.groups[static_cast<std::size_t>(kind.mine)].size() > 1;
}

std::vector<RankPlace> rank_places(const ParallelPlan& plan) {
  const RankGroups groups = plan_rank_groups(plan);
  std::vector<RankPlace> places(static_cast<std::size_t>(plan.world_size()));
  for (const auto& [label, field] :
       {std::pair{"tp", &RankPlace::tensor_parallel_rank}, std::pair{"pp", &RankPlace::pipeline_rank},
        std::pair{"ep", &RankPlace::expert_parallel_rank},
        std::pair{"expert-tp", &RankPlace::expert_tensor_parallel_rank}, std::pair{"dp-cp", &RankPlace::replica_rank},
        std::pair{"expert-dp", &RankPlace::expert_replica_rank}}) {
    for (const std::vector<int64_t>& group : groups.at(label)) {
      for (std::size_t position = 0; position < group.size(); ++position) {
        places[static_cast<std::size_t>(group[position])].*field = static_cast<int64_t>(position);
      }
    }
  }
  return places;
}

std::vector<RankPlace> checkpoint_writers(const ModelSpec& model, const ParallelPlan& plan) {
  std::map<std::tuple<int64_t, int64_t, int64_t>, RankPlace> writers;
  for (const RankPlace& place : rank_places(plan)) {
    bool experts = false;
    for (const int64_t stage : stages_of_pipeline_rank(place.pipeline_rank, plan)) {
      const StageLayers layers = stage_layers(stage, model, plan);
      experts = experts || model.moe.moe_layers(layers.first_layer, layers.num_layers) > 0;
    }
    if (place.replica_rank != 0 && !(experts && place.expert_replica_rank == 0)) continue;
    writers.emplace(std::tuple(place.pipeline_rank, place.tensor_parallel_rank, place.expert_parallel_rank), place);
  }
  std::vector<RankPlace> ordered;
  for (const auto& [key, place] : writers) ordered.push_back(place);
  return ordered;
}

ParallelGroups make_parallel_groups(const ParallelPlan& plan, int64_t global_rank, const CommFactory& make) {
  const RankGroups groups = plan_rank_groups(plan);
  ParallelGroups result;
  result.global_rank = global_rank;
  const GroupKind tensor_parallel = kind_of(groups, "tp", global_rank);
  const GroupKind pipeline = kind_of(groups, "pp", global_rank);
  const GroupKind data_parallel = kind_of(groups, "dp", global_rank);
  const GroupKind context_parallel = kind_of(groups, "cp", global_rank);
  const GroupKind replicas = kind_of(groups, "dp-cp", global_rank);
  const GroupKind model_parallel = kind_of(groups, "tp-pp", global_rank);
  result.tensor_parallel_rank = position_in(tensor_parallel, global_rank);
  result.pipeline_rank = position_in(pipeline, global_rank);
  result.data_parallel_rank = position_in(data_parallel, global_rank);
  result.context_parallel_rank = position_in(context_parallel, global_rank);
  result.replica_rank = position_in(replicas, global_rank);
  const GroupKind expert_parallel = kind_of(groups, "ep", global_rank);
  const GroupKind expert_replicas = kind_of(groups, "expert-dp", global_rank);
  const GroupKind expert_tensor_parallel = kind_of(groups, "expert-tp", global_rank);
  result.expert_parallel_rank = position_in(expert_parallel, global_rank);
  result.expert_replica_rank = position_in(expert_replicas, global_rank);
  result.expert_tensor_parallel_rank = position_in(expert_tensor_parallel, global_rank);

  // Megatron's embedding group joins the ends of each pipeline; here the ends are the ranks of the
  // first and the last virtual stage, which coincide at a V's turn (then no group is needed).
  const StagePlacement placement = stage_placement(plan.schedule);
  const int64_t first = pipeline_rank_of_stage(0, plan.pipeline_parallel_size, placement);
  const int64_t last = pipeline_rank_of_stage(plan.num_virtual_stages() - 1, plan.pipeline_parallel_size, placement);
  GroupKind embedding{"embedding", {}, -1};
  if (first != last) {
    for (const std::vector<int64_t>& line : pipeline.groups) {
      const std::vector<int64_t> ends = {line[static_cast<std::size_t>(first)], line[static_cast<std::size_t>(last)]};
      if (ends[0] == global_rank || ends[1] == global_rank)
        embedding.mine = static_cast<int64_t>(embedding.groups.size());
      embedding.groups.push_back(ends);
    }
  }
  std::vector<int64_t> everyone(static_cast<std::size_t>(plan.world_size()));
  for (std::size_t r = 0; r < everyone.size(); ++r) everyone[r] = static_cast<int64_t>(r);
  const GroupKind world{"world", {everyone}, 0};

  // Every rank asks for every kind in the same order (see CommFactory).
  result.world = make(world);
  result.tensor_parallel = make(tensor_parallel);
  result.pipeline = make(pipeline);
  result.data_parallel = make(plan.context_parallel_size > 1 ? replicas : data_parallel);
  result.model_parallel = make(model_parallel);
  result.embedding = make(embedding);
  if (plan.context_parallel_size > 1) result.context_parallel = make(context_parallel);
  result.experts_apart = plan.expert_groups_apart();
  if (result.experts_apart) {
    result.expert_parallel = make(expert_parallel);
    result.expert_data_parallel = make(expert_replicas);
  }
  // An expert tensor-parallel group of its own where it is not the tp group (none at etp 1).
  if (plan.expert_tensor_parallel() != plan.tensor_parallel_size) {
    result.expert_tensor_parallel = make(expert_tensor_parallel);
  }
  return result;
}

}  // namespace megaplan::exec
