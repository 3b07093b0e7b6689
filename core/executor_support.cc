#include "core/executor_support.h"

#include <string>

#include "core/notes.h"

namespace megaplan {

namespace {

SpecError missing(const std::string& flag, const std::string& what) {
  return {flag, what + " is not in the executor yet"};
}

}  // namespace

std::optional<SpecError> executor_model_refusal(const ModelSpec& model) {
  if (model.moe.enabled()) return experts_not_built();
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

void note_executor_refusals(const ModelSpec& model, const ParallelPlan& plan) {
  if (plan.implementation != Implementation::kMegaplan) return;
  for (const std::optional<SpecError>& refusal : {executor_model_refusal(model), executor_plan_refusal(plan)}) {
    if (refusal) note("megaplan train cannot run this plan yet: " + std::string(refusal->what()));
  }
}

}  // namespace megaplan
