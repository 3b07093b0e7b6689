// The cost model's composition: each action is the sum of the executor's kernels for it (core's
// kernel list) as the profile costs them; one stage and one microbatch takes F + B + OPTIM; the
// layout's collectives appear where Megatron puts them.
#include <catch2/catch.hpp>

#include "core/cluster_spec.h"
#include "core/formulas.h"
#include "core/kernel_list.h"
#include "core/model_presets.h"
#include "simulator/simulate_plan.h"
#include "simulator/stage_costs.h"

using megaplan::sim::CostSources;

namespace {

megaplan::JobSpec job(const std::string& model, const std::string& cluster, int64_t gpus, int64_t tp, int64_t pp,
                      int64_t gbs) {
  megaplan::JobSpec spec;
  spec.model = megaplan::model_preset(model);
  spec.cluster = megaplan::select_gpus(megaplan::cluster_preset(cluster), gpus);
  spec.plan.tensor_parallel_size = tp;
  spec.plan.pipeline_parallel_size = pp;
  spec.plan.data_parallel_size = gpus / (tp * pp);
  spec.plan.global_batch_size = gbs;
  megaplan::validate_job(spec);
  return spec;
}

}  // namespace

TEST_CASE("a GPT-2 layer's kernels are the executor's, each costed by the profile", "[simulator][costs]") {
  const megaplan::JobSpec spec = job("gpt2-124m", "h100-x1", 1, 1, 1, 1);
  // T = 1024 tokens, h = 768, 12 heads of 64, 4h MLP with GELU in fc1's epilogue, biases.
  const int64_t t = 1024;
  const int64_t h = 768;
  using megaplan::GemmEpilogue;
  using megaplan::GemmLayout;
  using megaplan::KernelKind;
  const std::vector<megaplan::Kernel> forward = {
      megaplan::row_kernel(KernelKind::kNormForward, t, h, true),
      megaplan::gemm_kernel(GemmLayout::kForward, GemmEpilogue::kBias, t, 3 * h, h),
      megaplan::attention_kernel(KernelKind::kAttentionForward, 1, 1024, 12, 64),
      megaplan::gemm_kernel(GemmLayout::kForward, GemmEpilogue::kBias, t, h, h),
      megaplan::row_kernel(KernelKind::kNormForward, t, h, true),
      megaplan::gemm_kernel(GemmLayout::kForward, GemmEpilogue::kBiasGelu, t, 4 * h, h),
      megaplan::gemm_kernel(GemmLayout::kForward, GemmEpilogue::kBias, t, h, 4 * h)};
  const megaplan::ExecutorKernels kernels(spec.model, spec.plan);
  CHECK(kernels.block(megaplan::KernelBlock::kLayerForward) == forward);

  const auto profile = megaplan::sim::Profile::datasheet(spec.cluster.gpu);
  const megaplan::sim::Topology topology(spec.cluster);
  CostSources sources;
  const auto costs = megaplan::sim::plan_action_costs(spec.model, spec.plan, profile, topology, sources);
  CostSources scratch;
  const auto sum = [&](const std::vector<megaplan::Kernel>& list) {
    double seconds = 0;
    for (const megaplan::Kernel& kernel : list) seconds += profile.kernel_seconds(kernel, scratch);
    return seconds;
  };
  const auto& stage = costs.stages[0];
  CHECK(stage.forward == Approx(sum(kernels.stage_kernels(0, megaplan::SchedulePart::kForward))));
  CHECK(stage.backward == Approx(sum(kernels.stage_kernels(0, megaplan::SchedulePart::kBackward))));
  CHECK(stage.backward_input == Approx(sum(kernels.stage_kernels(0, megaplan::SchedulePart::kBackwardInput))));
  CHECK(stage.backward_weight == Approx(sum(kernels.stage_kernels(0, megaplan::SchedulePart::kBackwardWeight))));
  const int64_t parameters = megaplan::total_parameters(spec.model);
  CHECK(costs.optimizer[0] == Approx(sum(megaplan::optimizer_kernels(parameters, parameters, 0, {parameters}))));
  CHECK(stage.forward_collectives == 0);  // tp 1
  // A layer's weight gradients cost what W's kernels do.
  const auto layer = megaplan::sim::transformer_layer_costs(
      spec.model, spec.plan, profile, megaplan::sim::pipeline_group_routes(spec.plan, topology)[0], scratch);
  CHECK(layer.backward_weight == Approx(sum(kernels.block(megaplan::KernelBlock::kLayerWeightGradient))));
  CHECK(sources.fallback > 0);
  CHECK(sources.table == 0);  // the datasheet profile has no tables
}

