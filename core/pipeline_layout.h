// Where layers live in a pipeline: each virtual stage's layers (Megatron's
// get_num_layers_to_build and get_transformer_layer_offset, uneven splits included) and the map
// from virtual stage to pipeline rank.
#pragma once

#include <cstdint>
#include <vector>

#include "core/parallel_plan.h"

namespace megaplan {

// The transformer layers of each virtual stage, in stage order. Evenly split, every stage holds
// num_layers / (pp x vpp). With plan.pipeline_split, Megatron's rules: the first (last) pipeline
// rank holds --decoder-first (-last)-pipeline-num-layers and the other ranks share the rest
// evenly; or the embedding (loss) counts as a layer, so that (num_layers + 1 [+ 1]) splits evenly
// and the first (last) virtual stage holds one layer fewer; a rank's layers split evenly over its
// virtual stages. Throws SpecError naming the flag when the layers do not split so, or a stage
// would hold no layer.
std::vector<int64_t> stage_layer_counts(const ModelSpec& model, const ParallelPlan& plan);
// The most of those on one stage, with the same checks: without a vector for an even split, as
// validate_plan asks it of every plan a search enumerates.
int64_t most_stage_layers(const ModelSpec& model, const ParallelPlan& plan);

// Loop: stage s runs on rank s % pp. V: stages 0..pp-1 go down the ranks and pp..2pp-1 come back
// up, so rank r holds stages r and 2pp-1-r (and the last stage sits on rank 0).
// REQUIRES: 0 <= stage < pp * stages per rank; V placement has exactly two stages per rank.
// Inline and division-free for the few stages per rank: the schedule IR asks this in its hot loops.
inline int64_t pipeline_rank_of_stage(int64_t stage, int64_t pipeline_parallel_size, StagePlacement placement) {
  if (stage < pipeline_parallel_size) return stage;
  if (placement == StagePlacement::kV) return 2 * pipeline_parallel_size - 1 - stage;
  if (stage >= 8 * pipeline_parallel_size) return stage % pipeline_parallel_size;
  int64_t rank = stage;
  while (rank >= pipeline_parallel_size) rank -= pipeline_parallel_size;
  return rank;
}

// The virtual stages a pipeline rank runs, in increasing stage order.
std::vector<int64_t> stages_of_pipeline_rank(int64_t pipeline_rank, const ParallelPlan& plan);

}  // namespace megaplan

namespace megaplan {

// What one virtual stage holds: its transformer layers, the embeddings on the first stage, the
// final norm, output layer and loss on the last. One stage holds everything when there is one.
struct StageLayers {
  int64_t first_layer = 0;
  int64_t num_layers = 0;
  bool has_embedding = false;
  bool has_output_layer = false;
};

// REQUIRES: validate_plan(model, plan) passed; 0 <= stage < plan.num_virtual_stages().
StageLayers stage_layers(int64_t stage, const ModelSpec& model, const ParallelPlan& plan);

}  // namespace megaplan

namespace megaplan {

// How full recomputation cuts a virtual stage's layers (Megatron's --recompute-method): uniform N
// checkpoints consecutive groups of N layers (the last may be shorter): each keeps only its input
// and is run forward again, whole, in the backward; block N checkpoints each of the stage's first N
// layers alone and keeps the rest. Without full recomputation every layer is one kept group.
struct LayerGroup {
  int64_t first_layer = 0;  // index within the stage
  int64_t num_layers = 1;
  bool recomputed = false;
};

// The groups of a virtual stage of `num_layers` layers.
std::vector<LayerGroup> recompute_groups(const ParallelPlan& plan, int64_t num_layers);

// What a layer keeps from its forward for its backward (recomputation decides): everything; all
// but the attention core's output (selective); only its input (the first layer of a group that
// full recomputation checkpoints); nothing (the group's other layers).
enum class LayerKeep { kAll, kAllButAttention, kInput, kNothing };

// One entry per layer of the stage, from its recompute_groups.
std::vector<LayerKeep> layer_keeps(const ParallelPlan& plan, const std::vector<LayerGroup>& groups);

}  // namespace megaplan
