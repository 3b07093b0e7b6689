// A plan as Megatron-LM arguments; where Megatron-LM lacks the schedule, torchtitan's name for it.
#include "planner/megatron_arguments.h"

#include "core/schedule/schedule_traits.h"

namespace megaplan::planner {

std::vector<std::string> megatron_arguments(const ModelSpec& model, const ParallelPlan& plan) {
  const auto value = [](const std::string& flag, int64_t number) { return flag + " " + std::to_string(number); };
  std::vector<std::string> arguments = {
      value("--tensor-model-parallel-size", plan.tensor_parallel_size),
      value("--pipeline-model-parallel-size", plan.pipeline_parallel_size)};
  if (plan.virtual_pipeline_parallel_size > 1) {
    arguments.push_back(value("--num-layers-per-virtual-pipeline-stage",
                              model.num_layers / plan.num_virtual_stages()));
  }
  if (plan.context_parallel_size > 1) arguments.push_back(value("--context-parallel-size", plan.context_parallel_size));
  arguments.push_back(value("--micro-batch-size", plan.micro_batch_size));
  arguments.push_back(value("--global-batch-size", plan.global_batch_size));
  if (plan.sequence_parallel) arguments.push_back("--sequence-parallel");
  if (plan.use_distributed_optimizer) arguments.push_back("--use-distributed-optimizer");
  if (overlaps_gradient_reduction(plan)) arguments.push_back("--overlap-grad-reduce");
  switch (plan.recompute_granularity) {
    case RecomputeGranularity::kNone:
      break;
    case RecomputeGranularity::kSelective:
      arguments.push_back("--recompute-granularity selective");
      break;
    case RecomputeGranularity::kFull:
      arguments.push_back("--recompute-granularity full");
      arguments.push_back("--recompute-method " + to_string(plan.recompute_method));
      arguments.push_back("--recompute-num-layers " + std::to_string(plan.recompute_num_layers));
      break;
  }
  // Megatron-LM's own schedules are chosen by the pipeline and virtual-pipeline sizes above; for the
  // others, torch.distributed.pipelining's class name, which torchtitan's setting takes.
  const ScheduleTraits& schedule = schedule_traits(plan.schedule);
  if (!schedule.megatron_native) {
    arguments.push_back("# " + std::string(schedule.spelling) + " is not a Megatron-LM schedule; in torchtitan: " +
                        "--parallelism.pipeline_parallel_schedule " + schedule.torch_schedule);
  }
  return arguments;
}

}  // namespace megaplan::planner
