#include "core/action_work.h"

#include "core/formulas.h"
#include "core/implementation_options.h"
#include "core/kernel_list.h"

namespace megaplan {

namespace {

constexpr int64_t kBf16 = 2;

double part_flops(const PlanKernels& kernels, const std::vector<double>& block_flops, int64_t stage,
                  SchedulePart part) {
  double flops = 0;
  for (const CountedBlock& counted : kernels.stage_blocks(stage, part)) {
    flops += static_cast<double>(counted.count) * block_flops[static_cast<std::size_t>(counted.block)];
  }
  return flops;
}

}  // namespace

int64_t pipeline_message_bytes(const ModelSpec& model, const ParallelPlan& plan) {
  const int64_t whole = kBf16 * tokens_per_microbatch(model, plan) * model.hidden_size;
  return whole / (plan.sequence_parallel || scatters_pipeline_transfers(plan) ? plan.tensor_parallel_size : 1);
}

std::vector<StageWork> stage_work(const ModelSpec& model, const ParallelPlan& plan) {
  const PlanKernels kernels(model, plan);
  // Under context parallelism the lists hold the ring's blocks: one rank's share of attention.
  std::vector<double> block_flops(kNumKernelBlocks, 0);
  for (std::size_t b = 0; b < kNumKernelBlocks; ++b) {
    for (const Kernel& kernel : kernels.block(static_cast<KernelBlock>(b))) block_flops[b] += kernel_flops(kernel);
  }
  const int64_t message = plan.pipeline_parallel_size > 1 ? pipeline_message_bytes(model, plan) : 0;
  const bool replicated = plan.gradient_group_size() > 1;
  const int64_t stages = plan.num_virtual_stages();
  std::vector<StageWork> work(static_cast<std::size_t>(stages));
  for (int64_t stage = 0; stage < stages; ++stage) {
    StageWork& entry = work[static_cast<std::size_t>(stage)];
    entry.forward_flops = part_flops(kernels, block_flops, stage, SchedulePart::kForward);
    entry.backward_flops = part_flops(kernels, block_flops, stage, SchedulePart::kBackward);
    entry.backward_input_flops = part_flops(kernels, block_flops, stage, SchedulePart::kBackwardInput);
    entry.backward_weight_flops = part_flops(kernels, block_flops, stage, SchedulePart::kBackwardWeight);
    entry.message_bytes = message;
    entry.gradient_bytes =
        replicated ? main_gradient_bytes(plan.options) * stage_parameters(model, plan, stage).parameters_per_gpu : 0;
  }
  return work;
}

ActionWork action_work(const std::vector<StageWork>& stages, const Action& action) {
  if (action.kind == ActionKind::kOptimizer) return {};
  const StageWork& stage = stages.at(static_cast<std::size_t>(action.stage));
  switch (action.kind) {
    case ActionKind::kForward: return {stage.forward_flops, 0};
    case ActionKind::kBackward: return {stage.backward_flops, 0};
    case ActionKind::kBackwardInput: return {stage.backward_input_flops, 0};
    case ActionKind::kBackwardWeight: return {stage.backward_weight_flops, 0};
    case ActionKind::kOverlapForwardBackward: {
      const StageWork& backward = stages.at(static_cast<std::size_t>(action.backward_stage));
      const double flops =
          action.backward_kind == ActionKind::kBackwardInput ? backward.backward_input_flops : backward.backward_flops;
      return {stage.forward_flops + flops, 0};
    }
    case ActionKind::kSendForward:
    case ActionKind::kRecvForward:
    case ActionKind::kSendBackward:
    case ActionKind::kRecvBackward: return {0, stage.message_bytes};
    case ActionKind::kReduceGrad: return {0, stage.gradient_bytes};
    case ActionKind::kOptimizer: break;
  }
  return {};
}

}  // namespace megaplan
