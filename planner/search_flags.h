// The search space as search's flags state it (Megatron-LM's names; a value pins a dimension, a
// list restricts it), and the layouts of a problem that the implementation runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/job_options.h"
#include "planner/search_space.h"

namespace megaplan::planner {

// Lists (a pin is a list of one); empty leaves the dimension free.
struct SearchSpaceFlags {
  std::vector<int64_t> tensor_parallel, pipeline_parallel, context_parallel, virtual_pipeline, layers_per_virtual_stage,
      micro_batch;
  // --expert-model-parallel-size: for a model with experts, the sizes that divide them; a dense
  // model takes 1 only.
  std::vector<int64_t> expert_parallel;
  std::vector<int64_t> expert_tensor_parallel;  // --expert-tensor-parallel-size: the sizes searched (default 1 and tp)
  double moe_imbalance = 1.0;                   // --moe-imbalance: the load every plan is costed at
  std::vector<std::string> recompute, schedules;
  bool recompute_activations = false;  // Megatron's alias: selective recomputation pinned
  bool sequence_parallel = false, no_sequence_parallel = false;
  bool distributed_optimizer = false, no_distributed_optimizer = false;
  bool allow_cross_node_tensor_parallel = false;
  ImplementationFlags implementation;
};

// The space, its implementation's options resolved for `model` and checked once, before any layout
// is tried. Throws SpecError naming the flag.
SearchSpace search_space_from_flags(const SearchSpaceFlags& flags, const ModelSpec& model);

}  // namespace megaplan::planner
