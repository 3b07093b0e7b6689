// The cost model's composition: each action is the sum of the executor's kernels for it (core's
// kernel list) as the profile costs them; one stage and one microbatch takes F + B + OPTIM; the
// layout's collectives appear where Megatron puts them.
#include <algorithm>

#include <catch2/catch.hpp>

#include "core/cluster_spec.h"
#include "core/formulas.h"
#include "core/implementation_options.h"
#include "core/kernel_list.h"
#include "core/model_presets.h"
#include "simulator/simulate_plan.h"
#include "simulator/stage_costs.h"
#include "tests/simulator/round_profile.h"

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

// Mixtral-8x7B at seq 4096 with sequence parallelism on `gpus` H100s, and what costing its MoE
// layer's collectives reads: the profile, the topology and pipeline rank 0's routes.
struct MixtralCosting {
  MixtralCosting(int64_t gpus, int64_t tp, int64_t ep, int64_t etp) : spec(mixtral(gpus, tp, ep, etp)) {}
  static megaplan::JobSpec mixtral(int64_t gpus, int64_t tp, int64_t ep, int64_t etp) {
    megaplan::JobSpec spec = job("mixtral-8x7b", "dgx-h100", gpus, tp, 1, 64);
    spec.model.seq_length = 4096;
    spec.plan.sequence_parallel = true;
    spec.plan.expert_model_parallel_size = ep;
    spec.plan.expert_tensor_parallel_size = etp;
    megaplan::validate_job(spec);
    return spec;
  }
  // A collective of `bytes` over `members` GPUs on `route` (NVLink), as the profile's tables give it.
  double cost(const megaplan::sim::Route& route, int64_t members, megaplan::CollectiveOp op, int64_t bytes) {
    return profile.collective_seconds(op, members, bytes, megaplan::sim::LinkKind::kNvlink,
                                      {route.bandwidth_bytes_per_s, route.latency_s}, sources);
  }
  megaplan::JobSpec spec;
  const megaplan::sim::Profile profile = megaplan::sim::Profile::datasheet(spec.cluster.gpu);
  const megaplan::sim::Topology topology{spec.cluster};
  CostSources sources;
  const megaplan::PlanKernels kernels{spec.model, spec.plan};
  const megaplan::sim::GroupRoutes routes = megaplan::sim::pipeline_group_routes(spec.plan, topology)[0];
};

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
  const megaplan::PlanKernels kernels(spec.model, spec.plan);
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
  CHECK(simulation.result.iteration_time_s == Approx(stage.forward + stage.backward + costs.optimizer[0]));
  CHECK(simulation.result.bubble_fraction == Approx(0).margin(1e-12));
  CHECK(simulation.fits_in_memory);
}

TEST_CASE("tensor parallelism puts collectives in every layer; data parallelism reduces in buckets",
          "[simulator][costs]") {
  megaplan::JobSpec spec = job("gpt2-350m", "dgx-h100", 16, 8, 1, 64);
  const auto profile = megaplan::sim::Profile::datasheet(spec.cluster.gpu);
  const megaplan::sim::Topology topology(spec.cluster);
  CostSources sources;
  auto costs = megaplan::sim::plan_action_costs(spec.model, spec.plan, profile, topology, sources);
  CHECK(costs.stages[0].forward_collectives > 0);
  CHECK(costs.stages[0].backward_collectives > 0);
  // dp 2 across the two nodes: about 350M / 8 parameters per GPU, in one 40M-parameter bucket
  // and the word embedding's own.
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
  const auto small =
      megaplan::sim::simulate_plan(job("gpt2-124m", "dgx-h100", 16, 1, 1, 16),
                                   megaplan::sim::Profile::datasheet(megaplan::cluster_preset("dgx-h100").gpu), false);
  CHECK(small.result.ranks[0].data_parallel_comm_s > 0.2 * small.result.iteration_time_s);
  const auto large =
      megaplan::sim::simulate_plan(job("gpt-1.3b", "dgx-h100", 8, 4, 1, 64),
                                   megaplan::sim::Profile::datasheet(megaplan::cluster_preset("dgx-h100").gpu), false);
  CHECK(large.result.ranks[0].data_parallel_comm_s < 0.05 * large.result.iteration_time_s);
}

