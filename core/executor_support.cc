#include "core/executor_support.h"

#include <string>

#include "core/implementation_options.h"
#include "core/notes.h"

namespace megaplan {

namespace {

SpecError missing(const std::string& flag, const std::string& what) {
  return {flag, what + " is not in the executor yet"};
}

}  // namespace

std::optional<SpecError> executor_model_refusal(const ModelSpec& model) {
  if (model.moe.enabled()) {
    // The experts are SwiGLU MLPs without biases, as Mixtral's and Qwen's (executor/model/moe_mlp.h).
    if (!model.swiglu) return missing("--swiglu", "mixture of experts with GELU experts");
    if (model.add_bias_linear) return missing("--disable-bias-linear", "mixture of experts with linear biases");
  }
  // GELU rides on fc1's bias epilogue (core/kernel_list.h lists no GELU of its own).
  if (!model.swiglu && !model.add_bias_linear) return missing("--disable-bias-linear", "GELU without biases");
  if (model.normalization == Normalization::kLayerNorm && model.norm_epsilon != 1e-5) {
    return missing("--norm-epsilon", "LayerNorm with an epsilon other than 1e-5");
  }
  return std::nullopt;
}

std::optional<SpecError> executor_plan_refusal(const ParallelPlan& plan) {
  if (plan.implementation != Implementation::kMegaplan) {
    return SpecError("--implementation", "must be megaplan to train: " + to_string(plan.implementation) +
                                             " is Megatron-LM's code, for simulate and search");
  }
  return std::nullopt;
}

std::optional<SpecError> executor_moe_refusal(const ModelSpec& model, const ParallelPlan& plan) {
  if (!model.moe.enabled()) return std::nullopt;
  if (plan.tensor_parallel_size > 1) {
    // Each tp rank routes its own rows of the stream (executor/model/moe_mlp.h).
    if (!plan.sequence_parallel) {
      return missing("--sequence-parallel", "mixture of experts under tensor parallelism without sequence parallelism");
    }
    // The stream's rows are the microbatch's sequences one after another: with tp dividing the
    // micro-batch size each rank's rows are whole sequences, each its own loss.
    if (model.moe.load_balancing == LoadBalancing::kSeqAuxLoss && model.moe.aux_loss_coeff > 0 &&
        plan.micro_batch_size % plan.tensor_parallel_size != 0) {
      return missing("--moe-router-load-balancing-type",
                     "seq_aux_loss with a sequence's rows split over the tp group (a --micro-batch-size "
                     "tp does not divide)");
    }
    if (overlaps_tensor_parallel_communication(plan)) {
      return missing("--tp-comm-overlap", "mixture of experts with tensor-parallel communication overlap");
    }
  }
  // Each cp rank routes its own tokens; a sequence's, split over the group, would need its counts summed.
  if (plan.context_parallel_size > 1 && model.moe.load_balancing == LoadBalancing::kSeqAuxLoss &&
      model.moe.aux_loss_coeff > 0) {
    return missing("--moe-router-load-balancing-type", "seq_aux_loss under context parallelism");
  }
  if (model.moe.token_dispatcher != TokenDispatcher::kAllToAll && plan.expert_model_parallel_size > 1) {
    return missing("--moe-token-dispatcher-type",
                   "the " + to_string(model.moe.token_dispatcher) + " token dispatcher (it runs alltoall)");
  }
  return std::nullopt;
}

void note_executor_refusals(const ModelSpec& model, const ParallelPlan& plan) {
  if (plan.implementation != Implementation::kMegaplan) return;
  for (const std::optional<SpecError>& refusal :
       {executor_model_refusal(model), executor_plan_refusal(plan), executor_moe_refusal(model, plan)}) {
    if (refusal) note("megaplan train cannot run this plan yet: " + std::string(refusal->what()));
  }
}

}  // namespace megaplan