TEST_CASE("one stage and one microbatch takes the stage's F + B + OPTIM", "[simulator][costs]") {
  const megaplan::JobSpec spec = job("gpt2-124m", "h100-x1", 1, 1, 1, 1);
  const auto profile = megaplan::sim::Profile::datasheet(spec.cluster.gpu);
  const megaplan::sim::Topology topology(spec.cluster);
  CostSources sources;
  const auto costs = megaplan::sim::plan_action_costs(spec.model, spec.plan, profile, topology, sources);
  REQUIRE(costs.stages.size() == 1);
  const auto& stage = costs.stages[0];
  CHECK(stage.gradient_buckets.empty());  // no data parallelism
  const auto simulation = megaplan::sim::simulate_plan(spec, profile, false);
  CHECK(simulation.result.iteration_time_s ==
        Approx(stage.forward + stage.backward + costs.optimizer[0]));
  CHECK(simulation.result.bubble_fraction == Approx(0).margin(1e-12));
  CHECK(simulation.fits_in_memory);
}

TEST_CASE("tensor parallelism puts collectives in every layer; data parallelism reduces in buckets", "[simulator][costs]") {
  megaplan::JobSpec spec = job("gpt2-350m", "dgx-h100", 16, 8, 1, 64);
  const auto profile = megaplan::sim::Profile::datasheet(spec.cluster.gpu);
  const megaplan::sim::Topology topology(spec.cluster);
  CostSources sources;
  auto costs = megaplan::sim::plan_action_costs(spec.model, spec.plan, profile, topology, sources);
  CHECK(costs.stages[0].forward_collectives > 0);
  CHECK(costs.stages[0].backward_collectives > 0);
  // dp 2 across the two nodes: about 350M / 8 parameters per GPU in 40M-parameter buckets.
  CHECK(costs.stages[0].gradient_buckets.size() == 2);
  // Sequence parallelism trades each all-reduce for an all-gather and a reduce-scatter: the same
  // bytes on the ring, so the same collective time within latency.
  spec.plan.sequence_parallel = true;
  const auto with_sp = megaplan::sim::plan_action_costs(spec.model, spec.plan, profile, topology, sources);
  CHECK(with_sp.stages[0].forward_collectives == Approx(costs.stages[0].forward_collectives).epsilon(0.05));
}

TEST_CASE("a gradient reduction across nodes shows when the backward is short", "[simulator][costs]") {
  // gpt2-124m on 16 H100 with dp 16: the reduction crosses the network and outlasts the tiny
  // last backward; with gpt-1.3b at dp 2 inside a node it hides behind a long one.
  const auto small = megaplan::sim::simulate_plan(
      job("gpt2-124m", "dgx-h100", 16, 1, 1, 16), megaplan::sim::Profile::datasheet(megaplan::cluster_preset("dgx-h100").gpu), false);
  CHECK(small.result.ranks[0].data_parallel_comm_s > 0.2 * small.result.iteration_time_s);
  const auto large = megaplan::sim::simulate_plan(
      job("gpt-1.3b", "dgx-h100", 8, 4, 1, 64), megaplan::sim::Profile::datasheet(megaplan::cluster_preset("dgx-h100").gpu), false);
  CHECK(large.result.ranks[0].data_parallel_comm_s < 0.05 * large.result.iteration_time_s);
}

TEST_CASE("a placement that splits some tensor-parallel groups across nodes slows those stages only", "[simulator][costs]") {
  // 12 GPUs in nodes of 4, tp 3, pp 4: pipeline ranks 1 and 2 have their tp group across nodes
  // (GPUs 3-5 and 6-8), ranks 0 and 3 inside one (0-2, 9-11).
  megaplan::JobSpec spec;
  spec.model = megaplan::model_preset("gpt2-124m");  // 12 heads, 12 layers
  spec.cluster = megaplan::cluster_preset("dgx-h100");
  spec.cluster.num_nodes = 3;
  spec.cluster.gpus_per_node = 4;
  spec.plan.tensor_parallel_size = 3;
  spec.plan.pipeline_parallel_size = 4;
  spec.plan.global_batch_size = 4;
  megaplan::validate_job(spec);
  const megaplan::sim::Topology topology(spec.cluster);
  const auto routes = megaplan::sim::pipeline_group_routes(spec.plan, topology);
  REQUIRE(routes.size() == 4);
  CHECK_FALSE(routes[0].tensor.crosses_nodes);
  CHECK(routes[1].tensor.crosses_nodes);
  CHECK(routes[2].tensor.crosses_nodes);
  CHECK_FALSE(routes[3].tensor.crosses_nodes);
  CostSources sources;
  const auto costs = megaplan::sim::plan_action_costs(
      spec.model, spec.plan, megaplan::sim::Profile::datasheet(spec.cluster.gpu), topology, sources);
  CHECK(costs.stages[1].forward_collectives > 2 * costs.stages[0].forward_collectives);
  CHECK(costs.stages[2].forward_collectives == Approx(costs.stages[1].forward_collectives));
}