TEST_CASE("a placement that splits some tensor-parallel groups across nodes slows those stages only",
          "[simulator][costs]") {
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

namespace {

megaplan::JobSpec with_implementation(megaplan::JobSpec spec, megaplan::Implementation implementation) {
  spec.plan.implementation = implementation;
  spec.plan.options = megaplan::default_implementation_options(implementation);
  megaplan::validate_job(spec);
  return spec;
}

}  // namespace

TEST_CASE("context parallelism's ring is costed step by step, each exchange beside its step's blocks",
          "[simulator][costs]") {
  for (const megaplan::Implementation implementation :
       {megaplan::Implementation::kMegaplan, megaplan::Implementation::kMegatronCore}) {
    for (const int64_t cp : {2, 4}) {
      megaplan::JobSpec spec = job("gpt-1.3b", "dgx-h100", 16, 1, 1, 16);
      spec.plan.context_parallel_size = cp;
      spec.plan.data_parallel_size = 16 / cp;
      spec.plan = with_implementation(spec, implementation).plan;
      megaplan::validate_job(spec);
      INFO(megaplan::to_string(implementation) << ", cp " << cp);
      const auto profile = megaplan::sim::Profile::datasheet(spec.cluster.gpu);
      const megaplan::sim::Topology topology(spec.cluster);
      const auto routes = megaplan::sim::pipeline_group_routes(spec.plan, topology)[0];
      CostSources sources;
      const megaplan::PlanKernels kernels(spec.model, spec.plan);
      const megaplan::RingAttentionPasses& ring = kernels.ring();
      REQUIRE(ring.forward.steps.size() == static_cast<std::size_t>(cp));
      // One rank's share of the work: the blocks' FLOPs are the whole causal attention's over cp.
      double block_flops = 0;
      for (const megaplan::Kernel& kernel : ring.forward.kernels()) block_flops += megaplan::kernel_flops(kernel);
      const megaplan::LayerDims dims = megaplan::layer_dims(spec.model, spec.plan);
      CHECK(block_flops == Approx(megaplan::attention_forward_flops(dims.heads * spec.plan.micro_batch_size,
                                                                    spec.model.seq_length, dims.head_dim, true) /
                                  static_cast<double>(cp)));
      // By hand, on the datasheet profile (nothing measured of what the two cost each other): each
      // step's exchange of the rank's keys and values shows what its blocks do not cover.
      const auto seconds = [&](const std::vector<megaplan::Kernel>& list) {
        double total = 0;
        for (const megaplan::Kernel& kernel : list) total += profile.kernel_seconds(kernel, sources);
        return total;
      };
      const int64_t key_values = 2 * 2 * spec.model.seq_length / cp * spec.model.kv_projection_size();
      const double exchange =
          profile.p2p_seconds(key_values, megaplan::sim::LinkKind::kNvlink,
                              {routes.context.bandwidth_bytes_per_s, routes.context.latency_s}, sources);
      double forward = 0, backward = exchange;  // the backward's last sums go home after the ring
      for (int64_t step = 0; step < cp; ++step) {
        const auto& f = ring.forward.steps[static_cast<std::size_t>(step)];
        const auto& b = ring.backward.steps[static_cast<std::size_t>(step)];
        if (step + 1 < cp) forward += std::max(0.0, exchange - seconds(f.kernels));
        const double beside = (step + 1 < cp ? 1 : 0) + (step > 0 ? 1 : 0);
        CHECK(b.exchanged_bytes == static_cast<int64_t>(beside) * key_values);
        backward += std::max(
            0.0, profile.p2p_seconds(b.exchanged_bytes, megaplan::sim::LinkKind::kNvlink,
                                     {routes.context.bandwidth_bytes_per_s, routes.context.latency_s}, sources) -
                     seconds(b.kernels));
      }
      const auto layer = megaplan::sim::transformer_layer_costs(spec.model, spec.plan, profile, routes, sources);
      CHECK(layer.forward_collectives == Approx(forward));
      CHECK(layer.backward_collectives == Approx(backward));
      CHECK(layer.forward == Approx(std::min(seconds(kernels.block(megaplan::KernelBlock::kLayerForwardFirst)),
                                             seconds(kernels.block(megaplan::KernelBlock::kLayerForward))) +
                                    forward));
      CHECK(layer.backward == Approx(seconds(kernels.block(megaplan::KernelBlock::kLayerBackward)) + backward));
      // Selective recomputation runs the forward ring again before each layer's backward.
      spec.plan.recompute_granularity = megaplan::RecomputeGranularity::kSelective;
      const auto selective = megaplan::sim::transformer_layer_costs(spec.model, spec.plan, profile, routes, sources);
      CHECK(selective.backward_collectives == Approx(backward + forward));
    }
  }
}

TEST_CASE("--tp-comm-overlap exposes only what each collective's GEMM does not cover", "[simulator][costs]") {
  megaplan::JobSpec spec =
      with_implementation(job("gpt-1.3b", "dgx-h100", 8, 8, 1, 8), megaplan::Implementation::kMegatronCore);
  spec.plan.sequence_parallel = true;
  const auto profile = megaplan::sim::Profile::datasheet(spec.cluster.gpu);
  const megaplan::sim::Topology topology(spec.cluster);
  const auto route = megaplan::sim::pipeline_group_routes(spec.plan, topology)[0];
  CostSources sources;
  const auto overlapped = megaplan::sim::transformer_layer_costs(spec.model, spec.plan, profile, route, sources);
  spec.plan.options.tp_comm_overlap = false;
  const auto exposed = megaplan::sim::transformer_layer_costs(spec.model, spec.plan, profile, route, sources);
  // By hand: all-gather, reduce-scatter, all-gather, reduce-scatter of the layer's activation beside
  // the QKV, projection, fc1 and fc2 forward GEMMs.
  const int64_t tokens = 2048, h = 2048, t = 8;
  const int64_t bytes = 2 * tokens * h;
  const double gather =
      profile.collective_seconds(megaplan::CollectiveOp::kAllGather, t, bytes, megaplan::sim::LinkKind::kNvlink,
                                 {route.tensor.bandwidth_bytes_per_s, route.tensor.latency_s}, sources);
  const double scatter =
      profile.collective_seconds(megaplan::CollectiveOp::kReduceScatter, t, bytes, megaplan::sim::LinkKind::kNvlink,
                                 {route.tensor.bandwidth_bytes_per_s, route.tensor.latency_s}, sources);
  CHECK(exposed.forward_collectives == Approx(2 * (gather + scatter)));
  using megaplan::GemmEpilogue;
  using megaplan::GemmLayout;
  const auto gemm = [&](GemmEpilogue epilogue, int64_t n, int64_t k) {
    return profile.kernel_seconds(megaplan::gemm_kernel(GemmLayout::kForward, epilogue, tokens, n, k), sources);
  };
  const double expected = std::max(0.0, gather - gemm(GemmEpilogue::kBias, 3 * h / t, h)) +
                          std::max(0.0, scatter - gemm(GemmEpilogue::kNone, h, h / t)) +
                          std::max(0.0, gather - gemm(GemmEpilogue::kNone, 4 * h / t, h)) +
                          std::max(0.0, scatter - gemm(GemmEpilogue::kNone, h, 4 * h / t));
  CHECK(overlapped.forward_collectives == Approx(expected));
  CHECK(overlapped.forward_collectives < exposed.forward_collectives);
  CHECK(overlapped.forward == Approx(exposed.forward - exposed.forward_collectives + expected));
}

TEST_CASE("--tp-comm-overlap also costs the GEMMs what the profile measured compute loses beside a collective",
          "[simulator][costs]") {
  megaplan::JobSpec spec =
      with_implementation(job("gpt-1.3b", "dgx-h100", 8, 8, 1, 8), megaplan::Implementation::kMegatronCore);
  spec.plan.sequence_parallel = true;
  const megaplan::sim::Topology topology(spec.cluster);
  const auto route = megaplan::sim::pipeline_group_routes(spec.plan, topology)[0];
  nlohmann::json json = megaplan::test::round_profile(spec.cluster.gpu.name, 3e12);
  const auto profile = megaplan::sim::Profile::from_json(json, "round");
  // Slowdowns large enough that the GEMMs' loss, not the uncovered rest, sets some of the four.
  json["overlap"] = {{{"op", "all_gather"}, {"group_size", 8}, {"link", "nvlink"}, {"compute_slowdown", 3.0}},
                     {{"op", "reduce_scatter"}, {"group_size", 8}, {"link", "nvlink"}, {"compute_slowdown", 1.0}}};
  const auto slowed_profile = megaplan::sim::Profile::from_json(json, "round");
  CostSources sources;
  const auto free = megaplan::sim::transformer_layer_costs(spec.model, spec.plan, profile, route, sources);
  const auto slowed = megaplan::sim::transformer_layer_costs(spec.model, spec.plan, slowed_profile, route, sources);
  // Per collective: max(collective - GEMM, collective x s / (1 + s)), summed over the forward's four.
  const int64_t tokens = 2048, h = 2048, t = 8;
  const int64_t bytes = 2 * tokens * h;
  const megaplan::sim::LinkParams link{route.tensor.bandwidth_bytes_per_s, route.tensor.latency_s};
  const auto collective = [&](megaplan::CollectiveOp op) {
    return profile.collective_seconds(op, t, bytes, megaplan::sim::LinkKind::kNvlink, link, sources);
  };
  const double gather = collective(megaplan::CollectiveOp::kAllGather);
  const double scatter = collective(megaplan::CollectiveOp::kReduceScatter);
  using megaplan::GemmEpilogue;
  using megaplan::GemmLayout;
  const auto gemm = [&](GemmEpilogue epilogue, int64_t n, int64_t k) {
    return profile.kernel_seconds(megaplan::gemm_kernel(GemmLayout::kForward, epilogue, tokens, n, k), sources);
  };
  const auto beside = [](double c, double g, double s) { return std::max(c - g, c * s / (1 + s)); };
  const double expected = beside(gather, gemm(GemmEpilogue::kBias, 3 * h / t, h), 3.0) +
                          beside(scatter, gemm(GemmEpilogue::kNone, h, h / t), 1.0) +
                          beside(gather, gemm(GemmEpilogue::kNone, 4 * h / t, h), 3.0) +
                          beside(scatter, gemm(GemmEpilogue::kNone, h, 4 * h / t), 1.0);
  CHECK(slowed.forward_collectives == Approx(expected));
  CHECK(slowed.forward_collectives > free.forward_collectives);
  CHECK(slowed.forward - slowed.forward_collectives == Approx(free.forward - free.forward_collectives));
}

TEST_CASE("Megatron's scatter-gather sends 1/tp between stages and gathers it on arrival", "[simulator][costs]") {
  const megaplan::JobSpec local =
      with_implementation(job("gpt-1.3b", "dgx-h100", 8, 4, 2, 8), megaplan::Implementation::kMegatronLocal);
  megaplan::JobSpec whole = local;
  whole.plan.options.scatter_gather_tensors_in_pipeline = false;
  const auto profile = megaplan::sim::Profile::datasheet(local.cluster.gpu);
  const megaplan::sim::Topology topology(local.cluster);
  CostSources sources;
  const auto scattered = megaplan::sim::plan_action_costs(local.model, local.plan, profile, topology, sources);
  const auto sent_whole = megaplan::sim::plan_action_costs(whole.model, whole.plan, profile, topology, sources);
  const megaplan::sim::Route route = topology.route(0, 4);
  const int64_t bytes = 2 * 2048 * 2048;
  const auto p2p = [&](int64_t size) {
    return profile.p2p_seconds(size, megaplan::sim::LinkKind::kNvlink, {route.bandwidth_bytes_per_s, route.latency_s},
                               sources);
  };
  CHECK(sent_whole.stages[0].send_forward == Approx(p2p(bytes)));
  CHECK(scattered.stages[0].send_forward == Approx(p2p(bytes / 4)));
  const auto tp_route = megaplan::sim::pipeline_group_routes(local.plan, topology)[1].tensor;
  const double gather =
      profile.collective_seconds(megaplan::CollectiveOp::kAllGather, 4, bytes, megaplan::sim::LinkKind::kNvlink,
                                 {tp_route.bandwidth_bytes_per_s, tp_route.latency_s}, sources);
  CHECK(scattered.stages[1].forward == Approx(sent_whole.stages[1].forward + gather));
  CHECK(scattered.stages[0].backward > sent_whole.stages[0].backward);
}

TEST_CASE("tied embeddings on two pipeline ranks all-reduce their gradient before the step", "[simulator][costs]") {
  const megaplan::JobSpec tied = job("gpt-1.3b", "dgx-h100", 2, 1, 2, 8);
  megaplan::JobSpec untied = tied;
  untied.model.untie_embeddings_and_output_weights = true;
  const auto profile = megaplan::sim::Profile::datasheet(tied.cluster.gpu);
  const megaplan::sim::Topology topology(tied.cluster);
  CostSources sources;
  const auto with_tie = megaplan::sim::plan_action_costs(tied.model, tied.plan, profile, topology, sources);
  // The untied model holds one more vocabulary x hidden matrix on the last rank: compare the step's
  // kernels rank by rank rather than the whole OPTIM.
  const auto kernels_of = [&](const megaplan::JobSpec& spec, std::size_t rank) {
    const auto ranks = megaplan::parameters_per_pipeline_rank(spec.model, spec.plan);
    double seconds = 0;
    for (const megaplan::Kernel& kernel : megaplan::optimizer_step_kernels(spec.plan, ranks[rank].parameters_per_gpu)) {
      seconds += profile.kernel_seconds(kernel, sources);
    }
    return seconds;
  };
  const megaplan::sim::Route route = topology.route(0, 1);
  const int64_t bytes = 4 * megaplan::padded_vocab_size(tied.model, 1) * 2048;
  const double all_reduce =
      profile.collective_seconds(megaplan::CollectiveOp::kAllReduce, 2, bytes, megaplan::sim::LinkKind::kNvlink,
                                 {route.bandwidth_bytes_per_s, route.latency_s}, sources);
  CHECK(with_tie.optimizer[0] == Approx(kernels_of(tied, 0) + all_reduce));
  CHECK(with_tie.optimizer[1] == Approx(kernels_of(tied, 1) + all_reduce));
  const auto without = megaplan::sim::plan_action_costs(untied.model, untied.plan, profile, topology, sources);
  CHECK(without.optimizer[0] == Approx(kernels_of(untied, 0)));
}

TEST_CASE("gradient buckets fill as the backward goes; the word embedding's, of its own, at its end",
          "[simulator][costs]") {
  // gpt-1.3b on two GPUs of one node, dp 2: 40M-parameter buckets of the layers (the first fills
  // first), then the embedding's (core's stage_layout gives it a bucket of its own).
  const megaplan::JobSpec spec = job("gpt-1.3b", "dgx-h100", 2, 1, 1, 8);
  const auto profile = megaplan::sim::Profile::datasheet(spec.cluster.gpu);
  const megaplan::sim::Topology topology(spec.cluster);
  CostSources sources;
  const auto costs = megaplan::sim::plan_action_costs(spec.model, spec.plan, profile, topology, sources);
  const auto& buckets = costs.stages[0].gradient_buckets;
  const megaplan::StageParameters held = megaplan::stage_parameters(spec.model, spec.plan, 0);
  REQUIRE(held.word_embedding_per_gpu == megaplan::padded_vocab_size(spec.model, 1) * spec.model.hidden_size);
  const int64_t filling = held.parameters_per_gpu - held.word_embedding_per_gpu;
  const int64_t bucket = megaplan::gradient_bucket_parameters(spec.plan);
  REQUIRE(buckets.size() == static_cast<std::size_t>((filling + bucket - 1) / bucket + 1));
  for (std::size_t k = 0; k + 2 < buckets.size(); ++k) {
    CHECK(buckets[k].ready == Approx(static_cast<double>((k + 1) * bucket) / static_cast<double>(filling)));
    CHECK(buckets[k].seconds == Approx(buckets[0].seconds));
  }
  CHECK(buckets[buckets.size() - 2].ready == 1);  // the last of the layers' (with the position embedding)
  CHECK(buckets.back().ready == 1);               // the word embedding's
  const auto route = megaplan::sim::pipeline_group_routes(spec.plan, topology)[0].data;
  const double embedding = profile.collective_seconds(megaplan::CollectiveOp::kAllReduce, 2,
                                                      4 * held.word_embedding_per_gpu, megaplan::sim::LinkKind::kNvlink,
                                                      {route.bandwidth_bytes_per_s, route.latency_s}, sources);
  CHECK(buckets.back().seconds == Approx(embedding));
}

TEST_CASE("an MoE plan adds its expert-parallel exchanges per MoE layer and reduces the experts over expert dp",
          "[simulator][costs][moe]") {
  // Mixtral-8x7B (every layer MoE) at 4096 tokens on 16 H100s, pp 2: ep 1, then ep 8 (expert dp 1).
  megaplan::JobSpec spec = job("mixtral-8x7b", "dgx-h100", 16, 1, 2, 32);
  spec.model.seq_length = 4096;
  const auto profile = megaplan::sim::Profile::datasheet(spec.cluster.gpu);
  const megaplan::sim::Topology topology(spec.cluster);
  CostSources sources;
  const auto local = megaplan::sim::plan_action_costs(spec.model, spec.plan, profile, topology, sources);
  CHECK(local.stages[0].forward_collectives == 0);
  spec.plan.expert_model_parallel_size = 8;
  megaplan::validate_job(spec);
  const megaplan::PlanKernels kernels(spec.model, spec.plan);
  const auto expert = megaplan::sim::plan_action_costs(spec.model, spec.plan, profile, topology, sources);
  // 16 MoE layers a stage, each forward an all-gather of the counts and two all-to-alls of its rows.
  const int64_t rows = 4096 * 2;
  const megaplan::MoeCollective all_to_all_of_rows{megaplan::MoeGroup::kExpert, megaplan::CollectiveOp::kAllToAll,
                                                   rows * 4096 * 2};
  CHECK(kernels.moe().backward_collectives ==
        std::vector<megaplan::MoeCollective>{all_to_all_of_rows, all_to_all_of_rows});
  const megaplan::sim::Route route = megaplan::sim::pipeline_group_routes(spec.plan, topology)[0].expert;
  const auto link = megaplan::sim::LinkParams{route.bandwidth_bytes_per_s, route.latency_s};
  const double all_to_all = profile.collective_seconds(megaplan::CollectiveOp::kAllToAll, 8, all_to_all_of_rows.bytes,
                                                       megaplan::sim::LinkKind::kNvlink, link, sources);
  CHECK(expert.stages[0].backward_collectives == Approx(16 * 2 * all_to_all));
  CHECK(expert.stages[0].forward_collectives > 16 * 2 * all_to_all);
  // Each rank's one expert of each layer has no replica: only the others' gradients reduce (dp 8),
  // fewer bytes than at ep 1, where every expert's gradient is summed over 8 replicas.
  double reduced_local = 0, reduced_expert = 0;
  for (const auto& bucket : local.stages[0].gradient_buckets) reduced_local += bucket.seconds;
  for (const auto& bucket : expert.stages[0].gradient_buckets) reduced_expert += bucket.seconds;
  CHECK(reduced_expert < reduced_local / 4);
  // An expert twice as busy as the mean makes the busiest rank's experts compute twice the rows.
  spec.plan.moe_imbalance = 2;
  const auto skewed = megaplan::sim::plan_action_costs(spec.model, spec.plan, profile, topology, sources);
  CHECK(skewed.stages[0].forward > expert.stages[0].forward * 1.2);
  // Its exchanges carry twice the bytes (the link's latency once).
  CHECK(skewed.stages[0].backward_collectives > 1.9 * expert.stages[0].backward_collectives);
  CHECK(skewed.stages[0].backward_collectives < 2 * expert.stages[0].backward_collectives);
  // Full recomputation runs the 16 layers' forwards again in B, their exchanges too; the forward
  // again lists no router losses for the log (here the z loss).
  spec.model.moe.z_loss_coeff = 1e-3;
  spec.plan.moe_imbalance = 1;
  spec.plan.recompute_granularity = megaplan::RecomputeGranularity::kFull;
  spec.plan.recompute_num_layers = 4;
  const auto full = megaplan::sim::plan_action_costs(spec.model, spec.plan, profile, topology, sources);
  CHECK(full.stages[0].forward_collectives == Approx(expert.stages[0].forward_collectives));
  CHECK(full.stages[0].backward_collectives ==
        Approx(expert.stages[0].backward_collectives + expert.stages[0].forward_collectives));
  CHECK(full.stages[0].backward > expert.stages[0].backward + 0.9 * expert.stages[0].forward);
  const megaplan::MoeKernels recomputed = megaplan::PlanKernels(spec.model, spec.plan).moe();
  CHECK(recomputed.forward_again.size() + 1 == recomputed.forward.size());
  CHECK(std::equal(recomputed.forward_again.begin(), recomputed.forward_again.end(), recomputed.forward.begin()));
}

TEST_CASE("the expert bias's update adds its counts' all-reduces over tp and dp and one kernel a layer to OPTIM",
          "[simulator][costs][moe]") {
  // Mixtral-8x7B with a sigmoid router balanced by its expert bias, tp 2 x pp 2 on 16 H100s: each
  // pipeline rank's 16 MoE layers' counts (8 experts each, fp32) all-reduced over its tp pair and
  // its 4 dp replicas, then 16 updates.
  megaplan::JobSpec spec = job("mixtral-8x7b", "dgx-h100", 16, 2, 2, 32);
  spec.plan.sequence_parallel = true;
  const auto profile = megaplan::sim::Profile::datasheet(spec.cluster.gpu);
  const megaplan::sim::Topology topology(spec.cluster);
  CostSources sources;
  const auto plain = megaplan::sim::plan_action_costs(spec.model, spec.plan, profile, topology, sources);
  spec.model.moe.score_function = megaplan::RouterScoreFunction::kSigmoid;
  spec.model.moe.router_enable_expert_bias = true;
  megaplan::validate_job(spec);
  const auto balanced = megaplan::sim::plan_action_costs(spec.model, spec.plan, profile, topology, sources);
  const auto routes = megaplan::sim::pipeline_group_routes(spec.plan, topology);
  const int64_t bytes = 4 * 16 * 8;
  for (std::size_t rank = 0; rank < 2; ++rank) {
    INFO("pipeline rank " << rank);
    const auto cost = [&](const megaplan::sim::Route& route, int64_t members) {
      return profile.collective_seconds(megaplan::CollectiveOp::kAllReduce, members, bytes,
                                        megaplan::sim::LinkKind::kNvlink,
                                        {route.bandwidth_bytes_per_s, route.latency_s}, sources);
    };
    double update = cost(routes[rank].tensor, 2) + cost(routes[rank].data, 4);
    for (const megaplan::Kernel& kernel : megaplan::expert_bias_kernels(spec.model, 16))
      update += profile.kernel_seconds(kernel, sources);
    CHECK(megaplan::expert_bias_kernels(spec.model, 16).size() == 16);
    CHECK(balanced.optimizer[rank] == Approx(plain.optimizer[rank] + update));
  }
}

TEST_CASE("an MoE layer under tensor parallelism costs its attention's collectives and its MLP's list",
          "[simulator][costs][moe]") {
  // Mixtral-8x7B at tp 2 with sequence parallelism, ep 8, on 16 H100s (every layer MoE): a layer's
  // tp collectives are its attention's gather and scatter, then what core's MoE list names over the
  // tp and ep groups; a dense layer's would be two of each.
  MixtralCosting c(16, 2, 8, 0);
  const megaplan::sim::GroupRoutes& routes = c.routes;
  const int64_t stream_bytes = 4096 * 4096 * 2;
  const double attention = c.cost(routes.tensor, 2, megaplan::CollectiveOp::kAllGather, stream_bytes) +
                           c.cost(routes.tensor, 2, megaplan::CollectiveOp::kReduceScatter, stream_bytes);
  const auto listed = [&](const std::vector<megaplan::MoeCollective>& list) {
    double seconds = 0;
    for (const megaplan::MoeCollective& m : list) {
      seconds += m.group == megaplan::MoeGroup::kExpert ? c.cost(routes.expert, 8, m.op, m.bytes)
                                                        : c.cost(routes.tensor, 2, m.op, m.bytes);
    }
    return seconds;
  };
  REQUIRE(c.kernels.moe().forward_collectives.size() == 6);  // counts over ep and tp; rows out, gathered, summed, back
  const auto costs = megaplan::sim::plan_action_costs(c.spec.model, c.spec.plan, c.profile, c.topology, c.sources);
  // The one stage's backward: 32 such layers and the output layer's input gradient, reduce-scattered.
  const double head = c.cost(routes.tensor, 2, megaplan::CollectiveOp::kReduceScatter, stream_bytes);
  CHECK(costs.stages[0].backward_collectives ==
        Approx(32 * (attention + listed(c.kernels.moe().backward_collectives)) + head));
  const megaplan::sim::LayerCosts layer =
      megaplan::sim::transformer_layer_costs(c.spec.model, c.spec.plan, c.profile, routes, c.sources, true);
  CHECK(layer.forward_collectives == Approx(attention + listed(c.kernels.moe().forward_collectives)));
}

TEST_CASE("an MoE layer's experts cut over an etp group other than tp cost their rows over it",
          "[simulator][costs][moe]") {
  // Mixtral-8x7B at tp 8 with sequence parallelism, etp 4 and ep 2 on 16 H100s: the attention and
  // the losses' counts over the tp group of 8, the experts' rows gathered and reduce-scattered over
  // the etp group of 4 (the expert layers' generator: four neighbouring GPUs), the all-to-alls over
  // the ep pair.
  MixtralCosting c(16, 8, 2, 4);
  const megaplan::sim::GroupRoutes& routes = c.routes;
  const megaplan::sim::Route four = c.topology.ring_route({0, 1, 2, 3});
  CHECK(routes.expert_tensor.bandwidth_bytes_per_s == four.bandwidth_bytes_per_s);
  CHECK(routes.expert_tensor.latency_s == four.latency_s);
  int64_t over_etp = 0;
  const auto listed = [&](const std::vector<megaplan::MoeCollective>& list) {
    double seconds = 0;
    for (const megaplan::MoeCollective& m : list) {
      switch (m.group) {
        case megaplan::MoeGroup::kExpert: seconds += c.cost(routes.expert, 2, m.op, m.bytes); break;
        case megaplan::MoeGroup::kExpertTensor:
          seconds += c.cost(routes.expert_tensor, 4, m.op, m.bytes);
          ++over_etp;
          break;
        default: seconds += c.cost(routes.tensor, 8, m.op, m.bytes);
      }
    }
    return seconds;
  };
  const int64_t stream_bytes = 4096 * 4096 * 2;
  const double attention = c.cost(routes.tensor, 8, megaplan::CollectiveOp::kAllGather, stream_bytes) +
                           c.cost(routes.tensor, 8, megaplan::CollectiveOp::kReduceScatter, stream_bytes);
  const megaplan::sim::LayerCosts layer =
      megaplan::sim::transformer_layer_costs(c.spec.model, c.spec.plan, c.profile, routes, c.sources, true);
  CHECK(layer.forward_collectives == Approx(attention + listed(c.kernels.moe().forward_collectives)));
  CHECK(over_etp == 3);  // the counts gathered, the rows gathered and their outputs reduce-scattered
}

TEST_CASE("an MoE layer under context parallelism all-reduces its counts over the cp group",
          "[simulator][costs][moe]") {
  // Mixtral-8x7B with the switch loss at cp 2 on 8 H100s: each rank routes its own tokens, the
  // switch loss's counts are summed over the cp group and, for the log, the rows per expert too
  // (not in full recomputation's forward again).
  megaplan::JobSpec spec = job("mixtral-8x7b", "dgx-h100", 8, 1, 1, 8);
  spec.model.seq_length = 4096;
  spec.model.moe.aux_loss_coeff = 0.01;
  spec.plan.context_parallel_size = 2;
  spec.plan.data_parallel_size = 4;
  megaplan::validate_job(spec);
  const megaplan::MoeKernels moe = megaplan::PlanKernels(spec.model, spec.plan).moe();
  const megaplan::MoeCollective counts{megaplan::MoeGroup::kContext, megaplan::CollectiveOp::kAllReduce, 8 * 4};
  CHECK(moe.forward_collectives == std::vector<megaplan::MoeCollective>{counts, counts});
  CHECK(moe.forward_again_collectives == std::vector<megaplan::MoeCollective>{counts});
  CHECK(moe.backward_collectives.empty());
  const auto profile = megaplan::sim::Profile::datasheet(spec.cluster.gpu);
  const megaplan::sim::Topology topology(spec.cluster);
  CostSources sources;
  const megaplan::sim::GroupRoutes routes = megaplan::sim::pipeline_group_routes(spec.plan, topology)[0];
  const double all_reduce =
      profile.collective_seconds(megaplan::CollectiveOp::kAllReduce, 2, counts.bytes, megaplan::sim::LinkKind::kNvlink,
                                 {routes.context.bandwidth_bytes_per_s, routes.context.latency_s}, sources);
  CHECK(all_reduce > 0);
  const megaplan::sim::LayerCosts layer =
      megaplan::sim::transformer_layer_costs(spec.model, spec.plan, profile, routes, sources, true);
  // Without the switch loss one all-reduce a forward is left (the log's rows); the ring's the same.
  spec.model.moe.aux_loss_coeff = 0;
  const megaplan::sim::LayerCosts without =
      megaplan::sim::transformer_layer_costs(spec.model, spec.plan, profile, routes, sources, true);
  CHECK(layer.forward_collectives == Approx(without.forward_collectives + all_reduce));
  CHECK(megaplan::PlanKernels(spec.model, spec.plan).moe().forward_collectives ==
        std::vector<megaplan::MoeCollective>{counts});
}

TEST_CASE("a split backward costs an MoE layer's I and W from their lists; W gathers its inputs again under SP",
          "[simulator][costs][moe]") {
  // Mixtral-8x7B at tp 2 with sequence parallelism, ep 8, pp 2 under ZB-H1 on 16 H100s. I lists no
  // weight GEMM (each output gradient copied and kept instead, the experts' once over their rows),
  // W every one I deferred: the rank's one expert's fc2 and fc1, the router's, and the attention's.
  megaplan::JobSpec spec = job("mixtral-8x7b", "dgx-h100", 16, 2, 2, 64);
  spec.model.seq_length = 4096;
  spec.plan.sequence_parallel = true;
  spec.plan.expert_model_parallel_size = 4;
  spec.plan.schedule = megaplan::ScheduleKind::kZeroBubbleH1;
  megaplan::validate_job(spec);
  const auto profile = megaplan::sim::Profile::datasheet(spec.cluster.gpu);
  const megaplan::sim::Topology topology(spec.cluster);
  CostSources sources;
  const megaplan::PlanKernels kernels(spec.model, spec.plan);
  const auto weight_gemms = [](const std::vector<megaplan::Kernel>& list) {
    return std::count_if(list.begin(), list.end(), [](const megaplan::Kernel& kernel) {
      return kernel.kind == megaplan::KernelKind::kGemm && kernel.layout == megaplan::GemmLayout::kWeightGradient;
    });
  };
  const megaplan::MoeKernels& moe = kernels.moe();
  CHECK(weight_gemms(moe.backward_input) == 0);
  CHECK(weight_gemms(moe.weight) == weight_gemms(moe.backward));
  CHECK(weight_gemms(moe.weight) == 2 * 2 + 1);  // two experts a rank (8 over ep 4), their fc2 and fc1; the router
  CHECK(moe.weight_collectives.empty());         // no shared expert to gather for
  const auto seconds = [&](megaplan::KernelBlock block) {
    double total = 0;
    for (const megaplan::Kernel& kernel : kernels.block(block)) total += profile.kernel_seconds(kernel, sources);
    return total;
  };
  const megaplan::sim::GroupRoutes routes = megaplan::sim::pipeline_group_routes(spec.plan, topology)[0];
  const int64_t stream_bytes = 4096 * 4096 * 2;
  const double gather =
      profile.collective_seconds(megaplan::CollectiveOp::kAllGather, 2, stream_bytes, megaplan::sim::LinkKind::kNvlink,
                                 {routes.tensor.bandwidth_bytes_per_s, routes.tensor.latency_s}, sources);
  const megaplan::sim::LayerCosts layer =
      megaplan::sim::transformer_layer_costs(spec.model, spec.plan, profile, routes, sources, true);
  // W gathers QKV's input again (the attention's); the MoE MLP's inputs are the rank's rows.
  CHECK(layer.backward_weight == Approx(seconds(megaplan::KernelBlock::kMoeLayerWeightGradient) + gather));
  CHECK(layer.backward_input ==
        Approx(seconds(megaplan::KernelBlock::kMoeLayerBackwardInput) + layer.backward_collectives));
  CHECK(layer.backward_input < layer.backward);
  CHECK(layer.backward_input + layer.backward_weight > layer.backward);
  // The first stage: 16 layers' W, with their gathers among its collectives, and the embedding's.
  const auto costs = megaplan::sim::plan_action_costs(spec.model, spec.plan, profile, topology, sources);
  CHECK(costs.stages[0].weight_collectives == Approx(16 * gather));
  CHECK(costs.stages[0].backward_weight ==
        Approx(16 * layer.backward_weight + seconds(megaplan::KernelBlock::kEmbeddingBackward)));
  // A dense layer's W gathers twice: QKV's input and fc1's.
  megaplan::JobSpec dense = job("llama3-8b", "dgx-h100", 16, 2, 2, 64);
  dense.plan.sequence_parallel = true;
  dense.plan.schedule = megaplan::ScheduleKind::kZeroBubbleH1;
  megaplan::validate_job(dense);
  const megaplan::sim::GroupRoutes dense_routes = megaplan::sim::pipeline_group_routes(dense.plan, topology)[0];
  const int64_t dense_bytes = dense.model.seq_length * dense.model.hidden_size * 2;
  const double dense_gather =
      profile.collective_seconds(megaplan::CollectiveOp::kAllGather, 2, dense_bytes, megaplan::sim::LinkKind::kNvlink,
                                 {dense_routes.tensor.bandwidth_bytes_per_s, dense_routes.tensor.latency_s}, sources);
  const auto dense_costs = megaplan::sim::plan_action_costs(dense.model, dense.plan, profile, topology, sources);
  CHECK(dense_costs.stages[0].weight_collectives == Approx(16 * 2 * dense_gather));
}

TEST_CASE("whole experts under tp (etp 1): full-width expert GEMMs, no rows gathered over tp",
          "[simulator][costs][moe]") {
  // Mixtral-8x7B at tp 2 with sequence parallelism on 16 H100s, ep 8 and etp 1: the ep group spans
  // tp ranks, each rank's one expert is whole and computes only the rows sent to it; the attention
  // keeps its tp collectives, the MoE MLP has no tp gather or scatter of rows (the experts cut over
  // tp have two of each, both ways).
  megaplan::JobSpec spec = job("mixtral-8x7b", "dgx-h100", 16, 2, 1, 64);
  spec.model.seq_length = 4096;
  spec.plan.sequence_parallel = true;
  spec.plan.expert_model_parallel_size = 8;
  spec.plan.expert_tensor_parallel_size = 1;
  megaplan::validate_job(spec);
  const megaplan::PlanKernels whole(spec.model, spec.plan);
  const auto tensor_calls = [](const std::vector<megaplan::MoeCollective>& list) {
    return std::count_if(list.begin(), list.end(),
                         [](const megaplan::MoeCollective& c) { return c.group == megaplan::MoeGroup::kTensor; });
  };
  CHECK(tensor_calls(whole.moe().forward_collectives) == 0);
  CHECK(tensor_calls(whole.moe().backward_collectives) == 0);
  CHECK(whole.moe().forward_collectives.size() == 3);  // the counts over ep; the rows out and back
  const auto widest_expert_gemm = [](const std::vector<megaplan::Kernel>& list) {
    int64_t widest = 0;
    for (const megaplan::Kernel& kernel : list) {
      if (kernel.kind == megaplan::KernelKind::kGemm && kernel.layout == megaplan::GemmLayout::kForward)
        widest = std::max(widest, kernel.n);
    }
    return widest;
  };
  CHECK(widest_expert_gemm(whole.moe().forward) == 2 * 14336);
  megaplan::JobSpec cut = spec;
  cut.plan.expert_tensor_parallel_size = 0;  // tp's
  const megaplan::PlanKernels halves(cut.model, cut.plan);
  CHECK(widest_expert_gemm(halves.moe().forward) == 14336);
  CHECK(tensor_calls(halves.moe().forward_collectives) == 3);  // counts, rows gathered, outputs scattered
  // Each rank's expert is whole: twice the expert parameters a GPU, reduced over expert dp 2
  // (16 ranks of one stage over etp 1 x ep 8).
  CostSources sources;
  const auto whole_costs =
      megaplan::sim::plan_action_costs(spec.model, spec.plan, megaplan::sim::Profile::datasheet(spec.cluster.gpu),
                                       megaplan::sim::Topology(spec.cluster), sources);
  CHECK(spec.plan.expert_data_parallel_size() == 2);
  CHECK(megaplan::stage_parameters(spec.model, spec.plan, 0).expert_per_gpu ==
        2 * megaplan::stage_parameters(cut.model, cut.plan, 0).expert_per_gpu);
  CHECK(whole_costs.stages[0].forward > 0);
}
