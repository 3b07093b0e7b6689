// A plan as Megatron-LM arguments; where Megatron-LM lacks the schedule, torchtitan's name for it.
#include "planner/megatron_arguments.h"

#include <sstream>
#include <utility>

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
  if (overlaps_gradient_reduction(plan) && plan.options.ddp_impl == DdpImpl::kLocal) {
    arguments.push_back("--overlap-grad-reduce");
  }
  // What the simulation assumed the code does (core/implementation_options.h), where it takes effect.
  const ImplementationOptions& options = plan.options;
  const auto number = [](double x) {
    std::ostringstream text;
    text << x;
    return text.str();
  };
  arguments.push_back(options.precision == Precision::kFp16 ? "--fp16" : "--bf16");
  arguments.push_back("--transformer-impl " + to_string(options.transformer_impl));
  if (options.transformer_impl == TransformerImpl::kLocal && options.use_flash_attn) arguments.push_back("--use-flash-attn");
  arguments.push_back("--attention-dropout " + number(options.attention_dropout));
  arguments.push_back("--hidden-dropout " + number(options.hidden_dropout));
  const std::pair<bool, const char*> off[] = {
      {!fused_attention(options) && !options.masked_softmax_fusion, "--no-masked-softmax-fusion"},
      {!options.bias_gelu_fusion, "--no-bias-gelu-fusion"},
      {!options.bias_dropout_fusion, "--no-bias-dropout-fusion"},
      {!options.gradient_accumulation_fusion, "--no-gradient-accumulation-fusion"},
      {options.precision == Precision::kFp16 && options.accumulate_allreduce_grads_in_fp32,
       "--accumulate-allreduce-grads-in-fp32"},
      {overlaps_parameter_gather(plan), "--overlap-param-gather"},
      {overlaps_tensor_parallel_communication(plan), "--tp-comm-overlap"},
      {plan.pipeline_parallel_size > 1 && plan.tensor_parallel_size > 1 && !plan.sequence_parallel &&
           !options.scatter_gather_tensors_in_pipeline,
       "--no-scatter-gather-tensors-in-pipeline"},
      {options.ddp_impl == DdpImpl::kTorch, "--DDP-impl torch"}};
  for (const auto& [given, flag] : off) {
    if (given) arguments.push_back(flag);
  }
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
