#include "executor/train/parallel_groups.h"

#include <algorithm>
#include <stdexcept>

#include "core/pipeline_layout.h"
#include "core/rank_groups.h"

namespace megaplan::exec {

namespace {

// The group of `kind` holding `rank`, and the rank's position in it.
std::pair<const std::vector<int64_t>*, int64_t> group_of(const RankGroups& groups, std::string_view kind, int64_t rank) {
  for (const std::vector<int64_t>& group : groups.at(kind)) {
    const auto found = std::find(group.begin(), group.end(), rank);
    if (found != group.end()) return {&group, found - group.begin()};
  }
  throw std::logic_error("rank " + std::to_string(rank) + " is in no " + std::string(kind) + " group");
}

}  // namespace

ParallelGroups make_parallel_groups(const ParallelPlan& plan, int64_t global_rank, const CommFactory& make) {
  const RankGroups groups = megatron_rank_groups(plan.world_size(), plan.tensor_parallel_size,
                                                 plan.pipeline_parallel_size, plan.context_parallel_size);
  ParallelGroups result;
  result.global_rank = global_rank;
  const auto [pipeline, pipeline_rank] = group_of(groups, "pp", global_rank);
  const auto [data_parallel, data_parallel_rank] = group_of(groups, "dp", global_rank);
  const auto [model_parallel, model_parallel_rank] = group_of(groups, "tp-pp", global_rank);
  const auto tensor_parallel = group_of(groups, "tp", global_rank);
  (void)model_parallel_rank;
  result.pipeline_rank = pipeline_rank;
  result.data_parallel_rank = data_parallel_rank;
  result.tensor_parallel_rank = tensor_parallel.second;
  // Every rank builds its groups in the same order (world, pp, dp, tp-pp, embedding), which the
  // NCCL implementation needs: creating a communicator is a collective over the world.
  if (plan.world_size() > 1) {
    std::vector<int64_t> everyone(static_cast<std::size_t>(plan.world_size()));
    for (std::size_t r = 0; r < everyone.size(); ++r) everyone[r] = static_cast<int64_t>(r);
    result.world = make(everyone, "world");
  }
  if (pipeline->size() > 1) result.pipeline = make(*pipeline, "pp");
  if (data_parallel->size() > 1) result.data_parallel = make(*data_parallel, "dp");
  if (model_parallel->size() > 1) result.model_parallel = make(*model_parallel, "tp-pp");

  // Megatron's embedding group joins the ends of each pipeline; here the ends are the ranks of the
  // first and the last virtual stage, which coincide at a V's turn (then no group is needed).
  const StagePlacement placement = stage_placement(plan.schedule);
  const int64_t first = pipeline_rank_of_stage(0, plan.pipeline_parallel_size, placement);
  const int64_t last = pipeline_rank_of_stage(plan.num_virtual_stages() - 1, plan.pipeline_parallel_size, placement);
  if (first != last && (pipeline_rank == first || pipeline_rank == last)) {
    const std::vector<int64_t> ends = {(*pipeline)[static_cast<std::size_t>(first)],
                                       (*pipeline)[static_cast<std::size_t>(last)]};
    result.embedding = make(ends, "embedding");
  }
  return result;
}

}  // namespace megaplan::exec
