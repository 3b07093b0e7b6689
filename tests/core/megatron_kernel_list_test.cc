// Megatron-LM's kernel lists against hand counts: the FLOPs of Narayanan et al.'s formula in the
// GEMMs, the unfused attention's batched GEMMs and s x s passes, what each fusion flag removes, and
// the optimizer's kernels by precision.
#include <algorithm>
#include <functional>

#include <catch2/catch.hpp>

#include "core/formulas.h"
#include "core/kernel_list.h"
#include "core/model_presets.h"

namespace {

using megaplan::DType;
using megaplan::Kernel;
using megaplan::KernelBlock;
using megaplan::KernelKind;

megaplan::ParallelPlan plan_of(megaplan::Implementation implementation, int64_t tp) {
  megaplan::ParallelPlan plan;
  plan.tensor_parallel_size = tp;
  plan.micro_batch_size = 2;
  plan.global_batch_size = 2;
  plan.implementation = implementation;
  plan.options = megaplan::default_implementation_options(implementation);
  return plan;
}

double gemm_flops(const std::vector<Kernel>& kernels) {
  double flops = 0;
  for (const Kernel& kernel : kernels) {
    if (kernel.kind != KernelKind::kGemm) continue;
    flops += 2.0 * static_cast<double>(std::max<int64_t>(1, kernel.batch)) * static_cast<double>(kernel.m) *
             static_cast<double>(kernel.n) * static_cast<double>(kernel.k);
  }
  return flops;
}

int64_t count_if(const std::vector<Kernel>& kernels, const std::function<bool(const Kernel&)>& predicate) {
  return std::count_if(kernels.begin(), kernels.end(), predicate);
}

bool batched(const Kernel& kernel) { return kernel.kind == KernelKind::kGemm && kernel.batch > 1; }

}  // namespace

TEST_CASE("megatron-local's layer: 24bsh^2 + 4bs^2h forward FLOPs per tp rank, twice that backward", "[kernels]") {
  const megaplan::ModelSpec model = megaplan::model_preset("gpt-1.3b");  // s 2048, h 2048, 16 heads
  for (const int64_t tp : {1, 2}) {
    const megaplan::ParallelPlan plan = plan_of(megaplan::Implementation::kMegatronLocal, tp);
    megaplan::validate_plan(model, plan);
    const megaplan::PlanKernels kernels(model, plan);
    const double b = 2, s = 2048, h = 2048;
    const double forward = (24 * b * s * h * h + 4 * b * s * s * h) / static_cast<double>(tp);
    CHECK(gemm_flops(kernels.block(KernelBlock::kLayerForward)) == Approx(forward).epsilon(1e-12));
    CHECK(gemm_flops(kernels.block(KernelBlock::kLayerBackward)) == Approx(2 * forward).epsilon(1e-12));
    // B = I + W for the GEMMs.
    CHECK(gemm_flops(kernels.block(KernelBlock::kLayerBackwardInput)) +
              gemm_flops(kernels.block(KernelBlock::kLayerWeightGradient)) ==
          Approx(2 * forward).epsilon(1e-12));
    // Unfused attention: Q K^T and probabilities x V, one product per sequence and head of this rank.
    const std::vector<Kernel>& layer = kernels.block(KernelBlock::kLayerForward);
    REQUIRE(count_if(layer, batched) == 2);
    for (const Kernel& kernel : layer) {
      if (batched(kernel)) CHECK(kernel.batch == 2 * 16 / tp);
      CHECK(kernel.kind != KernelKind::kAttentionForward);
      if (kernel.kind == KernelKind::kGemm) CHECK(kernel.precision == DType::kFloat16);
    }
    CHECK(count_if(kernels.block(KernelBlock::kLayerBackward), batched) == 4);
    // --no-masked-softmax-fusion: the masked fill and the softmax apart, then the dropout, each a
    // pass over the b * heads/tp * s^2 scores.
    const int64_t scores = 2 * 16 / tp * 2048 * 2048;
    CHECK(count_if(layer, [&](const Kernel& kernel) { return kernel.rows == scores; }) == 3);
    // Selective recomputation reruns exactly the core: its two GEMMs and three passes, and the copy.
    CHECK(count_if(kernels.block(KernelBlock::kAttentionRecompute), batched) == 2);
    CHECK(kernels.block(KernelBlock::kAttentionRecompute).size() == 6);
  }
}

TEST_CASE("megatron-core's layer: one fused attention kernel, bias-dropout-add with its mask", "[kernels]") {
  const megaplan::ModelSpec model = megaplan::model_preset("gpt-1.3b");
  const megaplan::ParallelPlan plan = plan_of(megaplan::Implementation::kMegatronCore, 1);
  const megaplan::PlanKernels kernels(model, plan);
  const std::vector<Kernel>& layer = kernels.block(KernelBlock::kLayerForward);
  CHECK(count_if(layer, batched) == 0);
  CHECK(count_if(layer, [](const Kernel& kernel) { return kernel.kind == KernelKind::kAttentionForward; }) == 1);
  const double b = 2, s = 2048, h = 2048;
  CHECK(gemm_flops(layer) == Approx(24 * b * s * h * h).epsilon(1e-12));
  // Two bias-dropout-adds: x and the residual in, the sum and a one-byte mask out.
  const int64_t tokens = 2 * 2048;
  CHECK(count_if(layer, [&](const Kernel& kernel) {
          return kernel.kind == KernelKind::kElementwise && kernel.rows == tokens * 2048 && kernel.cols == 3 * 2 + 1;
        }) == 2);
  // Gradient-accumulation fusion: no accumulation kernels beside the weight GEMMs.
  const std::vector<Kernel>& weights = kernels.block(KernelBlock::kLayerWeightGradient);
  CHECK(weights.size() == 4);
  // Megatron's stage boundaries launch nothing.
  CHECK(kernels.block(KernelBlock::kStageOutput).empty());
  CHECK(kernels.block(KernelBlock::kOutputGradientCopy).empty());
}

