// The executor's parameter list: per stage and tensor-parallel rank, the sizes add up to core's
// parameter count for GPT and Llama-family layers alike, with Megatron's names and the tied or
// untied output layer where Megatron puts it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "core/formulas.h"
#include "core/parameter_list.h"

namespace {

megaplan::ModelSpec small_gpt() {
  megaplan::ModelSpec model;
  model.name = "test-gpt";
  model.num_layers = 4;
  model.hidden_size = 8;
  model.num_attention_heads = 2;
  model.seq_length = 4;
  model.vocab_size = 16;
  model.make_vocab_size_divisible_by = 8;
  return model;
}

// RMSNorm, SwiGLU, RoPE, 4 heads in 2 query groups, untied, no biases (Llama); Qwen2 adds QKV's bias.
megaplan::ModelSpec small_llama(bool qkv_bias) {
  megaplan::ModelSpec model = small_gpt();
  model.name = "test-llama";
  model.num_attention_heads = 4;
  model.num_query_groups = 2;
  model.normalization = megaplan::Normalization::kRMSNorm;
  model.swiglu = true;
  model.ffn_hidden_size = 24;
  model.position_embedding_type = megaplan::PositionEmbedding::kRope;
  model.untie_embeddings_and_output_weights = true;
  model.add_bias_linear = false;
  model.add_qkv_bias = qkv_bias;
  return model;
}

bool has(const std::vector<megaplan::ParameterSpec>& specs, const std::string& name) {
  return std::any_of(specs.begin(), specs.end(), [&](const auto& spec) { return spec.name == name; });
}

}  // namespace

TEST_CASE("each pipeline stage's parameters add up to core's count, GPT and Llama alike", "[parameters]") {
  for (const megaplan::ModelSpec& model : {small_gpt(), small_llama(false), small_llama(true)}) {
    for (const megaplan::ScheduleKind kind : {megaplan::ScheduleKind::kOneFOneB, megaplan::ScheduleKind::kInterleaved,
                                              megaplan::ScheduleKind::kZeroBubbleV}) {
      megaplan::ParallelPlan plan;
      plan.pipeline_parallel_size = 2;
      plan.virtual_pipeline_parallel_size = kind == megaplan::ScheduleKind::kOneFOneB ? 1 : 2;
      plan.schedule = kind;
      plan.global_batch_size = 4;
      for (const int64_t tp : {1, 2}) {
        plan.tensor_parallel_size = tp;
        for (int64_t stage = 0; stage < plan.num_virtual_stages(); ++stage) {
          for (int64_t rank = 0; rank < tp; ++rank) {
            INFO(model.name << " " << megaplan::to_string(kind) << " stage " << stage << " tp rank " << rank << " of "
                            << tp);
            std::size_t parameters = 0;
            for (const auto& spec : megaplan::describe_parameters(model, plan, stage, rank)) {
              parameters += spec.size;
              CHECK(spec.shard_index == (spec.shard_count > 1 ? rank : 0));
            }
            CHECK(static_cast<int64_t>(parameters) ==
                  megaplan::stage_parameters(model, plan, stage).parameters_per_gpu);
          }
        }
      }
    }
  }
}

TEST_CASE("the output layer is the tied embedding's copy, or its own weight when untied", "[parameters]") {
  const megaplan::ModelSpec gpt = small_gpt();
  megaplan::ParallelPlan v;
  v.pipeline_parallel_size = 2;
  v.virtual_pipeline_parallel_size = 2;
  v.schedule = megaplan::ScheduleKind::kZeroBubbleV;
  v.global_batch_size = 4;
  // A V places the last stage on rank 0 beside stage 0: its output layer reads the embedding itself.
  CHECK(megaplan::describe_parameters(gpt, v, 3).back().name == "decoder.final_layernorm.bias");
  megaplan::ParallelPlan loop = v;
  loop.schedule = megaplan::ScheduleKind::kInterleaved;
  CHECK(megaplan::describe_parameters(gpt, loop, 3).back().name == "output_layer.weight");

  const megaplan::ModelSpec llama = small_llama(false);
  megaplan::ParallelPlan one;
  const auto whole = megaplan::describe_parameters(llama, one, 0);
  CHECK(whole.back().name == "output_layer.weight");
  CHECK(has(whole, "embedding.word_embeddings.weight"));
  CHECK_FALSE(has(whole, "embedding.position_embeddings.weight"));   // RoPE
  CHECK_FALSE(has(whole, "decoder.layers.0.input_layernorm.bias"));  // RMSNorm
  CHECK_FALSE(has(whole, "decoder.layers.0.self_attention.linear_qkv.bias"));
  CHECK(
      has(megaplan::describe_parameters(small_llama(true), one, 0), "decoder.layers.0.self_attention.linear_qkv.bias"));
  CHECK_FALSE(has(megaplan::describe_parameters(small_llama(true), one, 0), "decoder.layers.0.mlp.linear_fc1.bias"));
}

