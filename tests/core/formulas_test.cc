// Parameter and FLOP formulas against hand-computed values.
#include <catch2/catch.hpp>

#include "core/formulas.h"
#include "core/model_presets.h"

using megaplan::RecomputeGranularity;

TEST_CASE("a GPT layer has 12h^2 + 13h parameters, split as tensor parallelism splits them", "[formulas]") {
  const megaplan::ModelSpec gpt3 = megaplan::model_preset("gpt3-175b");
  const megaplan::LayerParameters layer = megaplan::transformer_layer_parameters(gpt3);
  const int64_t h = 12288;
  CHECK(layer.total() == 12 * h * h + 13 * h);
  CHECK(layer.attention == 4 * h * h + 4 * h);
  CHECK(layer.mlp == 8 * h * h + 5 * h);
  CHECK(layer.norms == 4 * h);
  // Sharded: all weights, QKV bias (3h), fc1 bias (4h). Replicated: two row-parallel biases, norms.
  CHECK(layer.sharded == 12 * h * h + 7 * h);
  CHECK(layer.replicated == 6 * h);
  CHECK(layer.per_gpu(8) == 226'576'896);
}

TEST_CASE("a Llama layer: GQA, SwiGLU, RMSNorm, no biases", "[formulas]") {
  const megaplan::LayerParameters layer = megaplan::transformer_layer_parameters(megaplan::model_preset("llama3-8b"));
  // q and o: 4096^2 each; k and v: 4096 x 1024 each; SwiGLU: 3 x 4096 x 14336; two RMSNorms.
  CHECK(layer.attention == 2 * 4096 * 4096 + 2 * 4096 * 1024);
  CHECK(layer.mlp == 3 * 4096 * 14336);
  CHECK(layer.norms == 2 * 4096);
  CHECK(layer.total() == 218'112'000);
}