TEST_CASE("each Megatron flag changes the kernels it names", "[kernels]") {
  const megaplan::ModelSpec model = megaplan::model_preset("gpt-1.3b");
  const megaplan::ParallelPlan base = plan_of(megaplan::Implementation::kMegatronLocal, 1);
  const auto layer = [&](const megaplan::ParallelPlan& plan, KernelBlock block) {
    return megaplan::PlanKernels(model, plan).block(block);
  };
  const std::size_t forward = layer(base, KernelBlock::kLayerForward).size();
  const std::size_t weights = layer(base, KernelBlock::kLayerWeightGradient).size();
  CHECK(weights == 8);  // each weight GEMM and its accumulation into the main gradient
  const int64_t h = 2048, f = 8192;
  bool accumulates_fc1 = false;
  for (const Kernel& kernel : layer(base, KernelBlock::kLayerWeightGradient)) {
    // fp16 main gradient read and written, the fp16 gradient read.
    accumulates_fc1 = accumulates_fc1 || (kernel.rows == f * h && kernel.cols == 2 + 2 + 2);
  }
  CHECK(accumulates_fc1);

  megaplan::ParallelPlan plan = base;
  plan.options.masked_softmax_fusion = true;
  CHECK(layer(plan, KernelBlock::kLayerForward).size() == forward - 1);
  plan = base;
  plan.options.attention_dropout = 0;
  CHECK(layer(plan, KernelBlock::kLayerForward).size() == forward - 1);
  plan = base;
  plan.options.bias_dropout_fusion = false;  // bias add, dropout and residual add apart, twice
  CHECK(layer(plan, KernelBlock::kLayerForward).size() == forward + 4);
  plan = base;
  plan.options.bias_gelu_fusion = false;  // fc1 adds its bias; GELU alone: as many kernels
  CHECK(layer(plan, KernelBlock::kLayerForward).size() == forward);
  plan = base;
  plan.options.gradient_accumulation_fusion = true;
  CHECK(layer(plan, KernelBlock::kLayerWeightGradient).size() == 4);
  plan = base;
  plan.options.use_flash_attn = true;
  const std::vector<Kernel> flash = layer(plan, KernelBlock::kLayerForward);
  CHECK(count_if(flash, batched) == 0);
  CHECK(count_if(flash, [](const Kernel& kernel) { return kernel.kind == KernelKind::kAttentionForward; }) == 1);
}

TEST_CASE("Megatron's optimizer step by precision and sharding", "[kernels]") {
  megaplan::ParallelPlan plan = plan_of(megaplan::Implementation::kMegatronLocal, 1);
  const int64_t parameters = 1000;
  // fp16 gradients: copied to fp32, unscaled and checked, norm, Adam, master-to-model copy, zeroed.
  std::vector<Kernel> kernels = megaplan::optimizer_step_kernels(plan, parameters);
  REQUIRE(kernels.size() == 6);
  CHECK(kernels[0].cols == 2 + 4);
  CHECK(kernels[1].cols == 8);
  CHECK(kernels[2].kind == KernelKind::kGradientNorm);
  CHECK(kernels[3].kind == KernelKind::kAdamw);
  CHECK(kernels[4].kind == KernelKind::kRefreshCompute);
  CHECK(kernels[5].rows * kernels[5].cols == 2 * parameters);
  // bf16: fp32 main gradients are the master weights' gradients as they are; no loss scale.
  plan.options.precision = DType::kBFloat16;
  kernels = megaplan::optimizer_step_kernels(plan, parameters);
  REQUIRE(kernels.size() == 4);
  CHECK(kernels.back().rows * kernels.back().cols == 4 * parameters);
  // The distributed optimizer steps its 1/dp shard and zeroes the whole buffer.
  plan.data_parallel_size = 4;
  plan.use_distributed_optimizer = true;
  kernels = megaplan::optimizer_step_kernels(plan, parameters);
  CHECK(kernels[1].rows == parameters / 4);
  CHECK(kernels.back().rows == parameters);
  // megaplan's executor: AdamW writes the compute copy itself; no master-to-model pass.
  plan.implementation = megaplan::Implementation::kMegaplan;
  plan.options = megaplan::default_implementation_options(megaplan::Implementation::kMegaplan);
  plan.data_parallel_size = 1;
  plan.use_distributed_optimizer = false;
  CHECK(megaplan::optimizer_step_kernels(plan, parameters) ==
        megaplan::optimizer_kernels(parameters, parameters, 0, {parameters}));
}