TEST_CASE("a layer with experts: the router, the ep rank's experts by their layer index, the shared expert",
          "[parameters]") {
  for (const bool swiglu : {false, true}) {
    megaplan::ModelSpec model = swiglu ? small_llama(false) : small_gpt();
    model.moe.num_experts = 4;
    model.moe.ffn_hidden_size = 16;
    model.moe.shared_expert_intermediate_size = 8;
    model.moe.shared_expert_gate = true;
    model.moe.layer_pattern = {0, 1, 1, 0};  // a dense layer on each of pp 2's stages
    megaplan::ParallelPlan plan;
    plan.pipeline_parallel_size = 2;
    plan.global_batch_size = 4;
    for (const int64_t tp : {1, 2})
      for (const int64_t etp : {int64_t{0}, int64_t{1}}) {  // the experts cut over tp, or whole
        for (const int64_t ep : {1, 2, 4}) {
          plan.tensor_parallel_size = tp;
          plan.expert_model_parallel_size = ep;
          plan.expert_tensor_parallel_size = etp;
          const int64_t cut = plan.expert_tensor_parallel();
          plan.data_parallel_size = ep;  // ep divides cp x dp
          for (int64_t stage = 0; stage < 2; ++stage) {
            for (int64_t ep_rank = 0; ep_rank < ep; ++ep_rank) {
              INFO(model.name << " tp " << tp << " etp " << cut << " ep " << ep << " rank " << ep_rank << " stage "
                              << stage);
              const auto specs = megaplan::describe_parameters(model, plan, stage, tp - 1, ep_rank);
              std::size_t parameters = 0;
              for (const auto& spec : specs) parameters += spec.size;
              CHECK(static_cast<int64_t>(parameters) ==
                    megaplan::stage_parameters(model, plan, stage).parameters_per_gpu);
              const int64_t layer = stage == 0 ? 1 : 2;  // the stage's MoE layer
              const std::string prefix = "decoder.layers." + std::to_string(layer) + ".";
              CHECK(has(specs, prefix + "mlp.router.weight"));
              CHECK(has(specs, prefix + "mlp.shared_experts.linear_fc1.weight"));
              CHECK(has(specs, prefix + "mlp.shared_experts.gate_weight"));
              CHECK_FALSE(has(specs, prefix + "mlp.linear_fc1.weight"));
              CHECK(has(specs, "decoder.layers." + std::to_string(layer - 1 + 2 * stage) + ".mlp.linear_fc1.weight"));
              // Experts r x 4 / ep onwards, each an MLP split over etp as the dense one over tp.
              for (int64_t e = 0; e < 4; ++e) {
                const bool held = e / (4 / ep) == ep_rank;
                CHECK(has(specs, prefix + "mlp.experts.local_experts." + std::to_string(e) + ".linear_fc2.weight") ==
                      held);
              }
              const auto fc1 = std::find_if(specs.begin(), specs.end(), [&](const auto& spec) {
                return spec.name.ends_with("local_experts." + std::to_string(ep_rank * (4 / ep)) +
                                           ".linear_fc1.weight");
              });
              REQUIRE(fc1 != specs.end());
              CHECK(fc1->global_shape == std::vector<int64_t>{(swiglu ? 2 : 1) * 16, 8});
              CHECK(fc1->shape == std::vector<int64_t>{(swiglu ? 2 : 1) * 16 / cut, 8});
              CHECK(fc1->shard_count == cut);
              CHECK(fc1->shard_index == (cut == 1 ? 0 : tp - 1));
              CHECK(fc1->chunks == (swiglu ? 2 : 1));
              CHECK(fc1->split == megaplan::TensorSplit::kColumn);
              // The shared expert stays the dense layers' tp cut.
              const auto shared = std::find_if(specs.begin(), specs.end(), [&](const auto& spec) {
                return spec.name == prefix + "mlp.shared_experts.linear_fc1.weight";
              });
              REQUIRE(shared != specs.end());
              CHECK(shared->shape == std::vector<int64_t>{(swiglu ? 2 : 1) * 8 / tp, 8});
            }
          }
          // The experts' gradients reduce over their own group (expert dp): buckets of their own.
          const megaplan::ParameterLayout layout = megaplan::stage_layout(model, plan, 0, 0);
          const auto specs = megaplan::describe_parameters(model, plan, 0, 0, 0);
          std::size_t sum = 0;
          for (std::size_t size : layout.sizes) sum += size;
          CHECK(static_cast<int64_t>(sum) == megaplan::stage_parameters(model, plan, 0).parameters_per_gpu);
          std::size_t expert_buckets = 0;
          for (const megaplan::GradientBucket& bucket : layout.buckets) {
            expert_buckets += bucket.expert ? 1 : 0;
            for (std::size_t i = bucket.first_parameter; i <= bucket.last_parameter; ++i) {
              CHECK(specs[i].expert == bucket.expert);
            }
          }
          CHECK(expert_buckets == 1);  // the stage's one MoE layer's experts, side by side
        }
      }
  }
}