TEST_CASE("parameters per pipeline rank: embeddings first, output layer last", "[formulas]") {
  const megaplan::ModelSpec gpt3 = megaplan::model_preset("gpt3-175b");
  megaplan::ParallelPlan plan;
  plan.tensor_parallel_size = 8;
  plan.pipeline_parallel_size = 16;
  const auto ranks = megaplan::parameters_per_pipeline_rank(gpt3, plan);
  REQUIRE(ranks.size() == 16);
  // Rank 0: 6 layers + word embeddings (51200 x 12288, padded for tp 8) + positions (2048 x 12288).
  CHECK(ranks[0].num_layers == 6);
  CHECK(ranks[0].has_embedding);
  CHECK_FALSE(ranks[0].has_output_layer);
  CHECK(ranks[0].parameters == 11'526'905'856);
  CHECK(ranks[0].parameters_per_gpu == 1'463'270'400);
  // Last rank: 6 layers + final LayerNorm + its tied copy of the word embeddings.
  CHECK(ranks[15].has_output_layer);
  CHECK(ranks[15].parameters == 11'501'764'608);
  CHECK(ranks[15].parameters_per_gpu == 1'438'129'152);
  CHECK(ranks[7].parameters == int64_t{6} * 1'812'099'072);
}

TEST_CASE("one rank holds the whole model; the V puts both ends on rank 0", "[formulas]") {
  const megaplan::ModelSpec llama = megaplan::model_preset("llama3-8b");
  megaplan::ParallelPlan single;
  const auto whole = megaplan::parameters_per_pipeline_rank(llama, single);
  REQUIRE(whole.size() == 1);
  CHECK(whole[0].parameters == megaplan::total_parameters(llama));
  CHECK(whole[0].parameters_per_gpu == megaplan::total_parameters(llama));

  const megaplan::ModelSpec gpt2 = megaplan::model_preset("gpt2-124m");
  megaplan::ParallelPlan v;
  v.pipeline_parallel_size = 2;
  v.virtual_pipeline_parallel_size = 2;
  v.schedule = megaplan::ScheduleKind::kZeroBubbleV;
  const auto ranks = megaplan::parameters_per_pipeline_rank(gpt2, v);
  CHECK(ranks[0].has_embedding);
  CHECK(ranks[0].has_output_layer);
  CHECK_FALSE(ranks[1].has_embedding);
  CHECK_FALSE(ranks[1].has_output_layer);
  // Tied embeddings on the same rank need no copy: the ranks sum to the model.
  CHECK(ranks[0].parameters + ranks[1].parameters == megaplan::total_parameters(gpt2));
}

TEST_CASE("the per-GPU parameter cache tells uneven pipeline splits apart", "[formulas]") {
  // llama3.1-405b's 126 layers over pp 8: the split decides how many layers the end ranks hold.
  const megaplan::ModelSpec llama = megaplan::model_preset("llama3.1-405b");
  const megaplan::ParametersPerGpuCache cache(llama);
  megaplan::ParallelPlan plan;
  plan.tensor_parallel_size = 8;
  plan.pipeline_parallel_size = 8;
  plan.pipeline_split.first_stage_layers = 18;  // the middle ranks 15 each
  plan.pipeline_split.last_stage_layers = 18;
  megaplan::ParallelPlan other = plan;
  other.pipeline_split = {.account_for_embedding = true, .account_for_loss = true};
  for (const megaplan::ParallelPlan& layout : {plan, other, plan}) {
    std::vector<int64_t> expected;
    for (const auto& rank : megaplan::parameters_per_pipeline_rank(llama, layout))
      expected.push_back(rank.parameters_per_gpu);
    CHECK(cache.per_pipeline_rank(layout) == expected);
  }
  CHECK(cache.per_pipeline_rank(plan) != cache.per_pipeline_rank(other));
}

TEST_CASE("experts: every expert's MLP and the router counted, ep splitting the experts", "[formulas]") {
  megaplan::ModelSpec model = megaplan::model_preset("llama3-8b");
  const megaplan::LayerParameters dense = megaplan::transformer_layer_parameters(model);
  model.moe.num_experts = 8;
  model.moe.ffn_hidden_size = 1024;
  model.moe.shared_expert_intermediate_size = 2048;
  const megaplan::LayerParameters moe = megaplan::transformer_layer_parameters(model, true);
  CHECK(megaplan::transformer_layer_parameters(model, false).total() == dense.total());
  const int64_t h = 4096;
  const int64_t expert = 3 * h * 1024;  // SwiGLU: gate, up and down, no biases
  CHECK(moe.attention == dense.attention);
  CHECK(moe.mlp == 8 * expert + 3 * h * 2048 + 8 * h);  // experts, shared expert, router
  CHECK(moe.expert_sharded == 8 * expert);
  // On a GPU of tp 2 x ep 4: its tp half of 2 experts, half the shared expert, the whole router.
  CHECK(moe.per_gpu(2, 4) == dense.attention / 2 + 2 * expert / 2 + 3 * h * 2048 / 2 + 8 * h + moe.norms);
  CHECK(moe.per_gpu(2, 1) == moe.per_gpu(2) + 0);
  CHECK(moe.per_gpu(2, 1) - moe.per_gpu(2, 4) == 6 * expert / 2);
  // Active: every layer's 6 experts outside the default top 2 left out.
  CHECK(megaplan::active_parameters(model) == megaplan::total_parameters(model) - 32 * 6 * expert);
  // A token's MLP FLOPs: its top 2 experts and the shared expert, 2 x 1024 + 2048 = the dense 4096.
  megaplan::ModelSpec same_width = megaplan::model_preset("llama3-8b");
  same_width.ffn_hidden_size = 4096;
  CHECK(megaplan::model_flops(model, 1, 128256) == Approx(megaplan::model_flops(same_width, 1, 128256)));
  // Parameters per pipeline rank and GPU follow ep.
  megaplan::ParallelPlan plan;
  plan.data_parallel_size = 8;
  plan.expert_model_parallel_size = 8;
  plan.global_batch_size = 8;
  const std::vector<megaplan::PipelineRankParameters> ranks = megaplan::parameters_per_pipeline_rank(model, plan);
  CHECK(ranks[0].parameters_per_gpu == megaplan::total_parameters(model) - 32 * 7 * expert);
  CHECK(megaplan::ParametersPerGpuCache(model).per_pipeline_rank(plan)[0] == ranks[0].parameters_per_gpu);
}

TEST_CASE("experts: --moe-layer-freq and a pattern choose the layers, a gate adds 1 x h", "[formulas]") {
  megaplan::ModelSpec model = megaplan::model_preset("llama3-8b");  // 32 layers
  model.moe.num_experts = 8;
  model.moe.ffn_hidden_size = 1024;
  const int64_t dense = megaplan::transformer_layer_parameters(model, false).total();
  const int64_t moe = megaplan::transformer_layer_parameters(model, true).total();
  const int64_t outside = megaplan::total_parameters(model) - 32 * moe;  // embeddings, final norm, output
  model.moe.layer_freq = 4;                                              // layers 0, 4, ..., 28
  CHECK(model.moe.moe_layers(0, 32) == 8);
  CHECK(megaplan::total_parameters(model) == outside + 8 * moe + 24 * dense);
  const int64_t expert = 3 * 4096 * 1024;
  CHECK(megaplan::active_parameters(model) == megaplan::total_parameters(model) - 8 * 6 * expert);
  // Megatron's FLOPs: dense layers at the MLP's width, MoE layers at top k experts' (2 x 1024).
  megaplan::ModelSpec mean_width = megaplan::model_preset("llama3-8b");
  mean_width.ffn_hidden_size = (24 * 14336 + 8 * 2048) / 32;
  CHECK(megaplan::model_flops(model, 1, 128256) == Approx(megaplan::model_flops(mean_width, 1, 128256)));
  // A pattern: the first layer dense, the rest with experts; pp 2 holds 15 and 16 MoE layers.
  model.moe.layer_pattern.assign(32, 1);
  model.moe.layer_pattern[0] = 0;
  megaplan::ParallelPlan plan;
  plan.pipeline_parallel_size = 2;
  plan.global_batch_size = 1;
  const auto ranks = megaplan::parameters_per_pipeline_rank(model, plan);
  CHECK(ranks[0].parameters + ranks[1].parameters == megaplan::total_parameters(model));
  CHECK(ranks[1].parameters - megaplan::stage_parameters(model, plan, 1).parameters == 0);
  CHECK(ranks[0].parameters == megaplan::stage_parameters(model, plan, 0).parameters);
  CHECK(megaplan::total_parameters(model) == outside + 31 * moe + dense);
  // The shared expert's gate: one row of h per MoE layer, on every tp rank.
  model.moe.shared_expert_intermediate_size = 512;
  const megaplan::LayerParameters ungated = megaplan::transformer_layer_parameters(model, true);
  model.moe.shared_expert_gate = true;
  const megaplan::LayerParameters gated = megaplan::transformer_layer_parameters(model, true);
  CHECK(gated.total() - ungated.total() == 4096);
  CHECK(gated.per_gpu(4) - ungated.per_gpu(4) == 4096);
}

TEST_CASE("model FLOPs follow Megatron's formula", "[formulas]") {
  const megaplan::ModelSpec gpt3 = megaplan::model_preset("gpt3-175b");
  // 72 B s l h^2 (1 + s/6h + V/12lh) with B 1536, s 2048, l 96, h 12288, V 51200.
  const double expected =
      72.0 * 1536 * 2048 * 96 * 12288.0 * 12288 * (1 + 2048.0 / (6 * 12288) + 51200.0 / (12 * 96 * 12288.0));
  CHECK(megaplan::model_flops(gpt3, 1536, 51200) == Approx(expected).epsilon(1e-12));
  CHECK(expected == Approx(3.3861967463873244e18));
  // Llama 3 8B, one sequence of 8192: 12 B s l h^2 ((1 + 8/32 + s/h) + 3.5 * 1.5 + V/2lh).
  const megaplan::ModelSpec llama = megaplan::model_preset("llama3-8b");
  CHECK(megaplan::model_flops(llama, 1, 128256) == Approx(474422087516160.0).epsilon(1e-12));
}

TEST_CASE("hardware FLOPs add what recomputation repeats", "[formulas]") {
  const megaplan::ModelSpec gpt3 = megaplan::model_preset("gpt3-175b");
  const double model = megaplan::model_flops(gpt3, 1536, 51200);
  CHECK(megaplan::hardware_flops(gpt3, 1536, 51200, RecomputeGranularity::kNone) == model);
  // Selective: forward QK^T and AV again, 4 B s^2 l h.
  CHECK(megaplan::hardware_flops(gpt3, 1536, 51200, RecomputeGranularity::kSelective) ==
        Approx(model + 4.0 * 1536 * 2048.0 * 2048 * 96 * 12288).epsilon(1e-12));
  // Full: the PTD-P paper's 96 B s l h^2 (1 + s/6h + V/16lh).
  const double ptdp =
      96.0 * 1536 * 2048 * 96 * 12288.0 * 12288 * (1 + 2048.0 / (6 * 12288) + 51200.0 / (16 * 96 * 12288.0));
  CHECK(megaplan::hardware_flops(gpt3, 1536, 51200, RecomputeGranularity::kFull) == Approx(ptdp).epsilon(1e-12));
}
