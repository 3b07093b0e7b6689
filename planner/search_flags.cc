#include "planner/search_flags.h"

#include <algorithm>

#include "core/checked_math.h"
#include "core/error.h"
#include "core/notes.h"
#include "core/schedule/schedule_traits.h"

namespace megaplan::planner {

SearchSpace search_space_from_flags(const SearchSpaceFlags& options, const ModelSpec& model) {
  for (const int64_t ep : options.expert_parallel) validate_expert_parallel_size(model, ep);
  validate_moe_imbalance(model, options.moe_imbalance);
  SearchSpace space;
  space.expert_parallel = options.expert_parallel;
  space.moe_imbalance = options.moe_imbalance;
  space.tensor_parallel = options.tensor_parallel;
  if (!options.expert_tensor_parallel.empty()) {
    const std::string flag = "--expert-tensor-parallel-size";
    if (!model.moe.enabled()) throw SpecError(flag, "needs --num-experts");
    for (const int64_t etp : options.expert_tensor_parallel) require_positive(etp, flag);
    space.expert_tensor_parallel = options.expert_tensor_parallel;
  }
  space.pipeline_parallel = options.pipeline_parallel;
  space.context_parallel = options.context_parallel;
  space.virtual_pipeline = options.virtual_pipeline;
  space.layers_per_virtual_stage = options.layers_per_virtual_stage;
  space.micro_batch = options.micro_batch;
  for (const std::string& text : options.recompute) {
    space.recompute.push_back(parse_recompute_granularity(text, "--recompute-granularity"));
  }
  // Megatron's alias wins over --recompute-granularity, as its argument validation sets it.
  if (options.recompute_activations) space.recompute = {RecomputeGranularity::kSelective};
  for (const std::string& text : options.schedules) space.schedules.push_back(parse_schedule_kind(text, "--schedule"));
  if (options.sequence_parallel && options.no_sequence_parallel) {
    throw SpecError("--sequence-parallel", "cannot be combined with --no-sequence-parallel");
  }
  if (options.sequence_parallel) space.sequence_parallel = {true};
  if (options.no_sequence_parallel) space.sequence_parallel = {false};
  if (options.distributed_optimizer && options.no_distributed_optimizer) {
    throw SpecError("--use-distributed-optimizer", "cannot be combined with --no-distributed-optimizer");
  }
  if (options.distributed_optimizer) space.distributed_optimizer = {true};
  if (options.no_distributed_optimizer) space.distributed_optimizer = {false};
  space.allow_cross_node_tensor_parallel = options.allow_cross_node_tensor_parallel;
  space.implementation = parse_implementation(options.implementation.implementation, "--implementation");
  space.options = resolve_implementation_options(options.implementation, space.implementation, model);
  ParallelPlan check;  // the options' own rules, once, before any layout is tried
  check.implementation = space.implementation;
  check.options = space.options;
  validate_implementation_options(check);
  return space;
}

}  // namespace megaplan::planner
